"""Fixtures for driving SGLang 0.5.23's HiCache controller on CPU with hicache as its L3.

Runs only inside the SGLang venv (see ``tests/integrations/test_sglang_engine.py``). The CPU
patches (``cpu_patches.py``) are applied once for the session, before SGLang is imported.
"""

from __future__ import annotations

import json
import logging
import unittest

import pytest

from tests.integrations.sglang_engine import cpu_patches

cpu_patches.install_import_stubs()

from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE as FLA_CHUNK_SIZE  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402
from sglang.test.kits.unified_radix_cache.fixtures import drop_hicache_atexit_pin  # noqa: E402
from sglang.test.kits.unified_radix_cache.storage import UnifiedRadixCacheStorageFixtures  # noqa: E402

from tests.storage.conftest import redis_cluster, redis_server  # noqa: E402,F401  (shared fixtures)

HICACHE_BACKEND = {"backend_name": "hicache", "module_path": "hicache.integrations.sglang",
                   "class_name": "HiCacheStorageBackend"}


@pytest.fixture(scope="session", autouse=True)
def cpu():
    patchers = cpu_patches.apply()
    yield
    for p in reversed(patchers):
        p.stop()


class Kit(UnifiedRadixCacheStorageFixtures, unittest.TestCase):
    """SGLang's fixture kit (``sglang.test.kits.unified_radix_cache``) as a plain object:
    its helpers need a ``TestCase`` (``addCleanup``, ``assert*``), not a test method."""

    def runTest(self) -> None:  # pragma: no cover - never run as a test
        pass

    def attach(self, cache, backend: str, extra: dict, *, storage_dir=None, mem_layout="page_first",
               write_policy="write_through"):
        """``UnifiedRadixCache.init_hicache`` with a storage backend, as the kit's
        ``_init_hicache`` does for ``file`` (single rank, wait_complete prefetch), for any
        backend and extra-config: SGLang builds its real ``HiCacheController`` and threads."""
        override = get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
        override.__enter__()
        self.addCleanup(override.__exit__, None, None, None)
        if backend == "file":
            cm = envs.SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR.override(storage_dir)
            cm.__enter__()
            self.addCleanup(cm.__exit__, None, None, None)
        args = ServerArgs(model_path="dummy", page_size=self.cfg.page_size, hicache_io_backend="kernel",
                          hicache_mem_layout=mem_layout, hicache_write_policy=write_policy,
                          hicache_storage_backend=backend,
                          hicache_storage_backend_extra_config=json.dumps({"prefetch_threshold": 1, **extra}),
                          hicache_storage_prefetch_policy="wait_complete", hicache_host_memory_mode="cache")
        args._mamba_cache_chunk_size = max(FLA_CHUNK_SIZE, self.cfg.page_size)
        set_global_server_args_for_scheduler(args)
        cache.init_hicache(args, cache.cache_init_params)
        self.addCleanup(drop_hicache_atexit_pin, cache)
        self.addCleanup(cache.release_host_resources)
        cache.write_through_threshold = 1 << 30
        cache.load_back_threshold = 0
        cc = cache.cache_controller
        cc.prefetch_capacity_limit = max(cc.prefetch_capacity_limit, cc.mem_pool_host.size)
        self.addCleanup(cc._stop_storage_threads)
        return cache


@pytest.fixture
def make_kit():
    kits: list[Kit] = []

    def make(cfg) -> Kit:
        kit = Kit()
        kit.cfg = cfg
        kits.append(kit)
        return kit

    yield make
    for kit in reversed(kits):
        kit.doCleanups()


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def logged_errors():
    """ERROR records (SGLang logs the exceptions of its storage threads there)."""
    handler = _Collect()
    root = logging.getLogger()
    root.addHandler(handler)
    yield handler.records
    root.removeHandler(handler)
