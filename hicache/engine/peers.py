"""A queued request waits for a running peer that is computing its prefix (in-batch sharing).

Why. Two requests that share a prefix nobody has computed yet often arrive together: a
conversation's next request while the previous one still runs (traces without conversation
ids), an agent's rollouts on one task prompt, documents behind one instruction. Admitted in
the same step, both compute the shared pages, and neither finds them in the cache, since
pages are published only once computed. A cache that replays a trace one request at a time
(kvcache-simulator) counts the second request's pages as hits. A server can have them too:
SGLang's scheduler deprioritises a waiting request whose prefix another request in the
batch is about to compute (its in-batch prefix caching check); this is that rule::

    queued R, running J in prefill (J.done < J.prompt_len)
    shared = whole pages R and J's prompts have in common (at most R's resumable pages)
    J.done < shared pages  ->  R waits (others queued behind it may go first); next step
                               J has published more of the shared pages, and R resumes there

With state (hybrid layouts) R can only resume where J leaves a snapshot: J's chunk ends,
its prompt end, and its fork (``Job.branch``). So the shared prefix's end becomes J's fork
when J has no nearer one ahead: J's chunk stops there and leaves a snapshot, and R (and
every other request leaving J's path there) resumes at it. Without state every page
boundary is a resume point and J's chunks are left as they are.

A request never waits for a peer that has computed the shared pages already (their
publish is what it will find) or that is no longer running (preempted); so it waits one
step per chunk of the peer's, never for a finish, and cannot deadlock: the peer runs.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hicache.cache import resumable_pages
from hicache.engine.records import EngineRequest, Job


def common_pages(a: np.ndarray, b: np.ndarray, page_tokens: int, limit: int) -> int:
    """Whole pages, at most ``limit``, at the start of ``a`` and ``b`` that are equal."""
    n = min(len(a), len(b), limit * page_tokens) // page_tokens * page_tokens
    if n == 0 or a[0] != b[0]:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return (int(diff[0]) if len(diff) else n) // page_tokens


class PeerHold:
    """Which running peer a queued request should wait for (module docstring).

    ``stateful``: the layout resumes only at snapshots, so the shared prefix's end is made
    the peer's fork (a chunk ends there, with a snapshot).
    """

    def __init__(self, page_tokens: int, stateful: bool):
        assert page_tokens > 0
        self.P = page_tokens
        self.stateful = stateful

    def blocker(self, req: EngineRequest, running: Sequence[Job]) -> Job | None:
        """The running request computing pages of ``req``'s prompt that ``req`` could
        resume from once published, or None. Marks the shared prefix's end as that
        peer's fork (stateful layouts)."""
        prompt = np.asarray(req.prompt)
        limit = resumable_pages(len(prompt), self.P)
        if limit == 0:
            return None
        for job in running:
            if job.done >= job.prompt_len or job.done >= limit * self.P:
                continue   # decoding (its prompt is published), or past what req could use
            shared = common_pages(prompt, np.asarray(job.req.prompt), self.P, limit)
            fork = shared * self.P
            if fork <= job.done:
                continue
            if (self.stateful and fork < job.prompt_len // self.P * self.P   # not its prompt end
                    and not (job.done < job.branch < fork)):
                job.branch = fork
            return job
        return None
