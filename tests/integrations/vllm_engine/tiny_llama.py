"""A tiny random-weight GQA Llama on disk (no hub): transformers writes the config and
weights; the tokenizer is a word-level vocabulary written by hand (prompts are token ids,
so it only has to load). Seeded, so every call with the same arguments writes the same
model."""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 4096


def make_tiny_llama(path: Path, *, layers: int = 4, hidden: int = 256, heads: int = 4, kv_heads: int = 2,
                    sliding_window: int | None = None, seed: int = 0) -> Path:
    """``sliding_window``: every other layer (0, 2, ...) attends to that many tokens
    (``layer_types``, as vLLM's Llama reads them), the rest to all."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").exists():
        return path
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=VOCAB,
                      max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    if sliding_window is not None:
        cfg.sliding_window = sliding_window
        cfg.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():   # larger weights than the default init: outputs depend on context
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path, safe_serialization=True)
    _write_tokenizer(path)
    return path


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 4096}))
