"""Per-request isolation: a salt (tenant) is mixed into the root of every page hash chain,
so tenants share no page or snapshot on the device, the host or L3, and a lookup of another
tenant's prefix is a miss; requests without a salt share exactly as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from hicache.errors import MisuseError
from hicache.tree import ROOT_HASH, chain_hashes, tenant_root_hash
from tests.cache.conftest import Engine, make_cache, mha_layout, toks
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisServer

ROOT = Path(__file__).resolve().parents[2]


class Tenant(Engine):
    """The test engine, every request of it carrying ``salt``; its bytes are derived from
    its own (salted) page hashes, so reading another tenant's pages fails the byte check."""

    def __init__(self, cache, salt):
        super().__init__(cache)
        self.salt = salt

    def hashes(self, tokens):
        return self.cache.page_hashes(tokens, salt=self.salt)

    def start(self, tokens):
        m = self.cache.match(tokens, salt=self.salt)
        lease = self.cache.load(m)
        assert lease.wait(), "load failed"
        self.verify(lease, tokens)
        return m, lease

    def match(self, tokens):
        return self.cache.match(tokens, salt=self.salt)


def hit_counts(cache):
    c = cache.counters
    return c.hit_tokens, c.device_hit_tokens, c.host_hit_tokens, c.l3_hit_tokens


def push_out(eng, start=50, n=12):
    """Unsalted traffic that pushes everything else out of the device and host tiers."""
    for v in range(start, start + n):
        eng.run(toks(v, v + 100, extra=1))
    eng.cache.drain()


def test_without_a_salt_hashes_and_sharing_are_unchanged():
    eng = Engine(make_cache())
    a = toks(1, 2, 3, extra=1)
    assert eng.cache.page_hashes(a) == chain_hashes(eng.cache.hash_seed, ROOT_HASH, a, 4)
    assert eng.cache.page_hashes(a, salt="") == eng.cache.page_hashes(a, salt=None) == eng.cache.page_hashes(a)
    eng.run(a)
    assert eng.cache.match(a, salt="").resume_tokens == 12    # "" is no salt, as vLLM's cache_salt
    _, lease = eng.start(a)
    assert lease.resume_tokens == 12
    eng.cache.release(lease)
    assert not eng.cache._tree._roots                          # no tenant root was made
    eng.cache.check_integrity()
    eng.cache.close()


def test_two_tenants_with_the_same_prompt_share_nothing_on_the_device():
    cache = make_cache()
    alice, bob = Tenant(cache, "alice"), Tenant(cache, b"bob")
    a = toks(1, 2, 3, extra=1)
    alice.run(a)
    assert set(alice.hashes(a)).isdisjoint(bob.hashes(a))
    assert set(alice.hashes(a)).isdisjoint(Engine(cache).hashes(a))
    m = bob.match(a)
    assert (m.resume_tokens, m.history_tokens) == (0, 0)
    assert Engine(cache).cache.match(a).resume_tokens == 0      # nor an unsalted request
    before = hit_counts(cache)
    bob.run(a)                                                  # computes its own copy
    assert hit_counts(cache) == before
    _, lease = alice.start(a)                                   # each tenant hits its own bytes
    assert lease.resume_tokens == 12
    cache.release(lease)
    _, lease = bob.start(a)
    assert lease.resume_tokens == 12
    cache.release(lease)
    assert cache.num_nodes == 2
    cache.check_integrity()
    cache.close()


def test_host_copies_are_per_tenant():
    cache = make_cache(device_pages=4, host_pages=32, device_snaps=2, host_snaps=16)
    alice, bob = Tenant(cache, "alice"), Tenant(cache, "bob")
    a = toks(1, 2, 3, extra=1)
    alice.run(a)
    for v in range(20, 24):                                    # device victims keep their host copy
        Engine(cache).run(toks(v, extra=1))
    m = alice.match(a)
    assert m.host_tokens == 12 and m.device_tokens == 0
    m = bob.match(a)
    assert (m.resume_tokens, m.host_tokens, m.history_tokens) == (0, 0, 0)
    before = hit_counts(cache)
    _, lease = bob.start(a)
    assert lease.resume_tokens == 0 and hit_counts(cache) == before
    cache.release(lease)
    _, lease = alice.start(a)                                  # loads alice's host copy
    assert lease.loaded_tokens == 12
    cache.release(lease)
    cache.check_integrity()
    cache.close()


