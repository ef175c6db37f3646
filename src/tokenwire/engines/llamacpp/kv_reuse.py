"""The prefix cache at admission: which slot's KV a prompt reuses, copied or cut, and a
sequence that follows another prefilling the same prompt."""

from __future__ import annotations

from .slots import MIN_COPY, common_prefix
from .state import EngineState, Seq


class KvReuse(EngineState):
    """Placing a sequence's prompt in the KV cache (on the worker, under the lock)."""

    def _live(self, seq: Seq, *, but: Seq | None = None) -> dict[int, list[int]]:
        """slot -> the ids in its cells, for every running sequence `seq` may reuse (one with
        its cache salt, except `but`)."""
        salt = seq.params.cache_salt
        return {s.slot: s.kv for s in self._active
                if s is not but and s.kv and s.params.cache_salt == salt and s.gen == self._gen}

    def _place(self, seq: Seq) -> None:
        """Give `seq` a slot and as much of its prompt's KV as some slot already holds; or make
        it follow a running sequence that is prefilling the same prompt."""
        place = self._slots.take(seq.prompt, self._live(seq), seq.params.cache_salt)
        seq.slot = place.slot
        reuse = self._prefix_cache and not seq.scores
        limit = len(seq.prompt) - 1  # the last prompt id is always fed: its logits come next
        own = min(place.own, limit) if reuse else 0
        shared = min(place.shared, limit) if reuse else 0
        leader, lead = None, 0
        for other in self._active if reuse else ():
            if other.leader is None and other.params.cache_salt == seq.params.cache_salt \
                    and other.gen == self._gen:
                n = min(common_prefix(other.prompt, seq.prompt), limit)
                if n > lead and other.n_fed < n:
                    leader, lead = other, n
        self._reuse(seq, seq.slot, own)  # cut what the slot held after the shared prefix
        if leader is not None and lead >= max(shared, own) + MIN_COPY:
            seq.leader, seq.lead = leader, lead
        else:
            self._copy_prefix(seq, place.source, shared)

    def _catch_up(self, seq: Seq) -> None:
        """Copy the leader's prefix once it has fed it (or the best one left, if it is gone)."""
        leader = seq.leader
        assert leader is not None
        if not leader.done and leader.n_fed < seq.lead:
            return
        seq.leader = None
        if not leader.done:
            self._reuse(seq, leader.slot, seq.lead)
            return
        source, shared = self._slots.best_source(seq.prompt, self._live(seq, but=seq),
                                                 seq.params.cache_salt)
        self._copy_prefix(seq, source, min(shared, len(seq.prompt) - 1))

    def _copy_prefix(self, seq: Seq, source: int, shared: int) -> None:
        """Copy the first `shared` prompt ids from slot `source`, when that beats feeding them:
        more than `seq` holds already, and at least MIN_COPY (a copy moves a whole stream)."""
        if source not in (-1, seq.slot) and shared >= max(seq.n_fed + 1, MIN_COPY):
            self._reuse(seq, source, shared)

    def _reuse(self, seq: Seq, source: int, keep: int) -> None:
        """Make `seq`'s slot hold its first `keep` prompt ids and nothing after them, from its
        own cells or from `source`'s (another slot, whose stream is copied)."""
        llama = self.llama
        if source != seq.slot:
            llama.copy(source, seq.slot)
        if not llama.forget_from(seq.slot, keep):  # a memory that cannot cut: start empty
            keep = 0
            llama.forget(seq.slot)
        seq.n_cached += keep - seq.n_fed
        seq.n_fed = keep
        seq.kv = list(seq.prompt[:keep])
