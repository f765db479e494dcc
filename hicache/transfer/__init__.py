"""Layer 2: batched, asynchronous copies between the device (L1) and host (L2) pools.

Interface of the layer (everything else in the package is internal):

* :class:`TransferController` / :class:`TransferConfig`: queue backups (D2H) and loads
  (H2D), merge each step's ops into one copy per (family, direction), run them
  asynchronously and hand back :class:`Ack` objects from ``poll()``.
* :class:`CopyHandle` / :class:`LoadHandle` (per-layer waits), :class:`QueueFull`,
  :class:`StepReport`, :class:`FaultPoint` (what a test's fault injector receives).
* :func:`copy_rows` / :func:`copy_batch` / :class:`RowCopy` / :func:`make_row_copy`: the
  copy kernels as plain functions (backends ``reference``, ``native``, ``torch``,
  ``triton``; ``cpu`` and ``auto`` pick one) over ``TierPools.view`` views.

Imports only :mod:`hicache.pools` (and :mod:`hicache.layout` through it).
See docs/transfer.md.
"""

from hicache.transfer.batch import Direction, FaultPoint
from hicache.transfer.config import BACKENDS, TransferConfig
from hicache.transfer.executor import FaultInjector
from hicache.transfer.controller import TransferController
from hicache.transfer.handles import Ack, CopyHandle, LoadHandle, QueueFull, StepReport
from hicache.transfer.kernels import copy_batch, copy_rows, resolve_backend
from hicache.transfer import native
from hicache.transfer.native import status as native_status
from hicache.transfer.plan import CopyPlan, RowCopy, make_row_copy

__all__ = [
    "TransferController", "TransferConfig", "BACKENDS",
    "Ack", "CopyHandle", "LoadHandle", "QueueFull", "StepReport", "FaultPoint", "FaultInjector", "Direction",
    "copy_rows", "copy_batch", "resolve_backend", "native", "native_status",
    "CopyPlan", "RowCopy", "make_row_copy",
]
