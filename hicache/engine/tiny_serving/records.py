"""What the tiny serving loop reports: one record per request and a run report.

The tier fields of :class:`TinyRecord` have the names of the synthetic engine's
``RequestRecord`` (``hicache.engine.loop``), so the replay command's plot writer takes
either; the tiny loop adds the exactness figures ``checked_tokens`` and ``max_logit_diff``.
It never preempts (admission reserves a request's pages), so it has no preemption count.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hicache.engine.tiny_model import TOLERANCE, LogitCheck


@dataclass
class TinyRecord:
    """One request: where its prefix came from and how exact its logits were.

    ``checked_tokens`` counts every position whose logits the loop computed (all of
    ``[hit_tokens, prompt + output)``) and compared with a no-cache recompute;
    ``max_logit_diff`` is the worst absolute difference among them.
    """

    request_id: int
    conversation_id: str
    turn: int
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int = 0
    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    l3_hit_tokens: int = 0
    recomputed_tokens: int = 0
    verified_pages: int = 0
    mismatched_pages: int = 0
    checked_tokens: int = 0
    max_logit_diff: float = 0.0
    admit_step: int = -1
    finish_step: int = -1

    def add_check(self, check: LogitCheck) -> None:
        self.checked_tokens += check.checked_tokens
        self.max_logit_diff = max(self.max_logit_diff, check.max_abs_diff)


@dataclass
class TinyReport:
    """A whole run (records in request-id order). ``admission_waits``: times a request
    could not get its pages and waited; ``load_failures``: host loads that failed (the
    request then recomputed from token 0)."""

    records: list[TinyRecord] = field(default_factory=list)
    steps: int = 0
    admission_waits: int = 0
    load_failures: int = 0
    wall_s: float = 0.0

    @property
    def checked_tokens(self) -> int:
        return sum(r.checked_tokens for r in self.records)

    @property
    def max_logit_diff(self) -> float:
        return max((r.max_logit_diff for r in self.records), default=0.0)

    @property
    def verified_pages(self) -> int:
        return sum(r.verified_pages for r in self.records)

    @property
    def mismatched_pages(self) -> int:
        return sum(r.mismatched_pages for r in self.records)

    def exact(self, tolerance: float = TOLERANCE) -> bool:
        """Every checked logit within ``tolerance`` of the recompute, and something checked."""
        return self.checked_tokens > 0 and self.max_logit_diff <= tolerance


__all__ = ["TinyRecord", "TinyReport"]
