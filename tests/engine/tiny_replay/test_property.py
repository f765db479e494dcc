"""Random workloads, schedules and pool sizes: every resume exact, the cache consistent."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.engine.tiny_serving import tiny_workload
from tests.engine.tiny_replay.conftest import assert_exact, serve, small_cache

# At most 1 + 3 * 64 + 63 = 256 tokens: 16 pages, so 17 device pages always hold one request.
SHAPE = dict(turns=(1, 3), user_len=(4, 30), output_len=(4, 30))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), conversations=st.integers(1, 3), max_running=st.integers(1, 3),
       chunk_pages=st.integers(1, 3), decode_tokens=st.integers(1, 5),
       retention=st.sampled_from([None, 0, 32]), device_pages=st.integers(17, 32),
       host_pages=st.integers(8, 40), snapshots=st.integers(2, 6),
       sync_copies=st.booleans(), prefetch=st.booleans())
def test_any_schedule_is_exact(seed, conversations, max_running, chunk_pages, decode_tokens, retention,
                               device_pages, host_pages, snapshots, sync_copies, prefetch):
    reqs = tiny_workload(conversations, seed, arrival_rate=0.5, think_time_s=5.0, **SHAPE)
    cache = small_cache(device_pages=device_pages, device_snapshots=snapshots, host_pages=host_pages,
                        host_snapshots=2 * snapshots, retention=retention)
    report = serve(cache, reqs, max_running=max_running, chunk_pages=chunk_pages,
                   decode_tokens=decode_tokens, sync_copies=sync_copies, prefetch=prefetch)
    computed = sum(r.prompt_len + r.output_len for r in reqs) - sum(r.hit_tokens for r in report.records)
    assert_exact(report, checked=computed)
    assert len(report.records) == len(reqs)
    cache.close()
