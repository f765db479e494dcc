"""Selective retention of state snapshots (seed 002).

A snapshot costs about five history pages (DeepSeek-V4-Flash), so keeping one at every
boundary fills memory with state and pushes history out. The policy decides, for each
snapshot a request offers, whether to keep it::

    retention_interval = None   keep every offered snapshot
    retention_interval = 0      keep the latest prompt boundary and the finish boundary;
                                mid-prefill offers are provisional (each replaces the
                                request's previous provisional one, so a concurrent sibling
                                can always resume from the newest boundary)
    retention_interval = N      as 0, plus every boundary that is a multiple of N tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hicache.errors import ConfigError


class Boundary(str, Enum):
    """Why a request offers a snapshot at a boundary."""

    PREFILL = "prefill"        # after a prefill chunk, mid-flight
    PROMPT_END = "prompt_end"  # the deepest page boundary of the prompt
    FINISH = "finish"          # the deepest page boundary after decoding
    BRANCH = "branch"          # where the prompt leaves a cached path (MatchResult.branch_tokens)


def chunk_end(done: int, target: int, why: Boundary, fork: int) -> tuple[int, Boundary]:
    """Where a prefill chunk from ``done`` to ``target`` ends, and why: at ``fork``
    (``MatchResult.branch_tokens``) when it lies inside the chunk, so a snapshot lands on
    the fork and later requests sharing the prefix resume there; else as planned."""
    return (fork, Boundary.BRANCH) if done < fork < target else (target, why)


class Decision(str, Enum):
    KEEP = "keep"
    PROVISIONAL = "provisional"


@dataclass(frozen=True)
class RetentionPolicy:
    interval: int | None
    page_tokens: int

    def __post_init__(self) -> None:
        if self.interval is not None and self.interval > 0 and self.interval % self.page_tokens:
            raise ConfigError("retention_interval", self.interval,
                              f"must be a multiple of page_tokens={self.page_tokens}")

    def decide(self, boundary_tokens: int, why: Boundary) -> Decision:
        if self.interval is None or why is not Boundary.PREFILL:
            return Decision.KEEP
        if self.interval > 0 and boundary_tokens % self.interval == 0:
            return Decision.KEEP
        return Decision.PROVISIONAL
