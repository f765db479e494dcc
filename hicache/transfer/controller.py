"""The transfer controller: queue copies, merge them per step, run them async, ack them.

::

    backup()/load()/copy()      step()                         poll()
    ---------------------  ->   ----------------------   ->    --------------------------
    validate ids, allocate      cut pending ops into           pop finished batches in
    destination rows (all or    phases (batch.py), build one   launch order per direction,
    nothing), queue the op      CopyPlan per direction, launch free rows of failed ops,
                                on the executor (async)        return Ack per op

Thread model: one owner thread calls the controller's methods (pools are not
thread-safe, and every pool mutation -- allocation at submission, freeing on failure --
happens in that thread). Handles may be waited on from any thread. The caller must keep
an op's source rows allocated and unchanged until its ack.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from hicache.errors import MisuseError
from hicache.pools import SOURCES, NoRoom, TieredPools, TierPools
from hicache.transfer.batch import DIRECTIONS, OTHER, Batch, Op, plan_phases
from hicache.transfer.config import TransferConfig
from hicache.transfer.executor import CANCELLED, CpuExecutor, CudaExecutor, FaultInjector, NoBytesExecutor
from hicache.transfer.handles import Ack, CopyHandle, LoadHandle, QueueFull, StepReport
from hicache.transfer import triton_copy
from hicache.transfer.kernels import resolve_backend
from hicache.transfer.plan import CopyPlan, check_ids, make_row_copy

KINDS = {"d2h": "backup", "h2d": "load"}


class TransferController:
    """Batched, asynchronous D2H (backup) and H2D (load) copies between ``pools`` tiers."""

    def __init__(self, pools: TieredPools, cfg: TransferConfig = TransferConfig(), *,
                 fault_injector: FaultInjector | None = None):
        if not isinstance(cfg, TransferConfig):
            raise MisuseError(f"cfg must be a TransferConfig, got {type(cfg).__name__}")
        self.pools = pools
        self.cfg = cfg
        layout = pools.layout
        self._families = {s: [f for f in layout.families_on(s)
                              if f.bytes_per_id_per_layer(layout.page_tokens) > 0] for s in SOURCES}
        self._layers = {s: frozenset(l for f in self._families[s] for l in f.layer_ids) for s in SOURCES}
        self._all_layers = frozenset(l for f in layout.families for l in f.layer_ids)
        self._unit_bytes = {s: layout.object_bytes(s) for s in SOURCES}
        device = pools.device.device
        # Pools without bytes: no copy plans and no workers; every op is still queued,
        # phased, batched and acked as with bytes, and counts the bytes it would move.
        self.holds_bytes = pools.device.holds_bytes
        if pools.host.holds_bytes != self.holds_bytes:
            raise MisuseError("the device and host pools must both hold bytes or both hold none")
        self.load_granularity = cfg.load_granularity
        if self.load_granularity == "auto":
            self.load_granularity = "layer" if device.type == "cuda" else "batch"
        if not self.holds_bytes:
            self.backend = "none"
            self._exec: Any = NoBytesExecutor(fault_injector)
        else:
            probe = CopyPlan([make_row_copy(pools.device.view(f.name), pools.host.view(f.name), [], [],
                                            name=f.name) for f in layout.families])
            self.backend = resolve_backend(cfg.backend, probe)
            if self.backend == "triton" and not triton_copy.available():
                raise MisuseError("backend 'triton' needs the triton package (pip install hicache[triton])")
            if device.type == "cuda":
                self._exec = CudaExecutor(device, self.backend, fault_injector, programs=cfg.gpu_programs)
            else:
                self._exec = CpuExecutor(self.backend, cfg.cpu_threads, fault_injector)
        self._pending: list[Op] = []
        self._inflight: dict[str, deque[Batch]] = {d: deque() for d in DIRECTIONS}
        self._ready: list[Ack] = []
        self._unacked_ops = 0
        self._unacked_bytes = 0
        self._seq = 0
        self._batch_seq = 0
        self._closed = False
        self._stats = {d: {"bytes": 0, "seconds": 0.0, "ops": 0, "batches": 0, "launches": 0,
                           "failures": 0, "launched_bytes": 0} for d in DIRECTIONS}

    # -- submission -----------------------------------------------------------------------
    def _tiers(self, direction: str) -> tuple[TierPools, TierPools]:
        if direction == "d2h":
            return self.pools.device, self.pools.host
        if direction == "h2d":
            return self.pools.host, self.pools.device
        raise MisuseError(f"direction must be 'd2h' or 'h2d', got {direction!r}")

    def _check_open(self, source: str) -> None:
        if self._closed:
            raise MisuseError("the transfer controller is shut down")
        if source not in SOURCES:
            raise MisuseError(f"source must be one of {SOURCES}, got {source!r}")

    def _used(self, tier: TierPools, source: str, ids: np.ndarray, what: str) -> None:
        used = tier.anchors[source].is_used(ids)
        if not used.all():
            raise MisuseError(f"{what}: {tier.tier} {source} id {int(ids[~used][0])} is not allocated")

    def _admit(self, n: int, source: str) -> QueueFull | None:
        nbytes = n * self._unit_bytes[source]
        cap = self.cfg.max_queued_bytes
        if self._unacked_ops + 1 > self.cfg.max_queued_ops or (
                cap is not None and self._unacked_bytes + nbytes > cap and self._unacked_ops):
            return QueueFull(self._unacked_ops, self._unacked_bytes, nbytes,
                             self.cfg.max_queued_ops, cap)
        return None

    def _queue(self, kind: str, direction: str, source: str, src: np.ndarray, dst: np.ndarray,
               tag: Any, owns_dst: bool) -> CopyHandle:
        nbytes = int(src.size) * self._unit_bytes[source]
        op = Op(self._seq, kind, direction, source, src, dst, tag, owns_dst, nbytes,
                self._layers[source] if src.size else frozenset(), self._all_layers)
        # Launched batches of the other direction writing rows this op reads: it depends on
        # them even if they fail and are acked (leaving _inflight) before it launches. A
        # writer still pending launches with it, ordered by plan_phases and step's deps.
        op.after = [b for b in self._inflight[OTHER[direction]]
                    if source in b.rows and np.intersect1d(src, b.rows[source][1]).size]
        self._seq += 1
        self._pending.append(op)
        self._unacked_ops += 1
        self._unacked_bytes += nbytes
        return LoadHandle(op) if direction == "h2d" else CopyHandle(op)

    def _alloc_and_queue(self, direction: str, ids: object, source: str, tag: Any):
        self._check_open(source)
        src_tier, dst_tier = self._tiers(direction)
        src = check_ids(ids, src_tier.capacity(source), f"{KINDS[direction]}: ids", unique=False)
        self._used(src_tier, source, src, KINDS[direction])
        full = self._admit(src.size, source)
        if full is not None:
            return full
        result = dst_tier.alloc(source, int(src.size))  # all or nothing across sidecars
        if not result.ok:
            return result
        return self._queue(KINDS[direction], direction, source, src, result.ids.numpy().copy(),
                           tag, owns_dst=True)

    def set_fault_injector(self, fault_injector: "FaultInjector | None") -> None:
        """Install (or clear) a hook called per copied layer; raising fails that batch.

        For stress and fault tests: failures travel the same path as real copy errors.
        """
        self._exec.fault_injector = fault_injector

    def backup(self, device_ids: object, source: str = "page", tag: Any = None) -> CopyHandle | NoRoom | QueueFull:
        """Allocate host rows and queue a D2H copy of ``device_ids`` into them.

        Returns the handle (``dst_ids`` = the new host ids), or :class:`NoRoom` /
        :class:`QueueFull` with nothing allocated or queued.
        """
        return self._alloc_and_queue("d2h", device_ids, source, tag)

    def load(self, host_ids: object, source: str = "page", tag: Any = None) -> LoadHandle | NoRoom | QueueFull:
        """Allocate device rows and queue an H2D copy of ``host_ids`` into them."""
        return self._alloc_and_queue("h2d", host_ids, source, tag)

    def copy(self, direction: str, source: str, src_ids: object, dst_ids: object,
             tag: Any = None) -> CopyHandle | QueueFull:
        """Queue a copy into destination rows the caller already allocated."""
        self._check_open(source)
        src_tier, dst_tier = self._tiers(direction)
        src = check_ids(src_ids, src_tier.capacity(source), "copy: src_ids", unique=False)
        dst = check_ids(dst_ids, dst_tier.capacity(source), "copy: dst_ids", unique=True)
        if src.size != dst.size:
            raise MisuseError(f"copy: {src.size} src_ids but {dst.size} dst_ids")
        self._used(src_tier, source, src, "copy: src_ids")
        self._used(dst_tier, source, dst, "copy: dst_ids")
        full = self._admit(src.size, source)
        if full is not None:
            return full
        return self._queue("copy", direction, source, src, dst, tag, owns_dst=False)

    # -- step -----------------------------------------------------------------------------
    def _nominal_batch(self, direction: str, ops: list[Op]) -> Batch:
        """A batch of pools without bytes: no plan; the bytes and launch groups a copy of
        ``ops`` would have (the groups of :meth:`CopyPlan.groups`, with no segments)."""
        layers: set[int] = set()
        for op in ops:
            if op.src_ids.size:
                layers |= self._layers[op.source]
        if direction == "h2d" and self.load_granularity == "layer":
            groups: list = [(lid, ()) for lid in sorted(layers)]
        else:
            groups = [(None, ())] if layers else []
        batch = Batch(self._batch_seq, direction, ops, None, groups, nbytes=sum(op.nbytes for op in ops))
        self._batch_seq += 1
        return batch

    def _make_batch(self, direction: str, ops: list[Op]) -> Batch:
        if not self.holds_bytes:
            return self._nominal_batch(direction, ops)
        src_tier, dst_tier = self._tiers(direction)
        items = []
        for source in SOURCES:
            mine = [op for op in ops if op.source == source]
            if not mine:
                continue
            s = np.concatenate([op.src_ids for op in mine])
            d = np.concatenate([op.dst_ids for op in mine])
            for fam in self._families[source]:
                items.append(make_row_copy(src_tier.view(fam.name), dst_tier.view(fam.name), s, d,
                                           name=fam.name, layer_ids=fam.layer_ids))
        plan = CopyPlan(items)
        per_layer = direction == "h2d" and self.load_granularity == "layer"
        batch = Batch(self._batch_seq, direction, ops, plan, plan.groups(per_layer))
        self._batch_seq += 1
        return batch

    def step(self) -> StepReport:
        """Merge every pending op into one batch per direction (per phase) and launch them."""
        if self._closed:
            raise MisuseError("the transfer controller is shut down")
        ops, self._pending = self._pending, []
        phases = plan_phases(ops)
        batches = nbytes = 0
        for phase in phases:
            for direction, dops in phase:
                b = self._make_batch(direction, dops)
                b.deps = [o for o in self._inflight[OTHER[direction]] if b.conflicts(o)]
                # A writer of our source rows acked (failed) before we launched has left
                # _inflight: depend on its batch all the same, so its failure reaches us.
                for op in dops:
                    b.deps.extend(w for w in op.after if w not in b.deps)
                    op.after = []   # no chains of finished batches kept alive
                for op in dops:
                    op.batch = b
                self._inflight[direction].append(b)
                self._exec.submit(b)
                self._stats[direction]["launched_bytes"] += b.nbytes
                batches += 1
                nbytes += b.nbytes
        return StepReport(len(ops), batches, len(phases), nbytes)

    # -- completion -----------------------------------------------------------------------
    def _ack(self, op: Op, error: str | None) -> Ack:
        if error is not None and op.owns_dst:
            _, dst_tier = self._tiers(op.direction)
            dst_tier.free(op.source, op.dst_ids)
        self._unacked_ops -= 1
        self._unacked_bytes -= op.nbytes
        st = self._stats[op.direction]
        st["ops"] += 1
        st["failures"] += error is not None
        return Ack(op.tag, op.kind, op.direction, op.source, torch.from_numpy(op.src_ids.copy()),
                   torch.from_numpy(op.dst_ids.copy()), error is None, error, op.seq)

    def wait_launched(self, timeout: float | None = None) -> bool:
        """Wait until every launched batch (both directions) has finished; False if
        ``timeout`` passed first. Queued ops are not launched: call ``step()`` first."""
        return all(b.wait(timeout) for d in DIRECTIONS for b in list(self._inflight[d]))

    def poll(self) -> list[Ack]:
        """Acks of every finished op not acked yet, in submission order per direction."""
        acks, self._ready = self._ready, []
        for direction in DIRECTIONS:
            q = self._inflight[direction]
            while q and q[0].is_done():
                b = q.popleft()
                b.deps = []   # finished: what it waited on is no longer needed
                st = self._stats[direction]
                st["batches"] += 1
                st["launches"] += b.launches
                if b.error is None:
                    st["bytes"] += b.nbytes
                    st["seconds"] += b.seconds
                acks.extend(self._ack(op, b.error) for op in b.ops)
                b.keep.clear()
        acks.sort(key=lambda a: a.seq)
        return acks

    def pending(self) -> int:
        """Ops submitted and not yet returned by ``poll()`` (queued, in flight or finished)."""
        return self._unacked_ops

    def stats(self) -> dict:
        """Per direction: bytes and seconds of acked-ok batches, bytes of every launched
        batch (``launched_bytes``: known when it launches, whatever its outcome), ops,
        batches, launches, failures; plus the backend and what is queued now."""
        out: dict = {d: dict(v) for d, v in self._stats.items()}
        for d in DIRECTIONS:
            s = out[d]
            s["gbps"] = s["bytes"] / s["seconds"] / 1e9 if s["seconds"] else 0.0
        out.update(backend=self.backend, queued_ops=self._unacked_ops,
                   queued_bytes=self._unacked_bytes, pending_ops=len(self._pending))
        return out

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work. ``wait=True``: launch what is pending and let everything
        finish. ``wait=False``: pending ops and in-flight batches fail (CPU batches stop at
        the next layer boundary). Either way every op still gets its ack from ``poll()``."""
        if self._closed:
            return
        if wait:
            self.step()
        else:
            for op in self._pending:
                op.cancel_error = CANCELLED
                self._ready.append(self._ack(op, CANCELLED))
            self._pending = []
        self._closed = True
        for direction in DIRECTIONS:
            for b in self._inflight[direction]:
                if not wait and not b.is_done():
                    if isinstance(self._exec, CudaExecutor):
                        self._exec.cancel(b)
                    else:
                        b.cancelled = True
        for direction in DIRECTIONS:
            for b in self._inflight[direction]:
                b.wait()
        self._exec.shutdown()

    def __enter__(self) -> "TransferController":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=exc[0] is None)
