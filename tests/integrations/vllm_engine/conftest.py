"""Tests that drive vLLM's own tiering classes; they need the vLLM venv and run there, as a
subprocess started by ``tests/integrations/test_vllm_engine.py`` (which sets
``HICACHE_VLLM_INNER=1``). The main run does not collect them itself."""

import os

import pytest

if os.environ.get("HICACHE_VLLM_INNER") != "1":
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(params=["memory", "redis"])
def l3_url(request):
    """Each scenario against ``memory://`` and a private redis-server (stopped by PID)."""
    if request.param == "memory":
        import uuid

        yield f"memory://vllm-{uuid.uuid4().hex[:8]}"
        return
    from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer()
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture(autouse=True, scope="session")
def _remove_primary_regions():
    """A test that fails before ``manager.shutdown()`` leaves its primary region in /dev/shm."""
    yield
    import glob

    from .harness import ENGINE_PREFIX

    for path in glob.glob(f"/dev/shm/vllm_offload_{ENGINE_PREFIX}*.mmap"):
        os.unlink(path)
