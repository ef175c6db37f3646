"""Which weights may serve a request (`WeightBound`), and smg's version policy names for one
(`parse_policy`): below the settings, which hold the server's policy, and the engines, which
route by it (engines/versions.py)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WeightBound", "parse_policy"]


@dataclass(frozen=True)
class WeightBound:
    """Which weights may serve a request."""

    min_version: str | None = None
    max_staleness: int | None = None
    wait: float = 30.0
    """Seconds a request waits for a replica that satisfies the bound before it is refused."""
    policy: str | None = None
    """The server's `weight_version_policy` this bound comes from (None: the request's)."""

    def describe(self) -> str:
        if self.policy is not None:
            return f"the server's weight_version_policy {self.policy!r}"
        parts = []
        if self.min_version is not None:
            parts.append(f"min_weight_version {self.min_version!r}")
        if self.max_staleness is not None:
            parts.append(f"max_staleness {self.max_staleness}")
        return " and ".join(parts)

    @property
    def param(self) -> str | None:
        if self.policy is not None:
            return None  # the client sent no field: the server's setting refused it
        return "min_weight_version" if self.min_version is not None else "max_staleness"


def parse_policy(text: str, *, wait: float = 30.0) -> WeightBound | None:
    """smg's policy names (`any`, `latest-only`, `min-version:<v>`, `max-staleness:<k>`) as a
    bound; None for `any`. A ValueError names what is wrong."""
    if text == "any":
        return None
    if text == "latest-only":
        return WeightBound(max_staleness=0, wait=wait, policy=text)
    kind, sep, value = text.partition(":")
    if sep and kind == "min-version" and value:
        return WeightBound(min_version=value, wait=wait, policy=text)
    if sep and kind == "max-staleness" and value.isdigit():
        return WeightBound(max_staleness=int(value), wait=wait, policy=text)
    raise ValueError(f"{text!r} is not a version policy: any, latest-only, min-version:<label> "
                     "or max-staleness:<k>")
