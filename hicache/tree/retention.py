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
    GRAIN = "grain"            # the prompt's last boundary on its sharing grain (EngineConfig.prompt_grain)


def chunk_end(done: int, target: int, why: Boundary, fork: int) -> tuple[int, Boundary]:
    """Where a prefill chunk from ``done`` to ``target`` ends, and why: at ``fork``
    (``MatchResult.branch_tokens``) when it lies inside the chunk, so a snapshot lands on
    the fork and later requests sharing the prefix resume there; else as planned."""
    return (fork, Boundary.BRANCH) if done < fork < target else (target, why)


def grain_end(done: int, target: int, why: Boundary, prompt_tokens: int, grain: int,
              page_tokens: int) -> tuple[int, Boundary]:
    """Where a prompt's last chunk (``why`` PROMPT_END) ends first: at the prompt's last
    boundary on its sharing ``grain`` (tokens), rounded down to a page, when that lies
    inside the chunk and before the prompt's last page boundary; else as planned.

    Why. Prompts that share a prefix part where their texts part, and a hybrid model
    resumes only where a snapshot sits, so the snapshot must sit on the shared part. The
    prompt-end snapshot sits at the prompt's last page boundary, past the part a later
    prompt shares whenever texts part on a coarser grain than a page. A block-hash trace is
    such traffic: two of its prompts share whole blocks (``block_size`` tokens) and part at
    a block boundary, so a prompt of 900 tokens in 512-token blocks has its snapshot at
    768 (256-token pages) while every later prompt that shares its first block parts at
    512 -- an offered snapshot no later prompt can use. With ``grain`` 512 the chunk ends
    at 512 first (a snapshot there), then at the prompt's end::

        prompt   |--block 0 (512)--|--partial block (388)--|
        pages    |  256  |  256    |  256  | (132: no whole page)
        grain    ^ 512: GRAIN snapshot     ^ 768: PROMPT_END snapshot

    ``grain`` 0 (or any grain no coarser than a page) changes nothing."""
    if why is not Boundary.PROMPT_END or grain <= page_tokens:
        return target, why
    aligned = prompt_tokens // grain * grain // page_tokens * page_tokens
    if done < aligned < min(target, prompt_tokens // page_tokens * page_tokens):
        return aligned, Boundary.GRAIN
    return target, why


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
