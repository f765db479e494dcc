"""Typed results of the engine-facing API: what a match found, what publish did, counters."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from hicache.pools import Tier
from hicache.tree import ROOT_HASH

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class SnapshotOutcome(str, Enum):
    """What became of a snapshot offered at publish (compares equal to its value)."""

    KEPT = "kept"                # kept until evicted under pressure
    PROVISIONAL = "provisional"  # kept until its request offers a newer one or releases
    DUPLICATE = "duplicate"      # an equal snapshot was there: the offered row was freed


def resumable_pages(prompt_tokens: int, page_tokens: int) -> int:
    """Whole pages of a ``prompt_tokens``-token prompt a request may resume past: all but
    the last token, at least, is left to compute (``MatchResult.resume_tokens``)."""
    return max(prompt_tokens - 1, 0) // page_tokens


@dataclass(frozen=True)
class MatchResult:
    """What the cache holds for a token sequence (a pure lookup: nothing is locked).

    ``resume_tokens`` (b) is the usable hit: every history page of ``[0, b)`` is on the
    device or host and, for layouts with state, a snapshot for ``b`` is resident. It is a
    multiple of ``page_tokens`` and at most ``len(tokens) - 1``, so at least one token is
    computed. ``device_tokens`` of it are on the device; ``host_tokens`` must be loaded.
    ``history_tokens`` is the longest complete history chain (it may exceed b when no
    snapshot sits deeper). ``l3_hashes`` are the page hashes past the history chain, for an
    L3 lookup, up to the last page that may still be reused.
    """

    tokens: np.ndarray
    page_tokens: int
    resume_tokens: int
    device_tokens: int
    host_tokens: int
    snapshot_tier: Tier | None
    history_tokens: int
    l3_hashes: tuple[bytes, ...]
    root_hash: bytes = ROOT_HASH   # the tenant's root (the salt's); load() opens the lease there

    @property
    def hit_tokens(self) -> int:
        return self.resume_tokens

    @property
    def compute_tokens(self) -> int:
        return len(self.tokens) - self.resume_tokens

    @property
    def branch_tokens(self) -> int:
        """Where this prompt leaves the cached history with no snapshot to resume from
        there: ``history_tokens`` when that lies past the resume point and before the
        prompt's last whole page; else 0. The history stops there because the tree goes
        on another way (or ends): a request whose prefill chunk ends exactly there and
        publishes with ``Boundary.BRANCH`` leaves a resume point at the fork, so every
        later request sharing the prefix (a shared system prompt, the sampled rollouts of
        one prompt) resumes at the fork instead of at the last snapshot before it::

            cached:   [sys prompt ........ | task A ...]      snapshot only at A's end
            request:  [sys prompt ........ | task B ...]      resume 0, history = |sys|
                                           ^ branch_tokens: publish a snapshot here
        """
        h = self.history_tokens
        last = len(self.tokens) // self.page_tokens * self.page_tokens
        return h if self.resume_tokens < h < last else 0


@dataclass(frozen=True)
class PublishResult:
    """Outcome of :meth:`HiCache.publish`.

    ``published_pages``: pages of the request now in the tree (all locked by it).
    ``duplicates_freed``: the request's own pages dropped because an identical page was
    already published (its page table now points at that page). ``snapshot``: ``kept``,
    ``provisional``, ``duplicate`` (an equal snapshot existed) or ``None``.
    """

    published_pages: int
    duplicates_freed: int
    snapshot: SnapshotOutcome | None


@dataclass
class LookupCounters:
    """Counted by :class:`~hicache.cache.opener.LeaseOpener` at each :meth:`HiCache.load`
    (what requests were offered) and :meth:`HiCache.expect`."""

    matches: int = 0
    match_tokens: int = 0
    hit_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    l3_hit_tokens: int = 0
    loads: int = 0
    load_fallbacks: int = 0
    expects: int = 0   # expect() calls that found a resume point

    def count(self, match_tokens: int, resume_tokens: int, loaded_tokens: int, l3_tokens: int, *,
              loaded: bool) -> None:
        """One :meth:`HiCache.load`: ``resume_tokens`` hit, of which ``loaded_tokens`` came
        from the host (``l3_tokens`` of those just fetched from L3), the rest from the device."""
        self.loads += loaded
        self.matches += 1
        self.match_tokens += match_tokens
        self.hit_tokens += resume_tokens
        self.host_hit_tokens += loaded_tokens - l3_tokens
        self.l3_hit_tokens += l3_tokens
        self.device_hit_tokens += resume_tokens - loaded_tokens


@dataclass
class ResidencyCounters:
    """Counted by :class:`~hicache.cache.residency.Residency`: copies between tiers, eviction."""

    load_failures: int = 0
    loaded_pages: int = 0
    backups: int = 0
    backup_failures: int = 0
    backup_skipped_no_room: int = 0
    backed_up_pages: int = 0
    device_evicted_pages: int = 0
    device_demoted_pages: int = 0
    host_evicted_pages: int = 0
    host_released_pages: int = 0       # exclusive host tier: host copies freed by a load
    snapshots_evicted_device: int = 0
    snapshots_evicted_host: int = 0
    snapshots_backed_up: int = 0
    snapshots_loaded: int = 0
    snapshots_released_host: int = 0   # exclusive host tier: host copies freed by a load
    compaction_moves: int = 0          # shared budget: objects moved inside an arena to make room


@dataclass
class PublishCounters:
    """Counted by :class:`~hicache.cache.publisher.Publisher`: pages and snapshots offered."""

    published_pages: int = 0
    duplicate_pages: int = 0
    snapshots_offered: int = 0
    snapshots_kept: int = 0
    snapshots_provisional: int = 0
    snapshots_duplicate: int = 0
    snapshots_dropped_retention: int = 0
    snapshots_dropped_no_room: int = 0


@dataclass
class L3Counters:
    """Counted by :class:`~hicache.cache.l3tier.L3Tier`: prefetched pages and L3 puts."""

    l3_prefetched_pages: int = 0
    l3_put_objects: int = 0
    l3_put_dropped: int = 0
    l3_put_retries: int = 0      # objects re-queued after a dropped, refused or failed put
    l3_put_abandoned: int = 0    # objects given up on after MAX_PUT_RETRIES retries


@dataclass
class AdmitCounters:
    """Counted by :class:`~hicache.cache.admission.L3Admission`: chains written to L3 on
    their own (not behind host eviction)."""

    l3_admit_chains: int = 0             # chains queued (pages not yet in L3 + their snapshot)
    l3_admit_objects: int = 0            # objects written (new in the store)
    l3_admit_bytes: int = 0              # their bytes
    l3_admit_skipped_existing: int = 0   # objects the store already held (not written again)
    l3_admit_failed_objects: int = 0     # refused, failed or dropped puts
    l3_admit_throttled: int = 0          # chains that waited for the bandwidth budget
    l3_admit_dropped: int = 0            # chains given up: over max_pending, or the queue full
    l3_admit_engine_us: int = 0          # engine-thread microseconds spent choosing and staging
    l3_admit_memo_forgotten: int = 0     # keys dropped from the bounded record of what L3 holds


@dataclass
class CacheStats(LookupCounters, ResidencyCounters, PublishCounters, L3Counters, AdmitCounters):
    """All counters of one cache, gathered from the parts that count them: the union of
    the five parts' fields (disjoint by construction), declared once, in those classes.

    ``HiCache.counters`` builds one on each access (a copy: writing to it changes
    nothing); ``HiCache.stats()`` returns it as a dict with tier occupancy added.
    """

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def gather(cls, *parts: DataclassInstance) -> "CacheStats":
        """One view of the counters each part keeps (their fields are disjoint)."""
        values: dict[str, int] = {}
        for part in parts:
            for f in fields(part):
                values[f.name] = getattr(part, f.name)
        return cls(**values)
