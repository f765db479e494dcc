"""The tiny DeepSeek-V4-style attention stack: chunked prefill and decode over a cache.

Per layer, the token at position ``t`` attends, in one softmax with a per-head sink, to::

    sliding window    KV rows of tokens [t - W + 1, t]                  (every layer)
    CSA (ratio 4)     top-k compressed entries by the lightning indexer   (c4_kv, c4_indexer)
    HCA (ratio m)     every compressed entry                              (c{m}_kv)

where compressed entry ``j`` (tokens ``[j*r, (j+1)*r)``) is visible to ``t`` once it is
complete, ``(j + 1) * r <= t + 1`` (DeepSeek-V4's causal rule). Keys double as values
(one latent KV head); the output's rotary part is rotated back to the query position.

Everything is float64 and deterministic. Top-k ties (common: the indexer's ReLU makes
many scores exactly 0) go to the lower entry index via a stable sort, and selected
entries are used in index order, so the selection never depends on chunking.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from hicache.engine.tiny_model.cache import SequenceCache
from hicache.engine.tiny_model.compressor import compress_chunk
from hicache.engine.tiny_model.config import (CSA_RATIO, INDEXER_FAMILY, TinyV4Config, kv_family,
                                              layout_for)
from hicache.engine.tiny_model.ops import RopeTable, linear, mix, rms_norm, scores, swiglu
from hicache.engine.tiny_model.state import INDEX, KV
from hicache.engine.tiny_model.weights import DTYPE, LayerWeights, init_weights
from hicache.errors import MisuseError

NEG_INF = float("-inf")


def _masked(scores: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    return scores.masked_fill(~ok, NEG_INF)


class TinyV4Model:
    """Random-weight model from ``cfg.seed``; :meth:`forward` runs one chunk."""

    def __init__(self, cfg: TinyV4Config):
        self.cfg = cfg
        self.layout = layout_for(cfg)
        self.weights = init_weights(cfg)
        self.rope = RopeTable(cfg.max_positions, cfg.rope_dim, cfg.rope_theta)
        self.index_rope = RopeTable(cfg.max_positions, cfg.index_rope_dim, cfg.rope_theta)

    # -- public -----------------------------------------------------------------------------
    def forward(self, tokens: Sequence[int] | torch.Tensor, start: int,
                cache: SequenceCache) -> torch.Tensor:
        """Logits ``[n, vocab]`` for tokens at positions ``[start, start + n)``.

        ``start`` must equal ``cache.length``; the cache must have room for ``start + n``
        tokens (for a paged cache: ``reserve`` first).
        """
        ids = self._tokens(tokens)
        n = int(ids.shape[0])
        self._check(cache, start, n)
        w = self.weights
        pos = torch.arange(start, start + n)
        h = w.embed[ids]
        for layer, lw in enumerate(w.layers):
            x = rms_norm(h, lw.attn_norm, self.cfg.norm_eps)
            h = h + self._attention(layer, lw, x, pos, cache)
            h = h + swiglu(rms_norm(h, lw.ffn_norm, self.cfg.norm_eps), lw.w1, lw.w3, lw.w2)
        cache.state.length = start + n
        return linear(rms_norm(h, w.final_norm, self.cfg.norm_eps), w.head)

    def run(self, tokens: Sequence[int] | torch.Tensor, cache: SequenceCache, *,
            chunks: int | Sequence[int] | None = None,
            on_boundary: Callable[[int], None] | None = None) -> torch.Tensor:
        """Process ``tokens`` from ``cache.length`` on, in chunks; logits ``[n, vocab]``.

        ``chunks``: None = one chunk, an int = that many tokens per chunk (1 = decode token
        by token), a list = explicit sizes summing to ``len(tokens)``. With
        ``on_boundary``, chunks are also split at page boundaries and ``on_boundary(b)``
        is called whenever the request stands at a multiple ``b`` of ``page_tokens`` --
        the moment an engine publishes pages and saves a snapshot.
        """
        ids = self._tokens(tokens)
        sizes = self._schedule(int(ids.shape[0]), chunks)
        if on_boundary is not None:
            sizes = self._split_at_pages(cache.length, sizes)
        out, i = [], 0
        for size in sizes:
            out.append(self.forward(ids[i:i + size], cache.length, cache))
            i += size
            if on_boundary is not None and cache.length % self.cfg.page_tokens == 0:
                on_boundary(cache.length)
        return torch.cat(out) if out else torch.zeros((0, self.cfg.vocab), dtype=DTYPE)

    # -- checks -----------------------------------------------------------------------------
    def _tokens(self, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(tokens)
        if ids.dim() == 1 and ids.numel() == 0:
            return ids.to(torch.int64)
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise MisuseError(f"tokens must be a 1-D sequence of integers, got {tuple(ids.shape)} "
                              f"{ids.dtype}")
        ids = ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.cfg.vocab):
            raise MisuseError(f"token ids must be in [0, {self.cfg.vocab})")
        return ids

    def _check(self, cache: SequenceCache, start: int, n: int) -> None:
        if cache.cfg != self.cfg:
            raise MisuseError("the cache was built for a different TinyV4Config")
        if n < 1:
            raise MisuseError("a chunk needs at least one token")
        if start != cache.length:
            raise MisuseError(f"the cache holds {cache.length} tokens but the chunk starts at {start}")
        if start + n > self.cfg.max_positions:
            raise MisuseError(f"positions up to {start + n} exceed max_positions={self.cfg.max_positions}")
        if start + n > cache.capacity_tokens:
            raise MisuseError(f"the cache has room for {cache.capacity_tokens} tokens, the chunk "
                              f"ends at {start + n} (reserve pages first)")

    @staticmethod
    def _schedule(n: int, chunks: int | Sequence[int] | None) -> list[int]:
        if chunks is None:
            return [n] if n else []
        if isinstance(chunks, int):
            if isinstance(chunks, bool) or chunks < 1:
                raise MisuseError(f"chunk size must be an integer >= 1, got {chunks}")
            return [min(chunks, n - i) for i in range(0, n, chunks)]
        sizes = [int(c) for c in chunks]
        if any(c < 1 for c in sizes) or sum(sizes) != n:
            raise MisuseError(f"chunk sizes {sizes} must be >= 1 and sum to {n}")
        return sizes

    def _split_at_pages(self, start: int, sizes: list[int]) -> list[int]:
        p, out, pos = self.cfg.page_tokens, [], start
        for size in sizes:
            end = pos + size
            while pos < end:
                step = min(end, (pos // p + 1) * p) - pos
                out.append(step)
                pos += step
        return out

    # -- one layer's attention --------------------------------------------------------------
    def _attention(self, layer: int, w: LayerWeights, x: torch.Tensor, pos: torch.Tensor,
                   cache: SequenceCache) -> torch.Tensor:
        cfg, state = self.cfg, cache.state
        n, s, win = pos.shape[0], int(pos[0]), cfg.window
        heads, d = cfg.num_heads, cfg.head_dim
        ql = rms_norm(linear(x, w.wq_a), w.q_norm, cfg.norm_eps)
        q = self.rope.apply(linear(ql, w.wq_b).view(n, heads, d), pos)
        kv = self.rope.apply(rms_norm(linear(x, w.wkv), w.kv_norm, cfg.norm_eps), pos)

        # Sliding window: W - 1 rows before the chunk from the ring, then the chunk itself.
        ring = state.window[layer]
        keys = torch.cat([state.read(ring, s - win + 1, s), kv])     # positions [s-W+1, s+n)
        state.write(ring, s, kv, keep_from=s + n - win)
        win_kv = keys.unfold(0, win, 1).transpose(1, 2)               # [n, W, d]
        win_ok = (pos[:, None] - (win - 1) + torch.arange(win)[None, :]) >= 0
        win_kv = torch.where(win_ok[..., None], win_kv, torch.zeros((), dtype=DTYPE))
        # Column order: sink, window, compressed -- masked columns only ever trail.
        parts: list[tuple[torch.Tensor, torch.Tensor | None]] = [
            (w.sink[None, :, None].expand(n, heads, 1), None),
            (_masked(scores(q, win_kv) * cfg.scale, win_ok[:, None, :]), win_kv)]

        r = cfg.ratio(layer)
        if r:
            assert w.compressor is not None, f"layer {layer} compresses (ratio {r}) without compressor weights"
            fam = kv_family(r)
            new = compress_chunk(state, state.comp_buffer(KV, layer), w.compressor, x, s, r,
                                 r == CSA_RATIO, self.rope, cfg.norm_eps)
            cache.write_history(fam, layer, s // r, new)
            n_ent = (s + n) // r
            visible = torch.arange(n_ent)[None, :] < ((pos + 1) // r)[:, None]   # [n, n_ent]
            if r == CSA_RATIO:
                sel, ok = self._select(layer, w, x, ql, pos, n_ent, visible, cache)
                ent = cache.read_history(fam, layer, n_ent)
                ent = ent[sel] if n_ent else ent.new_zeros((n, sel.shape[1], d))
                ent = torch.where(ok[..., None], ent, torch.zeros((), dtype=DTYPE))
                parts.append((_masked(scores(q, ent) * cfg.scale, ok[:, None, :]), ent))
            elif n_ent:
                ent = cache.read_history(fam, layer, n_ent)
                parts.append((_masked(scores(q, ent) * cfg.scale, visible[:, None, :]), ent))

        probs = torch.softmax(torch.cat([sc for sc, _ in parts], dim=-1), dim=-1)
        out, col = torch.zeros((n, heads, d), dtype=DTYPE), 0
        for sc, val in parts:
            width = sc.shape[-1]
            if val is not None:
                out = out + mix(probs[..., col:col + width], val)
            col += width
        out = self.rope.apply(out, pos, inverse=True)
        return linear(out.reshape(n, heads * d), w.wo)

    def _select(self, layer: int, w: LayerWeights, x: torch.Tensor, ql: torch.Tensor,
                pos: torch.Tensor, n_ent: int, visible: torch.Tensor,
                cache: SequenceCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Lightning indexer: ``index_topk`` visible entries per query, ``(ids, valid)``.

        Always ``index_topk`` columns (padded with invalid entry 0), in entry order.
        """
        cfg, iw = self.cfg, w.indexer
        assert iw is not None, f"layer {layer} selects entries without indexer weights"
        n, s = pos.shape[0], int(pos[0])
        new = compress_chunk(cache.state, cache.state.comp_buffer(INDEX, layer), iw.compressor, x,
                             s, CSA_RATIO, True, self.index_rope, cfg.norm_eps)
        cache.write_history(INDEXER_FAMILY, layer, s // CSA_RATIO, new)
        k = cfg.index_topk
        if n_ent == 0:
            return torch.zeros((n, k), dtype=torch.int64), torch.zeros((n, k), dtype=torch.bool)
        keys = cache.read_history(INDEXER_FAMILY, layer, n_ent)                 # [n_ent, Di]
        iq = self.index_rope.apply(linear(ql, iw.wq_b).view(n, cfg.index_heads, cfg.index_dim), pos)
        weights = linear(x, iw.wweights)                                        # [n, IH]
        score = (torch.relu(scores(iq, keys)) * weights[..., None]).sum(1)      # [n, n_ent]
        score = _masked(score, visible)
        order = torch.sort(score, dim=-1, descending=True, stable=True).indices[:, :k]
        sel = torch.sort(order, dim=-1).values
        ok = torch.gather(visible, 1, sel)
        if sel.shape[1] < k:
            pad = k - sel.shape[1]
            sel = torch.cat([sel, torch.zeros((n, pad), dtype=torch.int64)], dim=1)
            ok = torch.cat([ok, torch.zeros((n, pad), dtype=torch.bool)], dim=1)
        return sel, ok
