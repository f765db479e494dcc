"""Where batches run: a worker thread per direction on CPU, side streams on CUDA, or --
for pools without bytes -- nowhere (:class:`NoBytesExecutor`).

The first two run the groups of a batch in order (one group per model layer for loads
with ``load_granularity='layer'``), call the fault injector before each group, and record
progress so :meth:`Batch.wait_layer` can return as each layer lands.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import torch

from hicache.errors import TransferError
from hicache.transfer.batch import DIRECTIONS, Batch, FaultPoint
from hicache.transfer.kernels import run_segments

FaultInjector = Callable[[FaultPoint], None]
CANCELLED = "TransferError: cancelled by shutdown(wait=False)"


def _fault_point(b: Batch, layer_id: int | None) -> FaultPoint:
    return FaultPoint(b.direction, b.seq, layer_id, tuple(op.seq for op in b.ops),
                      tuple(op.tag for op in b.ops))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _check_deps(b: Batch) -> None:
    for dep in b.deps:
        if dep.error is not None:
            raise TransferError(f"depends on batch {dep.seq} ({dep.direction}), which failed: {dep.error}")


class CpuExecutor:
    """One daemon worker thread per direction; batches of a direction run FIFO."""

    def __init__(self, backend: str, threads: int, fault_injector: FaultInjector | None):
        self.backend = backend
        self.threads = threads
        self.fault_injector = fault_injector
        self._queues: dict[str, queue.SimpleQueue] = {d: queue.SimpleQueue() for d in DIRECTIONS}
        self._workers: dict[str, threading.Thread] = {}

    def submit(self, b: Batch) -> None:
        if b.direction not in self._workers:
            t = threading.Thread(target=self._loop, args=(b.direction,),
                                 name=f"hicache-transfer-{b.direction}", daemon=True)
            self._workers[b.direction] = t
            t.start()
        self._queues[b.direction].put(b)

    def _loop(self, direction: str) -> None:
        q = self._queues[direction]
        while True:
            b = q.get()
            if b is None:
                return
            self._run(b)

    def _run(self, b: Batch) -> None:
        try:
            for dep in b.deps:
                dep.done_event.wait()
            _check_deps(b)
            start = time.perf_counter()
            assert b.plan is not None, "a CPU batch copies a plan"
            for idx, (layer_id, segments) in enumerate(b.groups):
                if b.cancelled:
                    raise TransferError("cancelled by shutdown(wait=False)")
                if self.fault_injector is not None:
                    self.fault_injector(_fault_point(b, layer_id))
                run_segments(b.plan, segments, self.backend, threads=self.threads)
                b.launches += 1
                b.set_landed(idx + 1)
            b.seconds = time.perf_counter() - start
        except BaseException as exc:  # any failure is the batch's failure, never a silent ack
            b.fail(_describe(exc))
        else:
            b.finish()

    def shutdown(self) -> None:
        for d, t in self._workers.items():
            self._queues[d].put(None)
        for t in self._workers.values():
            t.join()
        self._workers.clear()


class NoBytesExecutor:
    """Pools without bytes (``PoolConfig.bytes_mode="none"``): there is nothing to copy, so a
    batch finishes inside ``submit``, on the caller's thread, with no worker.

    Everything around the copy is kept: a batch still fails when a batch it depends on
    failed, the fault injector is still called before each of its (nominal) launch groups
    and may raise to fail it, and its ops are acked by ``poll()`` in submission order. A
    blocking injector would block the caller: there is no other thread to hold.
    """

    def __init__(self, fault_injector: FaultInjector | None):
        self.fault_injector = fault_injector

    def submit(self, b: Batch) -> None:
        try:
            _check_deps(b)   # every earlier batch has finished: they ran in their submit
            for idx, (layer_id, _) in enumerate(b.groups):
                if self.fault_injector is not None:
                    self.fault_injector(_fault_point(b, layer_id))
                b.launches += 1
                b.landed = idx + 1   # no other thread: nobody waits on the condition yet
        except BaseException as exc:  # the batch's failure, as with bytes
            b.fail(_describe(exc))
        else:
            b.finish()

    def shutdown(self) -> None:
        pass


class CudaExecutor:
    """Launches from the caller's thread onto one side stream per direction.

    Before a batch its stream waits for the caller's current stream (device rows a backup
    reads were written there) and for the last event of every batch it depends on; after
    each group it records an event, which ``wait_layer`` and ``poll`` query.
    """

    def __init__(self, device: torch.device, backend: str, fault_injector: FaultInjector | None, *,
                 programs: int = 0):
        self.device = device
        self.backend = backend
        self.programs = programs      # TransferConfig.gpu_programs
        self.fault_injector = fault_injector
        self.streams = {d: torch.cuda.Stream(device=device) for d in DIRECTIONS}

    def submit(self, b: Batch) -> None:
        stream = self.streams[b.direction]
        b.events = []
        assert b.plan is not None, "a CUDA batch copies a plan"
        try:
            _check_deps(b)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for dep in b.deps:
                    if dep.events:
                        stream.wait_event(dep.events[-1])
                start = b.start_event = torch.cuda.Event(enable_timing=True)
                start.record(stream)
                for layer_id, segments in b.groups:
                    if self.fault_injector is not None:
                        self.fault_injector(_fault_point(b, layer_id))
                    b.keep += run_segments(b.plan, segments, self.backend, programs=self.programs)
                    b.launches += 1
                    ev = torch.cuda.Event(enable_timing=True)
                    ev.record(stream)
                    b.events.append(ev)
            if not b.events:  # nothing to copy: done at once
                b.finish()
        except BaseException as exc:
            stream.synchronize()  # groups already launched must finish before rows are freed
            b.fail(_describe(exc))

    def cancel(self, b: Batch) -> None:
        """Launched work cannot be recalled: let it finish, then report it failed."""
        self.streams[b.direction].synchronize()
        b.fail(CANCELLED)

    def shutdown(self) -> None:
        for s in self.streams.values():
            s.synchronize()
