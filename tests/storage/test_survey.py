"""Operator views of a store (stats per namespace, a checked sample, purge) and the get/put
latency and bandwidth histograms the store keeps."""

from __future__ import annotations

import numpy as np
import pytest

from hicache.errors import ConfigError
from hicache.storage import L3Store, open_backend
from hicache.storage.iostats import BANDWIDTH_BUCKETS_BPS, LATENCY_BUCKETS_S, Histogram
from hicache.storage.survey import purge, survey, verify

from .conftest import page_hashes, rows

FP = "feedc0ffee"


def _fill(backend, salt: str, pages: int, states: int, nbytes: int = 2000) -> L3Store:
    s = L3Store(backend, FP, salt)
    hs = page_hashes(pages, seed=salt)
    assert all(s.put(hs, "page", list(rows(pages, nbytes))))
    assert all(s.put(hs[:states], "state", list(rows(states, 300))))
    return s


def test_survey_counts_each_namespace_and_layout():
    b = open_backend("memory://")
    a, c = _fill(b, "a", 6, 2), _fill(b, "c", 3, 0)
    b.put(["hc1.junk", "unrelated"], [b"x", b"y"])
    got = survey(b, batch=4)
    assert [(n.namespace, n.pages, n.states, n.bytes) for n in got.namespaces] == sorted([
        (a.namespace, 6, 2, 6 * 2064 + 2 * 364), (c.namespace, 3, 0, 3 * 2064)])
    assert got.unparsed_keys == 1 and got.scanned_keys == 12   # "unrelated" is outside hc1.
    assert got.layouts() == [{"fingerprint": FP, "namespaces": 2, "objects": 11,
                              "bytes": 9 * 2064 + 2 * 364}]
    only = survey(b, a.namespace)
    assert [n.namespace for n in only.namespaces] == [a.namespace] and only.scanned_keys == 8
    with pytest.raises(ConfigError, match="--namespace"):
        survey(b, "hc1.bad")


def test_verify_finds_each_kind_of_damage_and_purge_removes_one_namespace():
    b = open_backend("memory://")
    a, c = _fill(b, "a", 8, 2), _fill(b, "c", 4, 0)
    assert verify(b, sample=1000).verdicts == {"ok": 14}
    ka = [a.key(h, "page") for h in page_hashes(8, seed="a")]
    blobs = [bytearray(2064) for _ in range(2)]
    b.get_into(ka[:2], blobs)
    flipped = bytearray(blobs[0])
    flipped[500] ^= 1                                       # payload bit flip
    # ka[1] cut short; ka[2] holds ka[0]'s (intact) value: another key's object
    b.put(ka[:3], [bytes(flipped), bytes(blobs[1][:1000]), bytes(blobs[0])])
    report = verify(b, a.namespace, sample=1000)
    assert report.verdicts == {"corrupt": 1, "foreign": 1, "ok": 7, "truncated": 1}
    assert sorted(report.failures) == sorted([(ka[0], "corrupt"), (ka[1], "truncated"), (ka[2], "foreign")])
    assert not report.ok and report.sampled == 10
    sampled = verify(b, sample=3, seed=5)
    assert sampled.sampled == 3 and sampled.scanned_keys == 14
    assert purge(b, a.namespace, batch=3) == 10
    assert [n.namespace for n in survey(b).namespaces] == [c.namespace]
    assert verify(b, sample=100).verdicts == {"ok": 4}


def test_histograms_count_each_get_and_put_that_reached_the_backend():
    h = Histogram((1.0, 2.0))
    for v in (0.5, 1.0, 1.5, 3.0):
        h.observe(v)
    assert h.snapshot() == {"buckets": [[1.0, 2], [2.0, 3], ["+Inf", 4]], "sum": 6.0, "count": 4}
    s = L3Store(open_backend("memory://"), FP, "io")
    hs, src = page_hashes(5), rows(5, 4096)
    s.put(hs, "page", list(src))
    s.put(hs[:2], "page", list(src[:2]))
    out = np.zeros_like(src)
    assert s.get(hs, "page", list(out)).hits == 5
    assert s.get(page_hashes(2, seed="absent"), "page", list(out[:2])).hits == 0
    io = s.stats().io
    assert io["put"]["latency_seconds"]["count"] == 2
    assert io["get"]["latency_seconds"]["count"] == 2
    assert io["get"]["bandwidth_bytes_per_second"]["count"] == 1   # the miss moved no bytes
    assert io["put"]["bandwidth_bytes_per_second"]["count"] == 2
    assert [b[0] for b in io["get"]["latency_seconds"]["buckets"]] == [*LATENCY_BUCKETS_S, "+Inf"]
    assert [b[0] for b in io["get"]["bandwidth_bytes_per_second"]["buckets"]] == [*BANDWIDTH_BUCKETS_BPS, "+Inf"]
    assert s.stats().to_dict()["io"] == s.stats().io


@pytest.mark.redis
def test_histograms_skip_calls_refused_by_an_open_breaker(redis_server):
    s = L3Store(open_backend(redis_server.url + "?timeout=0.2&connect_timeout=0.2"), FP, "breaker")
    redis_server.kill()
    hs, src = page_hashes(2), rows(2, 100)
    for _ in range(s.cfg.breaker_threshold + 3):
        s.put(hs, "page", list(src))
    st = s.stats(backend=False)
    assert st.breaker_state == "open"
    # Only the calls that reached the (dead) server were timed; refused ones are not latency.
    assert st.io["put"]["latency_seconds"]["count"] == s.cfg.breaker_threshold
    assert st.io["put"]["bandwidth_bytes_per_second"]["count"] == 0
    s.close()
