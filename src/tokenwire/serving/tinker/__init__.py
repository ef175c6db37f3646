"""Tinker's sampling API (Thinking Machines' `tinker` SDK) on tokenwire: service.py answers it
from `/inference/v1/generate`'s engine call, futures.py keeps its futures where every worker
reads them, wire.py writes the finished sample as the SDK's protobuf."""

from .futures import Failed, Finished, FutureBox, Pending
from .service import TinkerService

__all__ = ["Failed", "Finished", "FutureBox", "Pending", "TinkerService"]
