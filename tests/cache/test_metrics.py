"""Prometheus export: into the caller's registry, with constant labels, documented names;
hits by tier, L3 latency/bandwidth histograms, breaker state and faults by type."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hicache.errors import ConfigError
from tests.cache.conftest import Engine, make_cache, toks

prom = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

DOC = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
LABELS = {"model_name": "tiny-hybrid", "rank": "3"}


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **labels) -> tuple[str, tuple]:
    return name, tuple(sorted({**LABELS, **labels}.items()))


def test_exporter_fills_the_callers_registry_with_labelled_documented_series():
    from hicache.cache.metrics import PrometheusExporter

    registry = prom.CollectorRegistry()
    eng = Engine(make_cache())
    exp = PrometheusExporter(eng.cache, registry=registry, labels=LABELS)
    eng.run(toks(1, 2, extra=1))
    eng.run(toks(1, 2, extra=1))
    exp.update()
    got = samples(prom.generate_latest(registry).decode())
    stats, l3 = eng.cache.stats(), eng.cache.l3_stats()
    for tier in ("device", "host", "l3"):
        assert got[key("hicache_hit_tokens_total", tier=tier)] == stats[f"{tier}_hit_tokens"]
    assert sum(got[key("hicache_hit_tokens_total", tier=t)] for t in ("device", "host", "l3")) == stats["hit_tokens"] > 0
    assert got[key("hicache_device_pages_used")] == stats["device_pages_used"]
    assert got[key("hicache_device_pages_capacity")] == stats["device_pages_total"]
    assert got[key("hicache_loaded_pages_total")] == stats["loaded_pages"]
    assert got[key("hicache_l3_breaker_state", state="closed")] == 1.0
    assert got[key("hicache_l3_breaker_state", state="open")] == 0.0
    puts = l3["io"]["put"]["latency_seconds"]["count"]
    assert puts > 0 and got[key("hicache_l3_latency_seconds_count", op="put")] == puts
    assert got[key("hicache_l3_latency_seconds_bucket", op="put", le="+Inf")] == puts
    assert got[key("hicache_l3_bandwidth_bytes_per_second_count", op="put")] == \
        l3["io"]["put"]["bandwidth_bytes_per_second"]["count"]
    # every series carries the constant labels; every family is documented
    assert all(dict(lbl).keys() >= LABELS.keys() for _, lbl in got)
    families = {f.name for f in text_string_to_metric_families(exp.text())}
    missing = sorted(n for n in families if f"`{n}`" not in DOC)
    assert not missing, f"undocumented metrics: {missing}"
    exp.update()   # idempotent: a second copy of the same stats changes nothing
    assert samples(exp.text()) == got
    eng.cache.close()


def test_faults_by_type_and_the_open_breaker(tmp_path):
    from hicache.cache.metrics import PrometheusExporter
    from tests.redis_server import free_port

    cache = make_cache(storage=f"redis://127.0.0.1:{free_port()}/0?connect_timeout=0.1&timeout=0.1")
    eng = Engine(cache)
    exp = PrometheusExporter(cache, labels=LABELS)
    for i in range(4):
        eng.run(toks(10 + i, 3, extra=1))
    cache.drain(10)
    exp.update()
    got = samples(exp.text())
    l3 = cache.l3_stats()
    assert got[key("hicache_l3_faults_total", type="connection")] == l3["faults"]["connection"] > 0
    assert not any(n == "hicache_l3_faults_total" and "." in dict(lb)["type"] for n, lb in got)
    assert got[key("hicache_l3_breaker_trips_total")] == l3["breaker"]["trips"] >= 1
    assert sum(got[key("hicache_l3_breaker_state", state=s)] for s in ("closed", "half_open", "open")) == 1
    path = tmp_path / "m.prom"
    exp.write(path)
    assert samples(path.read_text()) == got
    cache.close()


def test_one_exporter_per_registry_and_label_names_are_checked():
    from hicache.cache.metrics import PrometheusExporter

    cache = make_cache()
    registry = prom.CollectorRegistry()
    PrometheusExporter(cache, registry=registry, labels=LABELS)
    with pytest.raises(ConfigError, match="registry"):
        PrometheusExporter(cache, registry=registry, labels=LABELS)
    PrometheusExporter(cache, registry=registry, prefix="hicache_b")   # another prefix is fine
    for bad in ({"tier": "x"}, {"1st": "x"}, {"__x": "y"}):
        with pytest.raises(ConfigError, match="metrics.labels"):
            PrometheusExporter(cache, labels=bad)
    cache.close()


@pytest.mark.redis
def test_replay_with_redis_writes_labelled_metrics(tmp_path, capsys):
    """The documented command: ``hicache replay --storage redis://... --metrics-out FILE``."""
    from hicache.cli.main import main
    from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

    if REDIS_SERVER is None:
        pytest.skip(SKIP_REASON)
    server = RedisServer()
    out = tmp_path / "replay.prom"
    try:
        # write_back with a host tier larger than the device: pages leave both upper tiers
        # and come back from Redis (wait_complete: admission waits for the prefetch; split: the
        # page counts are the host pool, not the bytes of an arena).
        rc = main(["replay", "--config", "deepseek-v4-flash", "--conversations", "6", "--write-policy",
                   "write_back", "--budget", "split", "--device-pages", "16", "--host-pages", "20", "--prefetch-policy", "wait_complete",
                   "--storage", server.url, "--quiet", "--json", "--metrics-out", str(out)])
    finally:
        server.close()
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = __import__("json").loads(captured.out)
    assert rc == 0 and summary["l3_hit_tokens"] > 0
    text = out.read_text()
    got = samples(text)
    lab = {"model_name": "deepseek-v4-flash", "rank": "0"}

    def k(name, **extra):
        return name, tuple(sorted({**lab, **extra}.items()))

    assert got[k("hicache_hit_tokens_total", tier="l3")] == summary["l3_hit_tokens"]
    assert got[k("hicache_hit_tokens_total", tier="device")] == summary["device_hit_tokens"]
    assert got[k("hicache_l3_latency_seconds_count", op="get")] > 0
    assert got[k("hicache_l3_bandwidth_bytes_per_second_count", op="get")] > 0
    assert got[k("hicache_l3_latency_seconds_count", op="put")] > 0
    assert got[k("hicache_l3_breaker_state", state="closed")] == 1.0
    for name in ("hicache_l3_faults_total", "hicache_l3_rejected_total"):
        # declared even when nothing failed (an empty family), so dashboards find the name
        assert re.search(rf"^# TYPE {name.removesuffix('_total')}(_total)? counter$", text, re.M), name
