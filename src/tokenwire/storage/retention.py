"""Deleting stored completions and responses past their retention (`storage_retention_days`).

A sweep at start, then one every hour (or every tenth of the retention when that is shorter, but
at most one a second): a record is gone at most one interval after it expires. Every worker of a
server sweeps, and so does every gateway sharing a PostgreSQL store: a sweep is one idempotent
DELETE by age.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..errors import StorageError
from .base import Store

log = logging.getLogger(__name__)

_DAY = 86_400.0
_HOURLY = 3_600.0


def sweep_interval(days: float) -> float:
    """Seconds between sweeps."""
    return max(1.0, min(_HOURLY, days * _DAY / 10))


async def expire_forever(store: Store, days: float) -> None:
    """Sweep until cancelled; a failed sweep is logged and tried again at the next one."""
    while True:
        try:
            n = await store.expire(max(0, int(time.time() - days * _DAY)))
        except StorageError as exc:
            log.warning("retention sweep failed (tried again in %.0f s): %s",
                        sweep_interval(days), exc)
        else:
            if n:
                log.info("retention: deleted %d stored records older than %g days", n, days)
        await asyncio.sleep(sweep_interval(days))
