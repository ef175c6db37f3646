"""The prefix cache's slot choice, without a model."""

from __future__ import annotations

from tokenwire.engines.llamacpp.slots import MIN_COPY, Slots, common_prefix


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3], [1, 2]) == 2
    assert common_prefix([1, 2, 3], [1, 5, 3]) == 1
    assert common_prefix([9], [1]) == 0


def test_a_free_slot_holding_the_prefix_is_reused_in_place() -> None:
    slots = Slots(3)
    a = slots.take([1, 2, 3], {})
    slots.release(a.slot, [1, 2, 3])
    p = slots.take([1, 2, 3, 4, 5], {})
    assert (p.slot, p.source, p.shared, p.own) == (a.slot, a.slot, 3, 3)


def test_a_conversation_is_not_cut_for_a_prompt_sharing_only_its_start() -> None:
    """A slot holding a long history is kept when the new prompt shares only its system
    prompt and an empty slot is free: the prefix is copied instead."""
    slots = Slots(2)
    system = list(range(100, 100 + 2 * MIN_COPY))
    history = system + list(range(500, 600))
    a = slots.take(history, {})
    slots.release(a.slot, history)
    p = slots.take(system + [7, 8, 9], {})
    assert p.slot != a.slot and p.source == a.slot and p.shared == len(system) and p.own == 0
    assert slots.held(a.slot) == history


def test_a_running_sequence_is_a_source_too() -> None:
    slots = Slots(2)
    a = slots.take(list(range(50)), {})
    p = slots.take(list(range(40)) + [1], {a.slot: list(range(50))})
    assert p.source == a.slot and p.shared == 40 and p.slot != a.slot


def test_the_cheapest_cache_goes_first() -> None:
    """Empty slots, then duplicates of what another slot holds, then the least recently
    released; the lowest id breaks ties."""
    slots = Slots(4)
    taken = [slots.take([k], {}) for k in range(4)]
    assert [t.slot for t in taken] == [0, 1, 2, 3]
    slots.release(2, [20, 21])
    slots.release(0, [30, 31])
    slots.release(1, [20])  # a prefix of slot 2's ids: a duplicate
    assert slots.take([99], {}).slot == 1
    slots.release(1, [40, 41])  # now unique and the most recent
    assert slots.take([99], {}).slot == 2  # released before slot 0
    assert slots.take([98], {}).slot == 0
    assert slots.take([97], {}).slot == 1
    assert slots.free == []


def test_what_is_held_is_bounded_by_the_slots() -> None:
    slots = Slots(2)
    for k in range(50):
        p = slots.take([k] * 10, {})
        slots.release(p.slot, [k] * 10)
    assert len([s for s in range(2) if slots.held(s)]) == 2


def test_a_salt_reuses_only_its_own_tenants_cache() -> None:
    slots = Slots(2)
    prompt = list(range(10, 40))
    a = slots.take(prompt, {}, "tenant-a")
    slots.release(a.slot, prompt, "tenant-a")
    for other in (None, "tenant-b"):
        p = slots.take(prompt + [1], {}, other)
        assert (p.shared, p.own) == (0, 0)
        slots.release(p.slot, None)
    same = slots.take(prompt + [1], {}, "tenant-a")
    assert (same.slot, same.shared, same.own) == (a.slot, len(prompt), len(prompt))
