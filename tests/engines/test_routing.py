"""The prefix router: exact token-keyed affinity, stable fallback, load guard."""

from __future__ import annotations

import random

import pytest

from tokenwire.engines.upstream.routing import PrefixRouter

UP2 = [True, True]
IDLE2 = [0, 0]


def conversation(rng: random.Random, system: list[int], turns: int) -> list[list[int]]:
    """The prompts of one conversation: each turn's prompt extends the last."""
    prompt = list(system)
    out = []
    for _ in range(turns):
        prompt += [rng.randrange(50_000) for _ in range(rng.randint(1, 60))]  # user turn
        out.append(list(prompt))
        prompt += [rng.randrange(50_000) for _ in range(rng.randint(5, 80))]  # its answer
    return out


def test_every_turn_of_a_conversation_lands_where_its_prefix_is() -> None:
    rng = random.Random(1)
    router = PrefixRouter(2)
    system = [rng.randrange(50_000) for _ in range(30)]
    homes: dict[int, int] = {}
    for c in range(40):
        for prompt in conversation(rng, system if c % 2 else [], turns=4):
            chosen = router.order(prompt, UP2, IDLE2)[0]
            router.record(prompt, chosen)
            assert homes.setdefault(c, chosen) == chosen


def test_unseen_prompts_spread_by_their_leading_ids_and_agree_across_gateways() -> None:
    rng = random.Random(2)
    a, b = PrefixRouter(3), PrefixRouter(3)  # two gateways, no shared state
    counts = [0, 0, 0]
    for _ in range(300):
        prompt = [rng.randrange(50_000) for _ in range(rng.randint(1, 200))]
        first = a.order(prompt, [True] * 3, [0] * 3)[0]
        assert first == b.order(prompt, [True] * 3, [0] * 3)[0]
        counts[first] += 1
    assert min(counts) > 60, counts


def test_a_down_replica_is_skipped_and_only_its_prompts_move() -> None:
    rng = random.Random(3)
    router = PrefixRouter(3)
    prompts = [[rng.randrange(50_000) for _ in range(80)] for _ in range(200)]
    before = [router.order(p, [True] * 3, [0] * 3)[0] for p in prompts]
    after = [router.order(p, [True, False, True], [0] * 3) for p in prompts]
    assert all(1 not in order for order in after)
    for was, now in zip(before, after, strict=True):
        if was != 1:
            assert now[0] == was  # rendezvous hashing: the others keep their prompts
    assert router.order(prompts[0], [False] * 3, [0] * 3) == []


def test_a_much_busier_home_gives_way_to_the_least_loaded() -> None:
    router = PrefixRouter(2, imbalance_abs=4, imbalance_rel=1.5)
    prompt = list(range(100))
    home = router.order(prompt, UP2, IDLE2)[0]
    other = 1 - home
    busy = [0, 0]
    busy[home] = 10
    assert router.order(prompt, UP2, busy)[0] == other
    busy[other] = 8  # no longer a big gap: affinity wins again
    assert router.order(prompt, UP2, busy)[0] == home


def test_a_shared_short_prefix_is_not_a_continuation() -> None:
    """Conversations that share a system prompt's first block are not each other's turns:
    a new one goes where its own leading ids hash, not where the last one went."""
    rng = random.Random(4)
    system = [rng.randrange(50_000) for _ in range(20)]
    router = PrefixRouter(2)
    homes = []
    for _ in range(60):
        prompt = [*system, *(rng.randrange(50_000) for _ in range(rng.randint(5, 30)))]
        chosen = router.order(prompt, UP2, IDLE2)[0]
        router.record(prompt, chosen)
        homes.append(chosen)
    assert 15 < sum(homes) < 45, sum(homes)


def test_a_conversation_follows_its_turn_even_off_its_hash() -> None:
    """After a fail-over (or the load guard) moved a turn, the next follows it there."""
    router = PrefixRouter(2)
    turn1 = list(range(100, 140))
    home = router.order(turn1, UP2, IDLE2)[0]
    router.record(turn1, 1 - home)  # it was served elsewhere
    turn2 = [*turn1, 7, 8, 9, *range(300, 340)]
    assert router.order(turn2, UP2, IDLE2)[0] == 1 - home


def test_memory_is_bounded() -> None:
    router = PrefixRouter(2, memory=100)
    for i in range(500):
        router.record(list(range(i, i + 40)), i % 2)
    assert len(router._prompts) == 100
    assert sum(router._ending_in.values()) == 100


def test_routing_work_does_not_grow_with_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many remembered short prompts are not scanned one by one for each request: a lookup
    hashes at most one block's worth of candidate lengths per matching block."""
    from tokenwire.engines.upstream import routing

    router = PrefixRouter(2)
    for i in range(5_000):
        router.record([i, i + 1, i + 2], i % 2)  # all shorter than a block
    calls = 0
    real = routing._hash

    def counted(data: bytes) -> bytes:
        nonlocal calls
        calls += 1
        return real(data)

    monkeypatch.setattr(routing, "_hash", counted)
    router.order([50_000, 7, 7, 7], UP2, IDLE2)
    assert calls <= 16 + 1 + 2  # candidate lengths, the key, the replicas' scores
    assert router.order([5, 6, 7, 8], UP2, IDLE2)[0] == 1  # extends [5, 6, 7]


def test_a_prompt_cache_key_groups_requests_and_a_salt_keeps_tenants_apart() -> None:
    rng = random.Random(7)
    router = PrefixRouter(4)
    up, idle = [True] * 4, [0] * 4
    prompts = [[rng.randrange(50_000) for _ in range(rng.randint(5, 200))] for _ in range(40)]
    # one key, any prompts: one replica (OpenAI's prompt_cache_key)
    assert len({router.order(p, up, idle, cache_key="tenant-7/agent")[0]
                for p in prompts}) == 1
    assert len({router.order(p, up, idle)[0] for p in prompts}) > 1
    # remembered turns of other keys (or of none) do not pull a keyed request away
    home = router.order(prompts[0], up, idle, cache_key="k")[0]
    elsewhere = (home + 1) % 4
    router.record(prompts[0], elsewhere)
    router.record(prompts[0], elsewhere, cache_key="other")
    assert router.order(prompts[0] + [5], up, idle, cache_key="k")[0] == home
    router.record(prompts[0], home, cache_key="k")
    assert router.order(prompts[0] + [5], up, idle, cache_key="k")[0] == home
    # the load guard still applies: a much busier home gives way
    busy = [0] * 4
    busy[home] = 20
    assert router.order(prompts[1], up, busy, cache_key="k")[0] != home
    # a conversation's next turn follows it only within its salt
    turn1 = prompts[0]
    turn2 = turn1 + [1, 2, 3]
    homes = set()
    for salt in (None, "a", "b", "c", "d", "e"):
        first = router.order(turn1, up, idle, salt=salt)[0]
        router.record(turn1, first, salt=salt)
        assert router.order(turn2, up, idle, salt=salt)[0] == first
        homes.add(first)
    assert len(homes) > 1  # salts do not inherit another tenant's remembered turn
