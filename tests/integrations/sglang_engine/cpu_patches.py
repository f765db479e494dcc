"""What it takes to run SGLang 0.5.23's HiCache controller on a machine without a GPU.

Nothing installed is changed: every patch is applied in this process only (``apply()``),
and each one replaces exactly a call that needs CUDA (see ``../shared/sglang-cpu.md``):

* three optional packages SGLang imports at module level (``tvm_ffi``, ``torchvision``,
  ``datasets``) are served as stub modules by a ``sys.meta_path`` finder;
* the fixture kit's ``get_device()`` -> ``"cpu"``;
* the host pool's ``cudaHostRegister`` (pinning) -> a no-op, and the MHA host pool's
  staging page for the legacy path is allocated without ``pin_memory``;
* ``MHATokenToKVPoolHost`` device<->host copies for the ``kernel`` io backend call
  ``sgl_kernel`` CUDA ops; on CPU an indexed torch copy per layer moves the same rows for
  the ``page_first`` and ``layer_first`` host layouts (anything else still goes to SGLang).

Not about the CPU but about a shared test machine: SGLang refuses any host pool unless
10 GiB of RAM stay free beside it (``HICACHE_HOST_MEMORY_RESERVE_BYTES``); the test pools
are kilobytes, so the reserve is 0 here and a busy machine does not fail them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from unittest import mock

_STUBBED = ("tvm_ffi", "torchvision", "datasets")


class _StubModule(types.ModuleType):
    """Attributes appear on first use: a class for ``tvm_ffi`` (SGLang subclasses
    ``tvm_ffi.Object``), a ``MagicMock`` for ``torchvision`` (transformers reads enum
    members off ``InterpolationMode``)."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = (mock.MagicMock(name=f"{self.__name__}.{attr}") if self.__name__.startswith("torchvision")
                 else type(attr, (), {}))
        setattr(self, attr, value)
        return value


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # transformers parses it when it sees the package
        return module

    def exec_module(self, module) -> None:
        pass


def install_import_stubs() -> None:
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())


def _cpu_d2h(orig):
    def backup_from_device_all_layer(self, device_pool, host_indices, device_indices, io_backend):
        if io_backend != "kernel" or self.layout not in ("page_first", "layer_first"):
            return orig(self, device_pool, host_indices, device_indices, io_backend)
        host_indices = host_indices.to("cpu", dtype=__import__("torch").int64)
        device_indices = device_indices.to("cpu", dtype=host_indices.dtype)
        for layer in range(self.layer_num):
            for host, dev in ((self.k_buffer, self.device_k_buffers[layer]),
                              (self.v_buffer, self.device_v_buffers[layer])):
                if self.layout == "page_first":
                    host[host_indices, layer] = dev[device_indices].to(host.dtype)
                else:
                    host[layer][host_indices] = dev[device_indices].to(host.dtype)

    return backup_from_device_all_layer


def _cpu_h2d(orig):
    def load_to_device_per_layer(self, device_pool, host_indices, device_indices, layer_id, io_backend,
                                 *, is_draft: bool = False):
        if io_backend != "kernel" or self.layout not in ("page_first", "layer_first"):
            return orig(self, device_pool, host_indices, device_indices, layer_id, io_backend,
                        is_draft=is_draft)
        if not is_draft and not 0 <= layer_id < self.target_layer_num:
            return
        import torch

        host_indices = host_indices.to("cpu", dtype=torch.int64)
        device_indices = device_indices.to("cpu", dtype=torch.int64)
        for host, dev in ((self.k_buffer, self.device_k_buffers[layer_id]),
                          (self.v_buffer, self.device_v_buffers[layer_id])):
            src = host[host_indices, layer_id] if self.layout == "page_first" else host[layer_id][host_indices]
            dev[device_indices] = src.to(dev.dtype)

    return load_to_device_per_layer


def _unpinned_dummy_page(self):
    """``get_dummy_flat_data_page`` without ``pin_memory=True`` (no pinned allocator on CPU)."""
    import torch

    return torch.zeros((2, self.layer_num, self.page_size, self.head_num, self.head_dim),
                       dtype=self.dtype, device=self.device).flatten()


def apply() -> list:
    """Apply every patch; returns the started patchers (``stop()`` undoes them)."""
    install_import_stubs()
    import sglang.srt.mem_cache.pool_host.base as host_base
    import sglang.srt.mem_cache.pool_host.common as host_common
    import sglang.test.kits.unified_radix_cache.fixtures as kit_fixtures
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    patchers = [
        mock.patch.object(kit_fixtures, "get_device", lambda *a, **k: "cpu"),
        mock.patch.object(host_common, "_cuda_host_register", lambda *a, **k: None),
        mock.patch.object(host_base, "HICACHE_HOST_MEMORY_RESERVE_BYTES", 0),
        mock.patch.object(MHATokenToKVPoolHost, "backup_from_device_all_layer",
                          _cpu_d2h(MHATokenToKVPoolHost.backup_from_device_all_layer)),
        mock.patch.object(MHATokenToKVPoolHost, "load_to_device_per_layer",
                          _cpu_h2d(MHATokenToKVPoolHost.load_to_device_per_layer)),
        mock.patch.object(MHATokenToKVPoolHost, "get_dummy_flat_data_page", _unpinned_dummy_page),
    ]
    for p in patchers:
        p.start()
    return patchers
