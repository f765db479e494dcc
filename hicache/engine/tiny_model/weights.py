"""Random float64 weights drawn from one seed, in a fixed order (same seed, same bits).

The shapes follow DeepSeek-V4's attention at toy size: a low-rank query (``wq_a`` ->
``q_norm`` -> ``wq_b``), one latent KV head used as both key and value (MQA), a learned
attention sink per head, a gated compressor per compressed layer (``wkv``, ``wgate``, an
absolute position bias ``ape`` inside each block, an RMSNorm), and for CSA layers a
lightning indexer (query from the same low-rank latent, per-head weights from the
hidden state, its own compressor). The FFN is a dense SwiGLU (no MoE: experts change
nothing about what is cached).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hicache.engine.tiny_model.config import CSA_RATIO, TinyV4Config

DTYPE = torch.float64


@dataclass(frozen=True)
class CompressorWeights:
    """One gated compressor: ``coff`` = 2 halves when overlapping (CSA), else 1."""

    wkv: torch.Tensor     # [hidden, coff * dim]
    wgate: torch.Tensor   # [hidden, coff * dim]
    ape: torch.Tensor     # [ratio, coff * dim]  score bias by position inside the block
    norm: torch.Tensor    # [dim]


@dataclass(frozen=True)
class IndexerWeights:
    wq_b: torch.Tensor       # [q_rank, index_heads * index_dim]
    wweights: torch.Tensor   # [hidden, index_heads]
    compressor: CompressorWeights


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: torch.Tensor
    wq_a: torch.Tensor
    q_norm: torch.Tensor
    wq_b: torch.Tensor
    wkv: torch.Tensor
    kv_norm: torch.Tensor
    sink: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w1: torch.Tensor
    w3: torch.Tensor
    w2: torch.Tensor
    compressor: CompressorWeights | None
    indexer: IndexerWeights | None


@dataclass(frozen=True)
class ModelWeights:
    embed: torch.Tensor
    layers: tuple[LayerWeights, ...]
    final_norm: torch.Tensor
    head: torch.Tensor


class _Draw:
    """Draws tensors in call order from one seeded generator."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, dtype=DTYPE) * scale

    def linear(self, fan_in: int, fan_out: int) -> torch.Tensor:
        return self.normal(fan_in, fan_out, scale=fan_in ** -0.5)

    def norm(self, dim: int) -> torch.Tensor:
        return 1.0 + self.normal(dim, scale=0.1)


def _compressor(draw: _Draw, cfg: TinyV4Config, ratio: int, dim: int) -> CompressorWeights:
    coff = 2 if ratio == CSA_RATIO else 1
    return CompressorWeights(
        wkv=draw.linear(cfg.hidden, coff * dim),
        # Gate scores get a larger scale so the softmax inside a block is far from uniform.
        wgate=draw.linear(cfg.hidden, coff * dim) * 2.0,
        ape=draw.normal(ratio, coff * dim),
        norm=draw.norm(dim),
    )


def init_weights(cfg: TinyV4Config) -> ModelWeights:
    draw = _Draw(cfg.seed)
    embed = draw.normal(cfg.vocab, cfg.hidden)
    layers = []
    for layer in range(cfg.num_layers):
        ratio = cfg.ratio(layer)
        base = dict(
            attn_norm=draw.norm(cfg.hidden),
            wq_a=draw.linear(cfg.hidden, cfg.q_rank),
            q_norm=draw.norm(cfg.q_rank),
            wq_b=draw.linear(cfg.q_rank, cfg.num_heads * cfg.head_dim),
            wkv=draw.linear(cfg.hidden, cfg.head_dim),
            kv_norm=draw.norm(cfg.head_dim),
            sink=draw.normal(cfg.num_heads),
            wo=draw.linear(cfg.num_heads * cfg.head_dim, cfg.hidden),
            ffn_norm=draw.norm(cfg.hidden),
            w1=draw.linear(cfg.hidden, cfg.ffn),
            w3=draw.linear(cfg.hidden, cfg.ffn),
            w2=draw.linear(cfg.ffn, cfg.hidden),
        )
        comp = _compressor(draw, cfg, ratio, cfg.head_dim) if ratio else None
        indexer = None
        if ratio == CSA_RATIO:
            indexer = IndexerWeights(
                wq_b=draw.linear(cfg.q_rank, cfg.index_heads * cfg.index_dim),
                wweights=draw.linear(cfg.hidden, cfg.index_heads),
                compressor=_compressor(draw, cfg, ratio, cfg.index_dim),
            )
        layers.append(LayerWeights(**base, compressor=comp, indexer=indexer))
    return ModelWeights(embed=embed, layers=tuple(layers), final_norm=draw.norm(cfg.hidden),
                        head=draw.linear(cfg.hidden, cfg.vocab))
