"""Prometheus export mirrors stats() under documented names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cache.conftest import Engine, make_cache, toks

pytest.importorskip("prometheus_client")


def test_exporter_mirrors_counters_and_names_are_documented():
    from hicache.cache.metrics import PrometheusExporter

    eng = Engine(make_cache())
    exp = PrometheusExporter(eng.cache)
    eng.run(toks(1, 2, extra=1))
    eng.run(toks(1, 2, extra=1))
    exp.update()
    text = exp.text()
    stats = eng.cache.stats()
    assert f"hicache_hit_tokens_total {float(stats['hit_tokens'])}" in text
    assert f"hicache_device_pages_used {float(stats['device_pages_used'])}" in text
    exp.update()   # idempotent: counters only move by the change since the last update
    assert f"hicache_hit_tokens_total {float(stats['hit_tokens'])}" in exp.text()
    names = set(re.findall(r"^(hicache_[a-z0-9_]+?)(?:_total|_created)? ", text, flags=re.M))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    missing = sorted(n for n in names if n not in doc)
    assert not missing, f"undocumented metrics: {missing}"
    eng.cache.close()
