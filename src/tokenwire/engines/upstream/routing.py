"""Which replica serves a prompt: the one holding its prefix in KV cache, by exact token ids.

Two rules, then a guard:
- a prompt that extends a prompt served before (the next turn of a conversation: the last
  prompt, the sampled ids, the new message) goes where that one went. The ids are exact, so
  "extends" is an exact test, which a text-keyed router cannot make (text re-tokenizes);
- any other prompt goes to the replica chosen by rendezvous hashing of its leading `lead` ids
  (all of it, when shorter): the same choice on every gateway (they share no state), stable
  when a replica leaves (only its prompts move), and requests sharing a system prompt longer
  than `lead` land together, where its KV is;
- when that replica is much busier than the least busy one, the least busy takes the request,
  as SGLang's cache-aware router does: affinity must not pile a workload onto one replica.

A request's `cache_salt` and OpenAI's `prompt_cache_key` are part of what its prompt is keyed
by: tenants never share a remembered prefix (their engines' caches do not share one either),
and the key replaces the leading ids as the rendezvous key, so requests naming one key go to
one replica (the load guard aside) and only follow turns remembered under that key.

Remembered prompts are counted by the digest of their last full block of `block` ids, so a new
prompt tries only the lengths that end in one of its own blocks (at most `block` of them), each
an exact lookup of its prefix's digest: the cost does not grow with what is remembered. The
memory is a bounded LRU; losing it (a restart, another gateway) costs only the affinity of
conversations whose earlier turns were shorter than `lead`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence

__all__ = ["PrefixRouter"]

_NO_BLOCK = b""
"""The index of prompts shorter than one block."""


def _scope(salt: str | None, key: str | None) -> bytes:
    """The digests (16 bytes each: two ids' room) of a request's salt and key, if any."""
    return b"".join(_hash(tag + value.encode()) for tag, value in (
        (b"salt\0", salt), (b"key\0", key)) if value is not None)


def _bytes(prompt: Sequence[int], scope: bytes = b"") -> bytes:
    return scope + array("q", prompt).tobytes()


def _hash(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def _block_digests(data: bytes, block: int) -> list[bytes]:
    """One digest per full block, each of the whole prefix through that block."""
    h = hashlib.blake2b(digest_size=16)
    out = []
    step = block * 8
    for end in range(step, len(data) + 1, step):
        h.update(data[end - step:end])
        out.append(h.copy().digest())
    return out


def _rendezvous(key: bytes, n: int) -> list[int]:
    """Replicas in order of preference for `key` (highest random weight first)."""
    scores = [_hash(key + i.to_bytes(2, "little")) for i in range(n)]
    return sorted(range(n), key=lambda i: scores[i], reverse=True)


class PrefixRouter:
    def __init__(self, n_replicas: int, *, block: int = 16, lead: int = 64,
                 memory: int = 1 << 16, imbalance_abs: int = 8, imbalance_rel: float = 1.5):
        self._n = n_replicas
        self._block = block
        self._lead_blocks = max(1, lead // block)
        self._memory = memory
        self._imbalance = (imbalance_abs, imbalance_rel)
        self._prompts: OrderedDict[bytes, tuple[bytes, int, int]] = OrderedDict()
        """whole-prompt digest -> (its last block's digest, its length, the replica)"""
        self._ending_in: Counter[bytes] = Counter()
        """last block's digest -> how many remembered prompts end in that block"""

    def order(self, prompt: Sequence[int], healthy: Sequence[bool],
              in_flight: Sequence[int], *, salt: str | None = None,
              cache_key: str | None = None) -> list[int]:
        """The healthy replicas to try for `prompt`, best first."""
        up = [i for i in range(self._n) if healthy[i]]
        if not up:
            return []
        scope = _scope(salt, cache_key)
        data = _bytes(prompt, scope)
        digests = _block_digests(data, self._block)
        if cache_key is not None:
            key = _hash(scope)
        elif len(digests) >= self._lead_blocks:
            key = digests[self._lead_blocks - 1]
        else:  # shorter than the lead: all of it (a short shared start must not group them)
            key = _hash(data)
        ranked = [i for i in _rendezvous(key, self._n) if healthy[i]]
        first = self._continued(data, digests, healthy)
        if first is None:
            first = ranked[0]
        least = min(up, key=lambda i: in_flight[i])
        gap_abs, gap_rel = self._imbalance
        if (in_flight[first] - in_flight[least] > gap_abs
                and in_flight[first] > gap_rel * in_flight[least]):
            first = least
        return [first, *(i for i in ranked if i != first)]

    def _continued(self, data: bytes, digests: list[bytes],
                   healthy: Sequence[bool]) -> int | None:
        """The replica of the longest remembered prompt that `data` extends exactly."""
        n = len(data) // 8
        for k in range(len(digests), -1, -1):  # k full blocks; 0: shorter than a block
            if self._ending_in[digests[k - 1] if k else _NO_BLOCK] <= 0:
                continue
            for length in range(min(n, (k + 1) * self._block - 1), max(k * self._block, 1) - 1,
                                -1):
                found = self._prompts.get(_hash(data[:length * 8]))
                if found is not None and found[1] == length and healthy[found[2]]:
                    return found[2]
        return None

    def record(self, prompt: Sequence[int], replica: int, *, salt: str | None = None,
               cache_key: str | None = None) -> None:
        """`replica` now holds `prompt` (it was admitted there)."""
        data = _bytes(prompt, _scope(salt, cache_key))
        whole = _hash(data)
        digests = _block_digests(data, self._block)
        blk = digests[-1] if digests else _NO_BLOCK
        old = self._prompts.get(whole)
        if old is not None:
            self._prompts.move_to_end(whole)
        if old is None:
            self._ending_in[blk] += 1
        self._prompts[whole] = (blk, len(data) // 8, replica)
        while len(self._prompts) > self._memory:
            _, (gone_blk, _, _) = self._prompts.popitem(last=False)
            self._ending_in[gone_blk] -= 1
            if self._ending_in[gone_blk] <= 0:
                del self._ending_in[gone_blk]
