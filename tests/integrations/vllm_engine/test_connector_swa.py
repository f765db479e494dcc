"""``HiCacheConnector`` on a model with sliding-window layers: a tiny Llama whose even layers
attend to a 160-token window and odd layers to everything.

vLLM runs such a model with two KV cache groups (full and sliding window) when nothing is
attached. A connector that does not declare ``SupportsHMA`` makes vLLM keep one group, every
block of every layer, and compute the window layers with their window: so hicache stores
the window layers' blocks as history, and the resumed outputs must equal vLLM's own
hybrid run. (hicache state families for the window, with vLLM's hybrid manager, are not
done yet: ``docs/integrations.md``.)
"""

from __future__ import annotations

import random

import pytest

from .test_connector_engine import bridge, generate, start, stop, zeroed_loads
from .tiny_llama import VOCAB, make_tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore")
WINDOW = 160


def test_sliding_window_model_resumes_with_identical_outputs(tmp_path):
    model = make_tiny_llama(tmp_path / "tiny-swa", sliding_window=WINDOW, seed=1)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (500, 900)]
    ref = start(model, None)
    assert not ref.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager  # two groups
    expected, _ = generate(ref, prompts)
    stop(ref)

    llm = start(model, tmp_path / "store")
    one_group = llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
    assert one_group, "vLLM kept its hybrid manager with a connector that does not declare SupportsHMA"
    first, _ = generate(llm, prompts)
    assert llm.reset_prefix_cache()
    again, cached = generate(llm, prompts)
    assert first == expected and again == expected
    assert cached == [(n - 1) // 128 * 128 for n in (500, 900)], cached
    assert bridge(llm).stats()["loaded_tokens"] == sum(cached)
    assert llm.reset_prefix_cache()
    with zeroed_loads():
        bad, cached = generate(llm, prompts)
    assert sum(cached) > 0 and bad != expected, (cached, bad)
    stop(llm)
