"""Least-privilege Redis: a user holding exactly ``acl_rule(role)`` passes a representative
set of the L3 tests (store, cache with prefetch, operator tools) on one server and on a
cluster; a user without the rule fails with one clear line, never a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hicache.cli.main import main
from hicache.storage import L3Store, open_backend
from hicache.storage.acl import acl_rule
from tests.cache.conftest import Engine, make_cache, toks
from tests.redis_server import REDIS_SERVER, SKIP_REASON, RedisCluster, RedisServer
from tests.storage.conftest import page_hashes, rows

pytestmark = [pytest.mark.redis, pytest.mark.skipif(REDIS_SERVER is None, reason=SKIP_REASON)]


@pytest.fixture(scope="module", params=["single", "cluster"])
def acl_store(request):
    """A server (or cluster) with users ``engine`` and ``operator`` holding exactly their
    rule, and ``weak`` (GET only) and ``elsewhere`` (the engine's commands on other keys)."""
    cluster = request.param == "cluster"
    target = RedisCluster(3) if cluster else RedisServer()
    nodes = target.nodes if cluster else [target]
    users = {"engine": acl_rule("engine", cluster=cluster), "operator": acl_rule("operator", cluster=cluster),
             "weak": "~hc1.* -@all +get" + (" +cluster|slots +command" if cluster else ""),
             "elsewhere": acl_rule("engine", cluster=cluster).replace("~hc1.*", "~other.*")}
    for node in nodes:
        for user, rule in users.items():
            assert node.cli("ACL", "SETUSER", user, "on", f">pw-{user}", *rule.split()) == "OK", rule
    base = target.url

    def url(user: str) -> str:
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{user}:pw-{user}@{rest}"

    yield url
    target.close()


def test_the_engine_rule_is_enough_for_the_store(acl_store):
    store = L3Store(open_backend(acl_store("engine")), "aclfp", "s1")
    hs, src = page_hashes(20, "acl"), rows(20, 8192)
    assert store.put(hs, "page", list(src)) == [True] * 20
    assert store.lookup(hs, "page") == 20 and store.exists(hs[:3], "state") == [False] * 3
    dst = np.zeros_like(src)
    assert store.get(hs, "page", list(dst)).hits == 20 and np.array_equal(dst, src)
    tickets = [store.put_async(page_hashes(4, "acl-async"), "page", list(src[:4]))]
    assert store.flush(10) and all(t.ok for t in tickets)
    assert store.delete(hs[:5], "page") == 5
    st = store.stats()
    assert not st.faults and st.backend is not None and st.breaker_state == "closed"
    store.close()


def test_the_engine_rule_is_enough_for_the_cache(acl_store):
    eng = Engine(make_cache(storage=acl_store("engine"), device_pages=4, host_pages=10, device_snaps=2,
                            host_snaps=4, salt="acl-cache"))
    a = toks(1, 2, 3, extra=1)
    eng.run(a)
    eng.cache.drain()
    for v in range(50, 62):
        eng.run(toks(v, v + 100, extra=1))
    eng.cache.drain()
    assert eng.cache.finish_prefetch(eng.cache.prefetch(eng.cache.match(a))) == 12
    _, lease = eng.start(a)
    assert lease.l3_tokens == 12
    eng.cache.release(lease)
    assert eng.cache.stats()["l3_errors"] == 0
    eng.cache.check_integrity()
    eng.cache.close()


def test_the_operator_rule_is_enough_for_the_l3_tools(acl_store, capsys):
    writer = L3Store(open_backend(acl_store("engine")), "aclops", "s2")
    writer.put(page_hashes(6, "ops"), "page", list(rows(6, 512)))
    ns = writer.namespace
    writer.close()
    url = acl_store("operator")
    assert main(["l3", "stats", "--url", url, "--namespace", ns, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["objects"] == 6
    assert main(["l3", "scan", "--url", url, "--namespace", ns, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["verdicts"] == {"ok": 6}
    assert main(["l3", "purge", "--url", url, "--namespace", ns, "--yes", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == 6


@pytest.mark.parametrize("user", ["weak", "elsewhere"])
def test_without_the_rule_the_tools_fail_with_one_line(acl_store, capsys, user):
    for op in ("stats", "scan"):
        assert main(["l3", op, "--url", acl_store(user), "--quiet"]) == 2
        out, err = capsys.readouterr()
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "no permissions" in err and f"pw-{user}" not in err


@pytest.mark.parametrize("user", ["weak", "elsewhere"])
def test_without_the_rule_the_engine_misses_and_says_why_in_one_line(acl_store, user):
    store = L3Store(open_backend(acl_store(user)), "aclfp", "s3")
    hs = page_hashes(2, "acl-denied")
    assert store.put(hs, "page", list(rows(2, 512))) == [False, False]      # a refusal, not an exception
    st = store.stats(backend=False)
    assert st.faults and st.extra["last_fault"].count("\n") == 0
    assert "no permissions" in st.extra["last_fault"] and f"pw-{user}" not in st.extra["last_fault"]
    store.close()
