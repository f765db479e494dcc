"""Helpers for driving the tiny serving loop through a real HiCache in tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.engine.tiny_model import TOLERANCE, TinyV4Config, TinyV4Model
from hicache.engine.tiny_serving import TinyEngine, TinyEngineConfig, TinyPools, TinyReport, tiny_cache
from hicache.engine.workloads import Request

CFG = TinyV4Config()
P = CFG.page_tokens
_MODEL: list[TinyV4Model] = []


def model() -> TinyV4Model:
    """Weights are a pure function of the config: build the model once per session."""
    if not _MODEL:
        _MODEL.append(TinyV4Model(CFG))
    return _MODEL[0]


def toks(seed: int, n: int) -> np.ndarray:
    """``n`` token ids in the tiny vocabulary, a pure function of ``seed``."""
    return np.random.default_rng(seed).integers(0, CFG.vocab, n).astype(np.int32)


def request(rid: int, prompt: np.ndarray, output: np.ndarray, *, conv: str | None = None,
            turn: int = 0, arrival: float = 0.0) -> Request:
    return Request(rid, conv or f"c{rid}", turn, arrival, np.asarray(prompt, np.int32),
                   np.asarray(output, np.int32))


def small_cache(*, device_pages=10, device_snapshots=4, host_pages=16, host_snapshots=8,
                retention=None, storage="memory://", device="cpu"):
    """Pools of a few 16-token pages, so one or two other requests evict a prefix; the
    device tier on ``device`` (the model computes on the CPU either way)."""
    pools = TinyPools(device_pages=device_pages, device_snapshots=device_snapshots,
                      host_pages=host_pages, host_snapshots=host_snapshots)
    return tiny_cache(CFG, pools=pools, retention=retention, storage_url=storage, device=str(device))


def serve(cache, requests, engine_cls=TinyEngine, **cfg) -> TinyReport:
    """Run ``requests`` to the end on a fresh engine over ``cache``; checks integrity."""
    report = engine_cls(cache, model(), TinyEngineConfig(**cfg)).run(requests)
    cache.check_integrity()
    return report


def assert_exact(report: TinyReport, checked: int | None = None) -> None:
    """Every computed logit within TOLERANCE of the no-cache recompute, every page read
    back bit-identical; ``checked``: the exact number of positions compared."""
    assert report.max_logit_diff <= TOLERANCE, f"max logit diff {report.max_logit_diff}"
    assert report.mismatched_pages == 0, f"{report.mismatched_pages} pages differ"
    assert report.checked_tokens > 0
    if checked is not None:
        assert report.checked_tokens == checked


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: intra-op threads only add barrier waits on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- the two-turn scenario of the tier and negative-control tests ---------------------------
# Conversation ``a``: turn 1 is a 70-token prompt and a 30-token answer (boundaries with a
# snapshot at 32 and 64 = prompt end, and at 96 = finish); turn 2's prompt is turn 1's
# prompt + answer + 20 new tokens, so it can resume at 96 and computes the other 34.
# Between the turns, 100-token requests of other conversations push turn 1's pages out of
# the device (10 pages) and then out of the host (16 pages).
A_PROMPT, A_OUT = toks(1, 70), toks(2, 30)
A2_PROMPT, A2_OUT = np.concatenate([A_PROMPT, A_OUT, toks(3, 20)]), toks(4, 10)
RESUME = 96
COMPUTED = len(A2_PROMPT) + len(A2_OUT) - RESUME
FILLERS = {"device": 0, "host": 1, "l3": 3}   # fillers that make turn 2 resume from a tier


def two_turns(cache, fillers: int, engine_cls=TinyEngine) -> TinyReport:
    """Turn 1, ``fillers`` other requests, then turn 2 on ``engine_cls``; turn 2's report."""
    first = serve(cache, [request(0, A_PROMPT, A_OUT, conv="a")])
    assert_exact(first, checked=100)
    for i in range(fillers):
        assert_exact(serve(cache, [request(10 + i, toks(100 + 2 * i, 70), toks(101 + 2 * i, 30))]))
    return serve(cache, [request(1, A2_PROMPT, A2_OUT, conv="a", turn=1)], engine_cls)
