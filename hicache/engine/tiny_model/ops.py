"""Small float64 building blocks whose results do not depend on how a sequence is chunked.

A chunked prefill, a decode step and a full recompute must give the *same bits* for the
same position, so nothing here may let the number of rows in a batch change the order
of a floating-point sum:

* BLAS ``x @ W`` picks kernels by matrix shape, so row ``i`` of a 300-row product can
  differ in the last bit from the same row computed alone. :func:`linear`, :func:`scores`
  and :func:`mix` multiply and ``sum`` instead: each output is reduced along one axis in
  a fixed order whatever the batch size.
* Masked attention columns hold exact zeros and sit *after* the real ones (the sink
  column comes first), so a longer, more padded row adds only trailing ``+ 0.0``.
* Rotary angles come from a table computed once: ``cos`` of a vector may take a
  vectorised path for some lengths and a scalar one for others.
"""

from __future__ import annotations

import torch


BLOCK_ELEMS = 1 << 20  # bound on the temporary of a blocked multiply-and-sum


def _row_blocks(n: int, per_row: int) -> list[slice]:
    step = max(1, BLOCK_ELEMS // max(per_row, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)] or [slice(0, 0)]


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` for ``x`` ``[n, k]``, reduced over ``k`` in a batch-independent order."""
    k, m = w.shape
    return torch.cat([(x[b, :, None] * w[None]).sum(1) for b in _row_blocks(x.shape[0], k * m)])


def scores(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``q`` ``[n, h, d]`` against keys ``[n, c, d]`` (per query) or ``[c, d]`` (shared):
    dot products ``[n, h, c]``."""
    n, h, d = q.shape
    if keys.dim() == 3:
        return (q[:, :, None, :] * keys[:, None, :, :]).sum(-1)
    c = keys.shape[0]
    return torch.cat([(q[b, :, None, :] * keys[None, None]).sum(-1)
                      for b in _row_blocks(n, h * c * d)])


def mix(probs: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``probs`` ``[n, h, c]`` weighting values ``[n, c, d]`` or ``[c, d]``: ``[n, h, d]``."""
    n, h, c = probs.shape
    if values.dim() == 3:
        return (probs[..., None] * values[:, None, :, :]).sum(2)
    d = values.shape[1]
    return torch.cat([(probs[b, :, :, None] * values[None, None]).sum(2)
                      for b in _row_blocks(n, h * c * d)])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def swiglu(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return linear(torch.nn.functional.silu(linear(x, w1)) * linear(x, w3), w2)


class RopeTable:
    """``cos``/``sin`` for positions ``[0, max_positions)`` of a ``dim``-wide rotary part.

    The rotary part is the *last* ``dim`` values of a row (DeepSeek keeps rope last in
    its 448 + 64 latent); the two halves of that part form the rotated pairs.
    """

    def __init__(self, max_positions: int, dim: int, theta: float):
        self.dim = dim
        half = dim // 2
        inv = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) * 2.0 / max(dim, 1)))
        ang = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv[None, :]
        self.cos = torch.cos(ang)
        self.sin = torch.sin(ang)

    def apply(self, x: torch.Tensor, pos: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
        """Rotate the last ``dim`` values of ``x`` (``[n, ..., width]``) by positions ``pos``
        (``[n]``); ``inverse`` rotates back (used on the attention output, whose values
        carry the keys' rotation because keys double as values)."""
        if self.dim == 0:
            return x
        half = self.dim // 2
        shape = (pos.shape[0],) + (1,) * (x.dim() - 2) + (half,)
        cos = self.cos[pos].reshape(shape)
        sin = self.sin[pos].reshape(shape)
        if inverse:
            sin = -sin
        keep = x[..., : x.shape[-1] - self.dim]
        x1 = x[..., x.shape[-1] - self.dim: x.shape[-1] - half]
        x2 = x[..., x.shape[-1] - half:]
        return torch.cat([keep, x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
