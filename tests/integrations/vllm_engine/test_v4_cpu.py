"""DeepSeek-V4 on vLLM's CPU engine: kept ready for a machine that can run it.

vLLM 0.32 ships CPU code for DeepSeek-V4, but its ops (``convert_weight_packed``,
``flash_mla_with_kvcache_cpu``, ``fp8_paged_mqa_logits_cpu``, ...) are only in the AVX-512
BF16 build of ``vllm._C``; on an AVX2-only CPU (this project's machines) vLLM loads
``_C_AVX2``, which has none of them, and the model fails while packing its weights
(``cpu_sparse.py``: no attribute ``convert_weight_packed``). Loading ``_C`` itself there is
an illegal instruction. Past the ops, V4's attention metadata is built by Triton kernels,
which need triton-cpu on a CPU. docs/integrations.md has the whole probe.

Where the ops exist, this starts a tiny random-weight V4 (release-format config, dummy
weights) and checks the KV cache groups vLLM makes of it -- the families hicache's V4
layout maps (sliding-window KV, compressed KV + indexer, compressor states) -- and that it
generates. The connector's part (offloading every V4 family) follows once it runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore")

V4_OPS = ("convert_weight_packed", "flash_mla_with_kvcache_cpu", "fp8_paged_mqa_logits_cpu")


def make_tiny_v4(path: Path) -> Path:
    """config.json of a 3-layer V4 in DeepSeek's release format (what vLLM's own
    ``DeepseekV4Config`` reads): layer 0 sliding window only, layer 1 compressed 4x with
    the indexer, layer 2 compressed 128x; head sizes the CPU kernels require (512, 128)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 1024,
        "hidden_size": 256, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 128, "o_lora_rank": 128, "o_groups": 2,
        "sliding_window": 128, "compress_ratios": [0, 4, 128, 0], "compress_rope_theta": 160000.0,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0,
                         "original_max_position_embeddings": 1024, "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 4096, "index_topk": 512, "index_n_heads": 4, "index_head_dim": 128,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
        "num_hash_layers": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def _missing_ops() -> list[str]:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads the _C build this CPU can run)

    return [op for op in V4_OPS if not hasattr(torch.ops._C, op)]


def test_tiny_deepseek_v4_starts_and_generates_where_vllm_has_its_cpu_ops(tmp_path, monkeypatch):
    missing = _missing_ops()
    if missing:
        pytest.skip(f"vLLM's CPU build here lacks DeepSeek-V4's ops {missing} (AVX-512 BF16 build only; "
                    "docs/integrations.md)")
    from vllm import LLM, SamplingParams

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    llm = LLM(model=str(make_tiny_v4(tmp_path / "tiny-v4")), load_format="dummy", skip_tokenizer_init=True,
              max_model_len=1024, enforce_eager=True, dtype="bfloat16", max_num_seqs=4,
              max_num_batched_tokens=1024, seed=0)
    groups = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
    kinds = sorted(type(g.kv_cache_spec).__name__ for g in groups)
    assert "MLAAttentionSpec" in kinds and "SlidingWindowMLASpec" in kinds, kinds
    out = llm.generate([{"prompt_token_ids": list(range(10, 310))}], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4
