"""Test-only: vLLM's ``TieringOffloadingSpec`` made to run on vLLM's CPU backend.

Why it exists: vLLM 0.32's offloading worker (the part that copies blocks between the
engine's KV cache and the primary tier's /dev/shm region) only runs on CUDA-alike and XPU
devices. On the CPU backend ``OffloadingConnector`` stops at the platform check in
``CPUOffloadingSpec.get_worker``; past it the copy handler asserts its KV tensors are CUDA
or XPU, copies through ``_C_cache_ops.swap_blocks_batch`` (absent from the CPU build) and
orders and times its copies with device streams and events (the CPU backend has none).

On the CPU backend the engine's "device" KV cache is host memory, so the copy
descriptors the handler builds (source address, destination address, size) can be
executed with a plain ``memmove``, synchronously. :class:`CPUTieringOffloadingSpec`
builds vLLM's own worker and replaces exactly these things, nothing more:

1. ``get_worker`` without the platform check (it calls vLLM's ``create_worker``);
2. while the worker is constructed, the KV tensors answer ``is_cuda`` (a tensor subclass
   that only changes that answer, dropped again once the worker is built), for the
   handler's device assertion;
3. each direction's copy function (``_swap_blocks_batch``) by :func:`memmove_batch`;
4. each direction's stream and event pools by pools of host stand-ins: a copy has finished
   when it returns, so every event has happened and a stream has nothing to wait for.

Everything else is vLLM's: the connector, its scheduler side, the tiering manager and its
CPU primary tier in /dev/shm, the secondary tiers, the descriptor building (block ids to
addresses, per KV cache group and layer), the job bookkeeping and the model's forward.

Load it through ``kv_connector_extra_config``::

    {"spec_name": "CPUTieringOffloadingSpec",
     "spec_module_path": "tests.integrations.vllm_engine.cpu_offload_spec", ...}
"""

from __future__ import annotations

import ctypes
import dataclasses
import time

import torch
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.cpu.gpu_worker import CPUOffloadingWorker, SingleDirectionOffloadingHandler
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec


def memmove_batch(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor, **_) -> None:
    """``swap_blocks_batch`` on host memory: one ``memmove`` per descriptor, done on return
    (``is_src_access_order_any`` and the like are device-copy hints: ignored)."""
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist()):
        ctypes.memmove(d, s, n)


class HostEvent:
    """A device event whose work has always finished: copies are synchronous. Records the
    host time so the handler's transfer timings stay meaningful."""

    def __init__(self) -> None:
        self.at = time.perf_counter()

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.at - self.at) * 1e3   # milliseconds, as torch's events answer


class HostStream:
    """A device stream with nothing in flight: waiting on another stream or an event is
    already satisfied."""

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


class FreshPool:
    """Stands in for a handler's stream or event pool: never empty (``pop`` makes a new
    stand-in), keeps nothing handed back (stand-ins hold no resources)."""

    def __init__(self, make) -> None:
        self._make = make

    def __bool__(self) -> bool:
        return True

    def pop(self):
        return self._make()

    def append(self, item) -> None:
        pass

    def clear(self) -> None:
        pass


class _ClaimsDevice(torch.Tensor):
    """Host KV memory that answers ``is_cuda`` for the handler's constructor assertion;
    everything else is the tensor's own (same storage, same data pointer)."""

    is_cuda = True


def _claiming_device(kv_caches: CanonicalKVCaches) -> CanonicalKVCaches:
    tensors = [dataclasses.replace(t, tensor=t.tensor.as_subclass(_ClaimsDevice)) for t in kv_caches.tensors]
    return dataclasses.replace(kv_caches, tensors=tensors)


def run_on_host(handler: SingleDirectionOffloadingHandler) -> None:
    """Swap one direction's device parts for host ones; its tensor lists back to plain
    tensors (the claim was needed by the constructor only)."""
    for tensors in (handler.src_tensors, handler.dst_tensors):
        tensors[:] = [t.as_subclass(torch.Tensor) for t in tensors]
    handler._swap_blocks_batch = memmove_batch
    handler._stream_pool = FreshPool(HostStream)
    handler._event_pool = FreshPool(HostEvent)


# kv_connector_extra_config keys that select this spec (tests, bench/vllm_ttft.py)
SPEC_CONFIG = {"spec_name": "CPUTieringOffloadingSpec",
               "spec_module_path": "tests.integrations.vllm_engine.cpu_offload_spec"}


class CPUTieringOffloadingSpec(TieringOffloadingSpec):
    """``TieringOffloadingSpec`` whose worker runs on vLLM's CPU backend (see module doc)."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if not self._worker:
            worker = self.create_worker(_claiming_device(kv_caches))
            assert isinstance(worker, CPUOffloadingWorker)
            run_on_host(worker._store_handler)
            run_on_host(worker._load_handler)
            self._worker = worker
        return self._worker
