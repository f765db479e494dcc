"""A slow, obviously-correct reference of the tiny model: one position at a time.

Written straight from the definitions in ``docs/tiny_model.md`` with Python loops and
sets, sharing only the weights with the real model (rotary angles are recomputed with
``torch.cos``/``torch.sin``): the window is a list of positions, compressed entries are
built from the whole sequence, visibility is ``(j + 1) * r <= t + 1``, the indexer picks
``sorted(visible, key=(-score, j))[:k]``. Agreement to 1e-12 checks the vectorised
masks, rings and chunk bookkeeping of the real model.
"""

from __future__ import annotations

import torch

from hicache.engine.tiny_model import CSA_RATIO, TinyV4Model


def _rope(x: torch.Tensor, t: int, dim: int, theta: float, inverse: bool = False) -> torch.Tensor:
    """Rotate pairs (i, i + dim/2) of the last ``dim`` values by ``t * theta^(-2i/dim)``."""
    if dim == 0:
        return x
    half, w = dim // 2, x.shape[-1]
    ang = torch.tensor([t / theta ** (2.0 * i / dim) for i in range(half)], dtype=x.dtype)
    c, s = torch.cos(ang), torch.sin(ang) * (-1.0 if inverse else 1.0)
    a, b = x[..., w - dim: w - half], x[..., w - half:]
    return torch.cat([x[..., : w - dim], a * c - b * s, a * s + b * c], dim=-1)


def _norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _entries(x, cw, ratio, dim, rope_dim, theta, eps):
    """Every complete compressed entry of the sequence ``x`` ``[T, hidden]``."""
    kv = x @ cw.wkv
    sc = x @ cw.wgate
    out = []
    for j in range(x.shape[0] // ratio):
        slots_kv, slots_sc = [], []
        if ratio == CSA_RATIO:
            for p in range((j - 1) * ratio, j * ratio):   # previous block, overlap half
                if p >= 0:
                    slots_kv.append(kv[p, :dim])
                    slots_sc.append(sc[p, :dim] + cw.ape[p % ratio, :dim])
            for p in range(j * ratio, (j + 1) * ratio):   # own block, own half
                slots_kv.append(kv[p, dim:])
                slots_sc.append(sc[p, dim:] + cw.ape[p % ratio, dim:])
        else:
            for p in range(j * ratio, (j + 1) * ratio):
                slots_kv.append(kv[p])
                slots_sc.append(sc[p] + cw.ape[p % ratio])
        k, s = torch.stack(slots_kv), torch.stack(slots_sc)
        mixed = (k * torch.softmax(s, dim=0)).sum(0)
        out.append(_rope(_norm(mixed, cw.norm, eps), j * ratio, rope_dim, theta))
    return out


def naive_logits(model: TinyV4Model, tokens: list[int], stats: dict | None = None) -> torch.Tensor:
    """Logits of every position; ``stats['decisive_ties']`` counts queries whose top-k
    cut falls between two exactly equal index scores (so the tie rule decides)."""
    stats = stats if stats is not None else {}
    stats.setdefault("decisive_ties", 0)
    cfg, W = model.cfg, model.weights
    T = len(tokens)
    h = W.embed[torch.tensor(tokens)]
    for layer, lw in enumerate(W.layers):
        x = _norm(h, lw.attn_norm, cfg.norm_eps)
        ql = _norm(x @ lw.wq_a, lw.q_norm, cfg.norm_eps)
        kv = [_rope(v, t, cfg.rope_dim, cfg.rope_theta)
              for t, v in enumerate(_norm(x @ lw.wkv, lw.kv_norm, cfg.norm_eps))]
        r = cfg.ratio(layer)
        ents = _entries(x, lw.compressor, r, cfg.head_dim, cfg.rope_dim, cfg.rope_theta,
                        cfg.norm_eps) if r else []
        iks = (_entries(x, lw.indexer.compressor, r, cfg.index_dim, cfg.index_rope_dim,
                        cfg.rope_theta, cfg.norm_eps) if r == CSA_RATIO else [])
        outs = []
        for t in range(T):
            q = _rope((ql[t] @ lw.wq_b).view(cfg.num_heads, cfg.head_dim), t, cfg.rope_dim,
                      cfg.rope_theta)
            keys = [kv[p] for p in range(max(0, t - cfg.window + 1), t + 1)]
            visible = [j for j in range(len(ents)) if (j + 1) * r <= t + 1]
            if r == CSA_RATIO:
                iq = _rope((ql[t] @ lw.indexer.wq_b).view(cfg.index_heads, cfg.index_dim), t,
                           cfg.index_rope_dim, cfg.rope_theta)
                iw = x[t] @ lw.indexer.wweights
                score = {j: float((torch.relu(iq @ iks[j]) * iw).sum()) for j in visible}
                ranked = sorted(visible, key=lambda j: (-score[j], j))
                k = cfg.index_topk
                if len(ranked) > k and score[ranked[k - 1]] == score[ranked[k]]:
                    stats["decisive_ties"] += 1
                visible = ranked[:k]
            keys += [ents[j] for j in visible]
            K = torch.stack(keys)
            head_out = []
            for hd in range(cfg.num_heads):
                logits = torch.cat([lw.sink[hd:hd + 1], K @ q[hd] * cfg.head_dim ** -0.5])
                p = torch.softmax(logits, dim=0)[1:]
                head_out.append(p @ K)
            o = _rope(torch.stack(head_out), t, cfg.rope_dim, cfg.rope_theta, inverse=True)
            outs.append(o.reshape(-1) @ lw.wo)
        h = h + torch.stack(outs)
        y = _norm(h, lw.ffn_norm, cfg.norm_eps)
        h = h + (torch.nn.functional.silu(y @ lw.w1) * (y @ lw.w3)) @ lw.w2
    return _norm(h, W.final_norm, cfg.norm_eps) @ W.head
