"""StressRunner counts the copy faults it injects, exactly."""

from __future__ import annotations

from hicache.engine import stress
from hicache.engine.stress import StressConfig, StressRunner
from hicache.errors import TransferError
from tests.cache.conftest import make_cache


def run(seed: int, fault_rate: float, monkeypatch) -> tuple[StressRunner, int]:
    raised = []

    class Counted(TransferError):
        def __init__(self, *args):
            raised.append(1)
            super().__init__(*args)

    monkeypatch.setattr(stress, "TransferError", Counted)
    cache = make_cache(device_pages=10, device_snaps=3, host_pages=14, host_snaps=5, write_policy="write_back",
                       retention=0)
    try:
        runner = StressRunner(cache, StressConfig(ops=400, seed=seed, prefetch=0.5, fault_rate=fault_rate))
        rep = runner.run()
    finally:
        cache.close()
    assert rep.integrity_errors == 0, rep.first_error
    return rep, len(raised)


def test_injected_faults_are_counted(monkeypatch):
    rep, raised = run(11, 0.05, monkeypatch)
    assert rep.injected_faults == raised > 0
    assert rep.stats["load_failures"] + rep.stats["backup_failures"] > 0   # they failed real copies
    rep, raised = run(11, 0.0, monkeypatch)
    assert rep.injected_faults == raised == 0
