"""The paged cache over hicache's device pools: resume, siblings, multi-turn, seams."""

from __future__ import annotations

import pytest
import torch

from hicache.engine.tiny_model import (PagedSequenceCache, TinyV4Config, compare_logits,
                                       layout_for, reference_logits)
from hicache.errors import MisuseError
from hicache.pools import NoRoom, TierPools
from tests.engine.tiny_model.support import (CONFIGS, Published, device_pools, model_for,
                                             run_publishing, tokens)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("chunks", [None, 1, 7, 16])
def test_paged_run_equals_reference(name, chunks):
    cfg = CONFIGS[name]
    model, pools = model_for(cfg), device_pools(cfg)
    toks = tokens(cfg, 90, seed=10)
    cache = PagedSequenceCache(cfg, pools)
    assert cache.reserve(90).ok
    assert len(cache.page_table) == -(-90 // cfg.page_tokens)
    got = model.run(toks, cache, chunks=chunks)
    assert compare_logits(got, reference_logits(model, toks)).exact
    cache.release()
    assert pools.num_used("page") == 0
    pools.check_integrity()


def test_pages_and_snapshots_are_a_function_of_the_prefix():
    """Two requests sharing 48 tokens, chunked differently, with different suffixes:
    their first three pages and their snapshots at 48 are byte-identical."""
    cfg = TinyV4Config()
    model, pools = model_for(cfg), device_pools(cfg)
    a_toks = tokens(cfg, 80, seed=11)
    b_toks = torch.cat([a_toks[:48], tokens(cfg, 30, seed=12)])
    _, a, pa = run_publishing(model, pools, a_toks, chunks=5)
    _, b, pb = run_publishing(model, pools, b_toks, chunks=[48, 1, 29])
    for fam in layout_for(cfg).history_families:
        view = pools.view(fam.name)
        for k in range(3):
            assert torch.equal(view[:, pa.pages[k]], view[:, pb.pages[k]]), (fam.name, k)
        assert not torch.equal(view[:, a.page_table[3]], view[:, b.page_table[3]]), fam.name
    for fam in layout_for(cfg).state_families:
        view = pools.view(fam.name)
        assert torch.equal(view[:, pa.snapshots[48]], view[:, pb.snapshots[48]]), fam.name
        if fam.rows_kept:
            assert not torch.equal(view[:, pa.snapshots[64]], view[:, pb.snapshots[64]])
    pools.check_integrity()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_resume_at_every_boundary_from_another_requests_pages(name):
    cfg = CONFIGS[name]
    model, pools = model_for(cfg), device_pools(cfg, pages=256, snapshots=64)
    p = cfg.page_tokens
    prompt = tokens(cfg, 6 * p + 3, seed=13)
    _, owner, pub = run_publishing(model, pools, prompt, chunks=p + 1)
    for b in range(p, len(prompt) + 1, p):
        # A different request: same first b tokens, its own continuation.
        mine = torch.cat([prompt[:b], tokens(cfg, 2 * p + 5, seed=100 + b)])
        cache = PagedSequenceCache.resume(cfg, pools, pub.pages[: b // p], pub.snapshots[b], b)
        assert cache.length == b and cache.owned == []
        assert cache.reserve(len(mine)).ok
        got = model.run(mine[b:], cache, chunks=[1, 4, len(mine) - b - 5])
        check = compare_logits(got, reference_logits(model, mine)[b:])
        assert check.exact and check.checked_tokens == len(mine) - b, (b, check)
        cache.release()
    owner.release()
    pools.check_integrity()


def test_concurrent_siblings_share_a_prefix_published_mid_prefill():
    """A publishes pages and snapshots during its chunked prefill; B joins at 48 and C at
    96 while A is still running; the three advance in lock-step, each exact."""
    cfg = TinyV4Config()
    model, pools = model_for(cfg), device_pools(cfg)
    shared = tokens(cfg, 100, seed=14)
    reqs = {
        "A": torch.cat([shared, tokens(cfg, 60, seed=15)]),
        "B": torch.cat([shared[:57], tokens(cfg, 70, seed=16)]),   # diverges inside page 3
        "C": torch.cat([shared, tokens(cfg, 40, seed=17)]),
    }
    want = {k: reference_logits(model, v) for k, v in reqs.items()}
    a = PagedSequenceCache(cfg, pools)
    assert a.reserve(len(reqs["A"])).ok
    published: dict[int, int] = {}
    caches = {"A": a}
    got: dict[str, list[torch.Tensor]] = {"A": [], "B": [], "C": []}
    joins = {48: "B", 96: "C"}

    while any(caches[k].length < len(reqs[k]) for k in caches):
        for name, cache in list(caches.items()):
            toks = reqs[name]
            n = min(16, len(toks) - cache.length)
            if n == 0:
                continue
            got[name].append(model.forward(toks[cache.length:cache.length + n], cache.length, cache))
            if name == "A" and cache.length % 16 == 0:
                sid = int(pools.alloc("state", 1).ids[0])
                cache.save_snapshot(cache.length, sid)
                published[cache.length] = sid
                pages = cache.publish_pages(cache.length)
                joiner = joins.get(cache.length)
                if joiner:
                    sib = PagedSequenceCache.resume(cfg, pools, pages, sid, cache.length)
                    assert sib.reserve(len(reqs[joiner])).ok
                    caches[joiner] = sib
                    got[joiner].append(torch.zeros((0, cfg.vocab), dtype=torch.float64))

    for name, start in (("A", 0), ("B", 48), ("C", 96)):
        check = compare_logits(torch.cat(got[name]), want[name][start:])
        assert check.exact and check.checked_tokens == len(reqs[name]) - start, (name, check)
    # B and C never wrote into A's pages: they borrowed them.
    assert caches["B"].page_table[:3] == a.page_table[:3]
    assert set(caches["B"].owned).isdisjoint(a.page_table)
    for cache in caches.values():
        cache.release()
    pools.check_integrity()


def _greedy(model, cache, prompt: torch.Tensor, new_tokens: int, pools, pub) -> torch.Tensor:
    """Prefill ``prompt`` then decode greedily, publishing at page boundaries."""
    logits, _, _ = run_publishing(model, pools, prompt, chunks=13, cache=cache, published=pub)
    out = [int(logits[-1].argmax())]
    for _ in range(new_tokens - 1):
        step, _, _ = run_publishing(model, pools, torch.tensor(out[-1:]), cache=cache, published=pub)
        out.append(int(step[-1].argmax()))
    return torch.tensor(out)


def test_multi_turn_resumes_from_the_previous_turns_boundary():
    cfg = TinyV4Config()
    model, pools = model_for(cfg), device_pools(cfg, pages=128, snapshots=64)
    p = cfg.page_tokens
    # Turn 1: prompt 53, answer 20 -> 73 tokens; the last answer token was never fed, so
    # the request stood at 72 and its deepest published boundary is 64.
    pub1 = Published()
    c1 = PagedSequenceCache(cfg, pools)
    t1_prompt = tokens(cfg, 53, seed=18)
    answer1 = _greedy(model, c1, t1_prompt, 20, pools, pub1)
    history = torch.cat([t1_prompt, answer1])
    assert c1.length == 72
    b1 = c1.length // p * p
    assert b1 == 64 and max(pub1.snapshots) == 64

    # Turn 2: the whole conversation so far + a new user message, resumed at 64.
    t2_prompt = torch.cat([history, tokens(cfg, 30, seed=19)])
    c2 = PagedSequenceCache.resume(cfg, pools, pub1.pages[: b1 // p], pub1.snapshots[b1], b1)
    pub2 = Published(pages=list(pub1.pages[: b1 // p]))
    logits2, _, _ = run_publishing(model, pools, t2_prompt[b1:], chunks=11, cache=c2, published=pub2)
    assert compare_logits(logits2, reference_logits(model, t2_prompt)[b1:]).exact

    # Turn 3 resumes from a boundary that turn 2 (itself a resumed request) published.
    b2 = len(t2_prompt) // p * p
    t3 = torch.cat([t2_prompt, tokens(cfg, 25, seed=20)])
    c3 = PagedSequenceCache.resume(cfg, pools, pub2.pages[: b2 // p], pub2.snapshots[b2], b2)
    assert c3.reserve(len(t3)).ok
    got = model.run(t3[b2:], c3, chunks=1)
    check = compare_logits(got, reference_logits(model, t3)[b2:])
    assert check.exact and check.checked_tokens == len(t3) - b2
    pools.check_integrity()


def test_resume_after_device_pages_went_to_host_and_back():
    """The bytes are the whole story: copy pages + snapshot to a page_first host tier,
    scribble over and free the device copies, load them back into other device ids."""
    cfg = TinyV4Config()
    model, dev = model_for(cfg), device_pools(cfg)
    host = TierPools(layout_for(cfg), "host", num_pages=16, num_snapshots=4, host_layout="page_first")
    toks = tokens(cfg, 70, seed=21)
    _, a, pub = run_publishing(model, dev, toks[:64], chunks=10)
    pages, sid = pub.pages[:4], pub.snapshots[64]
    hp, hs = host.alloc("page", 4).ids, host.alloc("state", 1).ids
    lay = layout_for(cfg)
    for fam in lay.families:
        src = pages if fam.is_history else [sid]
        dst = hp if fam.is_history else hs
        host.view(fam.name)[:, dst] = dev.view(fam.name)[:, src]
    for fam in lay.families:
        dev.view(fam.name).fill_(0x7F)          # the old device rows are garbage now
    dev.free("page", pages)
    dev.free("state", list(pub.snapshots.values()))
    blocker = dev.alloc("page", 4)              # takes the old ids back: new ids differ
    new_pages, new_sid = dev.alloc("page", 4).ids, dev.alloc("state", 1).ids
    assert set(new_pages.tolist()) != set(pages)
    for fam in lay.families:
        dst = new_pages if fam.is_history else new_sid
        src = hp if fam.is_history else hs
        dev.view(fam.name)[:, dst] = host.view(fam.name)[:, src]
    cache = PagedSequenceCache.resume(cfg, dev, new_pages.tolist(), int(new_sid[0]), 64)
    assert cache.reserve(70).ok
    got = model.run(toks[64:], cache)
    assert compare_logits(got, reference_logits(model, toks)[64:]).exact
    cache.release()
    dev.free("page", blocker.ids)
    dev.free("page", new_pages)
    dev.free("state", new_sid)
    host.free("page", hp)
    host.free("state", hs)
    dev.check_integrity()
    host.check_integrity()


def test_reserve_publish_release_account_for_every_page():
    cfg = TinyV4Config()
    model, pools = model_for(cfg), device_pools(cfg, pages=6, snapshots=2)
    cache = PagedSequenceCache(cfg, pools)
    assert cache.reserve(40).ok and len(cache.owned) == 3
    assert cache.reserve(33).ids.numel() == 0          # already covered
    model.run(tokens(cfg, 40, seed=22), cache)
    handed = cache.publish_pages(32)
    assert handed == cache.page_table[:2] and cache.owned == cache.page_table[2:]
    assert isinstance(cache.reserve(16 * 10), NoRoom)  # 7 more pages than the pool has
    cache.release()
    assert pools.num_used("page") == 2                 # the published pages stay allocated
    pools.free("page", handed)
    pools.check_integrity()


def test_caller_allocated_pages_are_written_but_not_freed():
    cfg = TinyV4Config()
    model, pools = model_for(cfg), device_pools(cfg, pages=4, snapshots=1)
    ids = pools.alloc("page", 3).ids.tolist()
    cache = PagedSequenceCache(cfg, pools)
    cache.extend_pages(ids)
    toks = tokens(cfg, 45, seed=26)
    assert compare_logits(model.run(toks, cache, chunks=8), reference_logits(model, toks)).exact
    cache.release()
    assert pools.num_used("page") == 3
    pools.free("page", ids)
    pools.check_integrity()


def test_paged_misuse_is_reported():
    cfg = TinyV4Config()
    model, pools = model_for(cfg), device_pools(cfg, pages=8, snapshots=2)
    with pytest.raises(MisuseError, match="layout"):
        PagedSequenceCache(TinyV4Config(window=9), pools)
    with pytest.raises(MisuseError, match="id 3 is not allocated"):
        PagedSequenceCache(cfg, pools, page_table=[3])
    cache = PagedSequenceCache(cfg, pools)
    with pytest.raises(MisuseError, match="reserve pages first"):
        model.forward([1, 2], 0, cache)
    assert cache.reserve(40).ok
    model.run(tokens(cfg, 20, seed=23), cache)
    sid = int(pools.alloc("state", 1).ids[0])
    with pytest.raises(MisuseError, match="stands at 20"):
        cache.save_snapshot(16, sid)
    with pytest.raises(MisuseError, match="multiple of page_tokens"):
        cache.save_snapshot(20, sid)
    with pytest.raises(MisuseError, match="id 1 is not allocated"):
        cache.save_snapshot(16, 1)
    with pytest.raises(MisuseError, match="out of range"):
        cache.load_snapshot(99, 16)
    with pytest.raises(MisuseError, match="publish boundary"):
        cache.publish_pages(32)
    model.run(tokens(cfg, 12, seed=24), cache)
    cache.save_snapshot(32, sid)
    pages = cache.publish_pages(32)
    with pytest.raises(MisuseError, match="takes 2 pages"):
        PagedSequenceCache.resume(cfg, pools, pages[:1], sid, 32)
    short = PagedSequenceCache(cfg, pools, page_table=pages[:1])
    with pytest.raises(MisuseError, match="needs 2 history pages"):
        short.load_snapshot(sid, 32)
    with pytest.raises(MisuseError, match="given twice"):
        PagedSequenceCache(cfg, pools, page_table=pages).extend_pages(pages[:1])
    sib = PagedSequenceCache(cfg, pools, page_table=pages)
    with pytest.raises(MisuseError, match="borrowed page"):
        sib.write_history("c4_kv", 2, 0, torch.zeros((1, cfg.head_dim), dtype=torch.float64))
    with pytest.raises(MisuseError, match="no 'c4_kv' rows"):
        sib.read_history("c4_kv", 3, 1)
    cache.release()
    pools.free("page", pages)
    pools.free("state", [sid])
    pools.check_integrity()


def test_resume_from_pools_on_each_device(device):
    """Pools on the device (the GPU in the gpu half), model on the CPU: rows cross the
    device boundary unchanged and the resumed logits are exact."""
    cfg = TinyV4Config()
    model = model_for(cfg)
    pools = TierPools(layout_for(cfg), "device", num_pages=16, num_snapshots=4, device=device)
    toks = tokens(cfg, 70, seed=25)
    _, owner, pub = run_publishing(model, pools, toks[:48], chunks=7)
    cache = PagedSequenceCache.resume(cfg, pools, pub.pages[:3], pub.snapshots[48], 48)
    assert cache.reserve(70).ok
    got = model.run(toks[48:], cache)
    assert compare_logits(got, reference_logits(model, toks)[48:]).exact
    cache.release()
    owner.release()
    pools.check_integrity()
