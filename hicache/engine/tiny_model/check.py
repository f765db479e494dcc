"""The exactness check: logits after a cache hit against a full recompute without cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from hicache.engine.tiny_model.cache import DenseSequenceCache
from hicache.engine.tiny_model.model import TinyV4Model
from hicache.errors import MisuseError

TOLERANCE = 1e-9  # max absolute logit difference accepted (float64)


@dataclass(frozen=True)
class LogitCheck:
    """``max_abs_diff`` over ``checked_tokens`` positions; ``exact`` when it is 0.0."""

    max_abs_diff: float
    checked_tokens: int

    @property
    def exact(self) -> bool:
        return self.max_abs_diff == 0.0

    def ok(self, tolerance: float = TOLERANCE) -> bool:
        return self.max_abs_diff <= tolerance

    def merge(self, other: "LogitCheck") -> "LogitCheck":
        return LogitCheck(max(self.max_abs_diff, other.max_abs_diff),
                          self.checked_tokens + other.checked_tokens)


def compare_logits(got: torch.Tensor, want: torch.Tensor) -> LogitCheck:
    """Compare two ``[n, vocab]`` logit blocks (NaN counts as an infinite difference)."""
    if got.shape != want.shape:
        raise MisuseError(f"logit shapes differ: {tuple(got.shape)} vs {tuple(want.shape)}")
    if got.numel() == 0:
        return LogitCheck(0.0, int(got.shape[0]))
    diff = (got - want).abs()
    worst = float("inf") if torch.isnan(diff).any() else float(diff.max())
    return LogitCheck(worst, int(got.shape[0]))


def reference_logits(model: TinyV4Model, tokens: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Logits of every position of ``tokens`` from a full recompute with no cache reuse."""
    return model.forward(tokens, 0, DenseSequenceCache(model.cfg))
