"""Tinker's API (Thinking Machines' `tinker` SDK) on tokenwire: service.py answers sampling
from `/inference/v1/generate`'s engine call, training.py the training calls from a trainer
process (the `rl` extra), futures.py keeps the futures of both where every worker reads them,
wire.py speaks the SDK's protobuf, checkpoints.py maps `tinker://` paths to files."""

from .futures import Failed, Finished, FutureBox, Pending
from .service import TinkerService, sampler_id

__all__ = ["Failed", "Finished", "FutureBox", "Pending", "TinkerService", "sampler_id"]
