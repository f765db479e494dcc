"""Random schedules: any chunking, any resume boundary, any continuation is bit-exact."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hicache.engine.tiny_model import PagedSequenceCache, compare_logits, reference_logits
from tests.engine.tiny_model.support import CONFIGS, device_pools, model_for, run_publishing


def _chunks(draw, n: int) -> list[int]:
    sizes, left = [], n
    while left:
        size = draw(st.integers(1, min(left, 40)))
        sizes.append(size)
        left -= size
    return sizes


@st.composite
def scenarios(draw):
    name = draw(st.sampled_from(sorted(CONFIGS)))
    cfg = CONFIGS[name]
    p = cfg.page_tokens
    prompt_len = draw(st.integers(p, 6 * p + p - 1))
    boundary = draw(st.integers(1, prompt_len // p)) * p
    tail_len = draw(st.integers(1, 3 * p))
    vocab = st.integers(0, cfg.vocab - 1)
    prompt = draw(st.lists(vocab, min_size=prompt_len, max_size=prompt_len))
    tail = draw(st.lists(vocab, min_size=tail_len, max_size=tail_len))
    return (name, prompt, _chunks(draw, prompt_len), boundary, tail,
            _chunks(draw, tail_len))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_any_schedule_and_resume_point_is_bit_exact(case):
    name, prompt, chunks, boundary, tail, tail_chunks = case
    cfg = CONFIGS[name]
    model, pools = model_for(cfg), device_pools(cfg)
    prompt_t = torch.tensor(prompt)
    logits, owner, pub = run_publishing(model, pools, prompt_t, chunks=chunks)
    assert compare_logits(logits, reference_logits(model, prompt_t)).exact

    # A sibling: the prompt's first `boundary` tokens, then its own tail.
    mine = torch.tensor(prompt[:boundary] + tail)
    p = cfg.page_tokens
    cache = PagedSequenceCache.resume(cfg, pools, pub.pages[: boundary // p],
                                      pub.snapshots[boundary], boundary)
    assert cache.reserve(len(mine)).ok
    got = model.run(mine[boundary:], cache, chunks=tail_chunks)
    check = compare_logits(got, reference_logits(model, mine)[boundary:])
    assert check.exact and check.checked_tokens == len(tail), check
    cache.release()
    owner.release()
    pools.free("page", pub.pages)
    pools.free("state", list(pub.snapshots.values()))
    assert pools.num_used("page") == 0 and pools.num_used("state") == 0
    pools.check_integrity()
