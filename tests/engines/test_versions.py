"""Weight versions in the order the fleet was given them, and which replicas a bound admits."""

from __future__ import annotations

import pytest

from tokenwire.config import Settings
from tokenwire.engines.versions import VersionOrder, WeightBound, parse_policy


def test_labels_are_ordered_as_met_and_ties_naturally() -> None:
    order = VersionOrder()
    order.see(["default"])
    order.see(["step-10", "step-9", None])  # met together (a box started mid-roll)
    order.see(["step-9", "base"])  # met before: stays; new: after all
    ranks = {x: order.rank(x) for x in ["default", "step-9", "step-10", "base", "never"]}
    assert ranks == {"default": 0, "step-9": 1, "step-10": 2, "base": 3, "never": None}


def test_a_bound_admits_replicas_by_their_own_versions() -> None:
    order = VersionOrder()
    for v in ["a", "b", "c"]:
        order.see([v])
    versions = ["a", "b", "c", None]
    assert order.admits(WeightBound(max_staleness=0), versions) == [False, False, True, False]
    assert order.admits(WeightBound(max_staleness=1), versions) == [False, True, True, False]
    assert order.admits(WeightBound(min_version="b"), versions) == [False, True, True, False]
    assert order.admits(WeightBound(min_version="zz"), versions) == [False] * 4  # not yet
    # the newest is the newest a replica serves, not the newest ever labelled
    assert order.admits(WeightBound(max_staleness=0), ["a", "b"]) == [False, True]
    both = WeightBound(min_version="a", max_staleness=1)
    assert order.admits(both, versions) == [False, True, True, False]


def test_staleness_counts_from_the_newest_a_serving_replica_holds() -> None:
    """A replica that is down or held (a stopped roll's batch, labelled new) keeps no request
    waiting for its version."""
    order = VersionOrder()
    order.see(["a", "b"])
    # (whether the held replica may take requests is routing's call, not the bound's)
    assert order.admits(WeightBound(max_staleness=0), ["a", "b"], [True, False]) == \
        [True, True]
    assert order.admits(WeightBound(max_staleness=0), ["a", "b"]) == [False, True]


def test_the_refusal_names_the_versions_present() -> None:
    order = VersionOrder()
    order.see(["s1"])
    err = order.unavailable(WeightBound(min_version="s2", wait=3),
                            [("replica 1", "s1", "serving"), ("replica 2", None, "down")])
    assert (err.status_code, err.code, err.param) == (409, "weight_version_unavailable",
                                                      "min_weight_version")
    assert err.message == ("no replica serves weights within min_weight_version 's2' after 3 s "
                           "('s2' was never served); present: replica 1: 's1' (serving); "
                           "replica 2: None (down)")


@pytest.mark.parametrize(("text", "bound"), [
    ("any", None),
    ("latest-only", WeightBound(max_staleness=0, policy="latest-only")),
    ("max-staleness:2", WeightBound(max_staleness=2, policy="max-staleness:2")),
    ("min-version:step-7", WeightBound(min_version="step-7", policy="min-version:step-7")),
])
def test_smg_policy_names(text: str, bound: WeightBound | None) -> None:
    assert parse_policy(text) == bound
    assert Settings(weight_version_policy=text).weight_bound == bound
    if bound is not None:  # refused by the server's setting: no field of the client's named
        err = VersionOrder().unavailable(bound, [])
        assert err.param is None and f"weight_version_policy {text!r}" in err.message


@pytest.mark.parametrize("text", ["latest", "max-staleness:-1", "max-staleness:", "min-version:"])
def test_a_bad_policy_is_refused_at_start(text: str) -> None:
    with pytest.raises(ValueError, match="not a version policy"):
        parse_policy(text)
    with pytest.raises(ValueError, match="weight_version_policy"):
        Settings(weight_version_policy=text)
