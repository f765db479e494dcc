"""The transfer layer's frozen config."""

from __future__ import annotations

from dataclasses import dataclass

from hicache.units import check_int
from hicache.errors import ConfigError

BACKENDS = ("auto", "reference", "cpu", "native", "torch", "triton")
LOAD_GRANULARITIES = ("auto", "layer", "batch")


@dataclass(frozen=True)
class TransferConfig:
    """How the controller copies and how much it lets queue up.

    ``backend``: see :mod:`hicache.transfer.kernels` (``auto`` = Triton on CUDA, the native
    batched memcpy on CPU). ``load_granularity``: ``layer`` runs a load batch one model
    layer at a time (one launch per layer, all families of that layer together) so
    :meth:`LoadHandle.wait_layer` returns as each layer lands; ``batch`` runs it as one
    launch (``wait_layer`` then returns when all land); ``auto`` is ``layer`` on CUDA,
    where layer N computes while later layers load, and ``batch`` on CPU, where copy and
    compute share the same cores and memory and the layer-by-layer walk over page_first
    host objects costs about a third of the bandwidth (measured: docs/transfer.md).
    Backups always run as one launch per batch.
    ``max_queued_ops`` / ``max_queued_bytes`` bound the ops submitted and not yet acked
    (pending plus in flight); a submission past either bound returns ``QueueFull`` and
    allocates nothing (one op larger than the byte bound is admitted into an empty queue,
    or it could never run). ``cpu_threads``: threads of one CPU copy (0 = torch's thread count).
    ``gpu_programs``: 0 (default) launches the Triton kernel with one program per chunk of
    a unit; N > 0 bounds its grid to N programs looping over the work, so a per-layer load
    leaves the other SMs to the layer compute (an experiment until measured on a GPU:
    docs/transfer.md, "Per-layer overlap").
    """

    backend: str = "auto"
    load_granularity: str = "auto"
    max_queued_ops: int = 4096
    max_queued_bytes: int | None = None
    cpu_threads: int = 0
    gpu_programs: int = 0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError("transfer.backend", self.backend, f"must be one of {list(BACKENDS)}")
        if self.load_granularity not in LOAD_GRANULARITIES:
            raise ConfigError("transfer.load_granularity", self.load_granularity,
                              f"must be one of {list(LOAD_GRANULARITIES)}")
        for name, minimum in (("max_queued_ops", 1), ("cpu_threads", 0), ("gpu_programs", 0)):
            v = getattr(self, name)
            check_int(f"transfer.{name}", v, minimum=minimum)
        b = self.max_queued_bytes
        check_int("transfer.max_queued_bytes", b, minimum=1, optional=True,
                  reason="must be null or a positive byte count")
