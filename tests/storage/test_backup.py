"""The asynchronous backup queue: never blocks, bounded, drops and counts, completes tickets."""

from __future__ import annotations

import numpy as np

from hicache.storage import L3Config, L3Store, open_backend

from .conftest import page_hashes, rows
from .gated import GatedBackend

FP = "0123456789abcdef"


def test_put_async_completes_and_polls_once():
    s = L3Store(open_backend("memory://"), FP, "", L3Config(backup_batch=2))
    hs = page_hashes(5)
    src = rows(5, 1000)
    done = []
    t = s.put_async(hs, "page", list(src), tag="rows 0-4", on_done=done.append)
    assert t.wait(10) and t.ok and t.stored == [True] * 5 and not t.dropped
    assert s.flush(10)
    assert done == [t]
    assert s.poll_backups() == [t] and s.poll_backups() == []
    assert t.tag == "rows 0-4"
    dst = np.zeros_like(src)
    assert s.get(hs, "page", list(dst)).hits == 5 and np.array_equal(dst, src)
    # a second backup of the same pages is skipped (already in L3), still ok
    t2 = s.put_async(hs, "page", list(src))
    assert t2.wait(10) and t2.ok and t2.skipped_existing == 5
    c = s.stats().counters
    assert (c["backup_queued"], c["backup_stored"], c["backup_skipped_existing"], c["backup_dropped"]) == (10, 5, 5, 0)
    s.close()


def test_backpressure_drops_and_never_blocks():
    g = GatedBackend(open_backend("memory://"), gate_ops=("put",))
    s = L3Store(g, FP, "", L3Config(backup_queue_objects=4, backup_queue_bytes=1 << 30,
                                    backup_skip_existing=False))
    hs = page_hashes(10)
    src = rows(10, 1 << 16)
    g.gate.clear()                                   # the store hangs on every put
    first = s.put_async(hs[:3], "page", list(src[:3]))
    assert g.entered.acquire(timeout=10)             # the worker is stuck inside put
    # The gate opens only after these calls return: a submit that waited for the worker
    # would hang here until the worker's gate assertion gave up.
    second = s.put_async(hs[3:4], "page", [src[3]])  # 3 + 1 = 4 objects: fits
    third = s.put_async(hs[4:6], "page", list(src[4:6]))  # 6 > 4: dropped
    assert third.dropped and third.done and third.stored == [False, False] and not third.ok
    assert not first.done and not second.done
    st = s.stats(backend=False)
    assert (st.backup_pending_objects, st.backup_pending_bytes) == (4, 4 << 16)
    assert st.counters["backup_dropped"] == 1 and st.counters["backup_dropped_objects"] == 2
    g.gate.set()
    assert s.flush(10)
    assert first.ok and second.ok
    assert s.poll_backups() == [first, second]       # the dropped ticket never shows up here
    assert s.stats(backend=False).backup_pending_objects == 0


def test_byte_bound_and_close_drops_leftovers():
    g = GatedBackend(open_backend("memory://"), gate_ops=("put",))
    s = L3Store(g, FP, "", L3Config(backup_queue_objects=100, backup_queue_bytes=3000,
                                    backup_skip_existing=False))
    hs = page_hashes(4)
    g.gate.clear()
    a = s.put_async(hs[:1], "page", [bytes(1000)])
    assert g.entered.acquire(timeout=10)
    b = s.put_async(hs[1:2], "page", [bytes(1000)])
    c = s.put_async(hs[2:4], "page", [bytes(1000), bytes(1000)])  # 4000 B pending > 3000: dropped
    assert c.dropped and not b.done
    g.gate.set()
    s.close(timeout=10)
    assert a.ok and b.ok


def test_close_with_a_dead_worker_path_finishes_every_ticket():
    g = GatedBackend(open_backend("memory://"), gate_ops=("put",))
    s = L3Store(g, FP, "", L3Config(backup_skip_existing=False))
    hs = page_hashes(3)
    g.gate.clear()
    a = s.put_async(hs[:1], "page", [bytes(10)])
    assert g.entered.acquire(timeout=10)
    b = s.put_async(hs[1:2], "page", [bytes(10)])
    s.backup.close(timeout=0.2)          # a is stuck in put; b is still queued -> dropped
    assert b.done and b.dropped
    g.gate.set()
    assert a.wait(10) and a.ok
    assert {id(t) for t in s.poll_backups()} == {id(a), id(b)}


def test_breaker_open_backups_fail_fast():
    s = L3Store(open_backend("redis://127.0.0.1:1/0?connect_timeout=0.2"), FP, "",
                L3Config(breaker_threshold=1, breaker_cooldown_s=60, breaker_max_cooldown_s=60))
    hs = page_hashes(3)
    tickets = [s.put_async(hs[i:i + 1], "page", [bytes(100)]) for i in range(3)]
    assert s.flush(10)
    assert all(t.done and not t.ok and not t.dropped for t in tickets)
    st = s.stats(backend=False)
    assert st.breaker_state == "open" and st.counters["backup_failed"] == 3
    assert st.faults["connection"] == 1  # one connect attempt; the rest were refused at once


def test_a_rejected_value_is_rewritten_even_when_its_delete_failed():
    """Issue 11 item 5: backups skip keys that exist -- but never one a read rejected."""
    from hicache.errors import StorageError

    from .gated import ForwardingBackend

    class NoDelete(ForwardingBackend):
        def delete(self, keys):
            raise StorageError("delete refused")

    s = L3Store(NoDelete(open_backend("memory://")), FP, "")
    hs = page_hashes(3)
    src = rows(3, 1000, seed=2)
    assert s.put_async(hs, "page", list(src)).wait(10)
    key = s.key(hs[1], "page")
    buf = bytearray(1 << 16)
    n = s.backend.get_into([key], [buf])[0]
    bad = bytearray(buf[:n])
    bad[-1] ^= 0xFF
    s.backend.inner.put([key], [bytes(bad)])                 # corrupt page 1
    dst = np.zeros_like(src)
    assert s.get(hs, "page", list(dst)).stopped == "corrupt"
    assert s.lookup(hs) == 3                                 # the delete failed: still there
    t = s.put_async(hs, "page", list(src))                   # skip-existing must not skip it
    assert t.wait(10) and t.ok and t.skipped_existing == 2
    r = s.get(hs, "page", list(dst))
    assert r.hits == 3 and np.array_equal(dst, src)
    assert s.must_overwrite(hs, "page") == [False] * 3       # rewritten: no longer suspect
    s.close()