def test_l3_objects_are_per_tenant_pages_and_snapshots():
    cache = make_cache(device_pages=4, host_pages=10, device_snaps=2, host_snaps=4)
    alice, bob = Tenant(cache, "alice"), Tenant(cache, "bob")
    a = toks(1, 2, 3, extra=1)
    alice.run(a)
    cache.drain()
    push_out(Engine(cache))
    assert not cache._tree._roots                              # alice's root left with her pages
    m = bob.match(a)
    assert m.resume_tokens == 0 and len(m.l3_hashes) == 3
    assert set(m.l3_hashes).isdisjoint(alice.hashes(a))        # page and snapshot keys differ
    before = cache.l3_stats()["counters"].get("lookup_hits", 0)
    assert cache.finish_prefetch(cache.prefetch(m)) == 0      # bob finds nothing of alice's in L3
    assert cache.l3_stats()["counters"].get("lookup_hits", 0) == before
    assert cache.finish_prefetch(cache.prefetch(Engine(cache).cache.match(a))) == 0   # nor does anyone unsalted
    assert not cache._tree._roots
    m = alice.match(a)
    assert cache.finish_prefetch(cache.prefetch(m)) == 12      # alice does
    _, lease = alice.start(a)                                  # and reads her own bytes back
    assert lease.l3_tokens == 12
    cache.release(lease)
    assert cache.counters.l3_hit_tokens == 12
    cache.check_integrity()
    cache.close()


def test_a_lookup_of_another_tenants_prefix_is_a_plain_miss():
    cache = make_cache(mha_layout())
    alice = Tenant(cache, "alice")
    a = toks(1, 2, 3, extra=1)
    alice.run(a)
    other = cache.match(toks(7, 8, 9, extra=1), salt="mallory")
    probe = cache.match(a, salt="mallory")
    assert (probe.resume_tokens, probe.history_tokens, len(probe.l3_hashes)) == \
        (other.resume_tokens, other.history_tokens, len(other.l3_hashes)) == (0, 0, 3)
    assert cache.expect(a, salt="mallory") == 0
    assert len(cache._tree._roots) == 1                        # a lookup never adds a tenant root
    assert cache.expect(a, salt="alice") == 12
    cache.check_integrity()
    cache.close()


def test_tenant_roots_go_when_nothing_holds_them():
    cache = make_cache(device_pages=4, host_pages=6, device_snaps=2, host_snaps=3, storage="none://")
    bob = Tenant(cache, "bob")
    m = bob.match(toks(1, extra=1))
    lease = cache.load(m)                                      # resumes at bob's (new) root
    assert len(cache._tree._roots) == 1
    cache.release(lease)                                       # nothing published: the root goes
    assert not cache._tree._roots
    bob.run(toks(1, 2, extra=1))
    assert len(cache._tree._roots) == 1
    push_out(Engine(cache), n=6)                               # bob's pages are evicted
    assert not cache._tree._roots
    cache.check_integrity()
    cache.close()


def test_a_salt_of_another_type_is_misuse():
    cache = make_cache(mha_layout(), storage="none://")
    with pytest.raises(MisuseError, match="salt"):
        cache.match(toks(1, extra=1), salt=3)
    cache.close()


def test_adaptive_ghosts_see_tenants_apart():
    cache = make_cache(eviction="adaptive")
    alice, bob = Tenant(cache, "alice"), Tenant(cache, "bob")
    a = toks(1, 2, 3, extra=1)
    alice.run(a)
    bob.run(a)
    keys = cache._policy._keys
    h = tenant_root_hash(cache.hash_seed, "alice")
    assert keys.of(a, 3, h) != keys.of(a, 3, tenant_root_hash(cache.hash_seed, "bob")) != keys.of(a, 3)
    cache.check_integrity()
    cache.close()


@pytest.mark.redis
@pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)
def test_two_processes_on_one_redis_share_only_within_a_tenant():
    server = RedisServer()
    try:
        writer = textwrap.dedent(f"""
            from tests.cache.conftest import make_cache, toks
            from tests.cache.test_tenants import Tenant
            eng = Tenant(make_cache(storage={server.url!r}), "alice")
            eng.run(toks(1, 2, 3, extra=1))
            eng.cache.drain()
            eng.cache.close()
        """)
        subprocess.run([sys.executable, "-c", writer], cwd=ROOT, check=True, env={"PYTHONHASHSEED": "5", "PATH": ""})
        cache = make_cache(storage=server.url)
        a = toks(1, 2, 3, extra=1)
        for salt in ("bob", None):
            m = cache.match(a, salt=salt)
            assert cache.finish_prefetch(cache.prefetch(m)) == 0, salt
        alice = Tenant(cache, "alice")
        assert cache.finish_prefetch(cache.prefetch(alice.match(a))) == 12
        _, lease = alice.start(a)                               # the other process's bytes, verified
        assert lease.l3_tokens == 12
        cache.release(lease)
        assert cache.counters.l3_hit_tokens == 12
        assert np.asarray(cache.l3_stats()["rejected"].get("foreign", 0)) == 0
        cache.check_integrity()
        cache.close()
    finally:
        server.close()
