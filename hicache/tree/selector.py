"""Choosing the eviction policy online: ghosts of whole candidate policies, the best lately wins.

The cache follows one candidate at a time (its strategy ranks every victim of the real
tree). Every candidate, the followed one included, also runs in a ghost
(:mod:`hicache.tree.ghost`) fed the real cache's events, and after each lookup the
selector compares the candidates' ghost hits over the last ``window`` lookups::

    lookup i:  ghost c resumes h_c(i) pages            (every candidate c)
    score_c  = sum of h_c over the last `window` lookups
    follow     argmax score_c, if it beats the followed one's (f) score by more than
               lead = min(margin x the window's looked-up pages,
                          margin_hits x f's score),
               but never less than margin / 10 x the looked-up pages; or at once when
               a floor is set (plain LRU) and score_f < score_lru: a candidate that
               stopped beating LRU is left, for the best one lately
               (hysteresis: a switch rebuilds the real order, and two candidates that
               tie should not flap); ties go to the earlier candidate in the list
               (plain LRU first)
    record     with a floor, only a candidate whose ghost hit at least as much as LRU's
               over the last `record` lookups (a few windows) may be taken: a lead
               in the last window from a candidate that trails LRU over the longer
               span is not trusted (the followed one is not left for it either)
    spread     and the lead must stand clear of the lookups it was made in: with
               d(i) = h_c(i) - h_f(i) over the window, sum d > z x sqrt(sum d^2)
               (``z``, 2 in the shipped config; 0 off); the floor's exit, paid for
               whatever it takes, goes to the best candidate lately whose lead over LRU
               across the record is clear in the same sense, else to LRU
    trial      (``trial`` > 0) a switch the cache could decline is not taken at once: the
               followed candidate's ghost is cloned, the clone ranks by the new order,
               and after ``trial`` lookups the switch is taken if the clone beat the
               followed ghost by the lead a window asks, counted over the trial's
               lookups, and one clear of its spread, and the
               candidate's own ghost is not under the floor's then, else dropped; and
               the floor's exit goes to the floor itself, every other candidate being
               tried from there
    warm-up    no switch before `window` lookups: the first candidate (plain LRU) is
               followed until the scores cover a whole window
    tails      (``tails`` and ``dead_outputs`` > 0, with a floor) the floor ranks by
               ``tails`` (LRU with a decode's idle tail first) once ``dead_outputs``
               prompts went on past a decode's start without entering its output and
               none ever entered one, and by plain LRU again, for good, from the first
               that does (:mod:`hicache.tree.outputs`: counted from page keys, so no
               ghost's evictions confirm it)

Why two scales. A lead counted in looked-up pages asks for a lead *relative to the hits*
that grows as the hit rate falls: at a 3% margin, 4% more hits at an 80% hit rate but 30%
more at 10% and 60% at 5%. Production traffic, where most chains are used once, runs at
5-25%: there a candidate whose ghost hit 20% more than LRU's over the whole run was
followed in few windows or none. ``margin_hits`` caps the lead at a share of the hits
themselves, so below a hit rate of ``margin / margin_hits`` (30% at the defaults) a steady
relative lead suffices; above it the page margin binds exactly as before. The floor keeps
near-empty windows (a cold cache, hit rates near 0) from switching on a page or two.

Why a record. A window's lead says what paid lately, not what will next; a candidate whose
rule is wrong for the traffic at hand can still lead over one window by luck, and its
mistakes then come due at once (a bursty mix, seed 119: `value` led LRU's ghost by 311
pages over the window before lookup 774 while trailing it by 880 over all 774; taken, it
dropped a snapshot a burst resumed from 76 lookups later, and the run ended 1.2 points
under `--eviction lru`; docs/policy.md). A candidate is trusted for what it did over
``record`` lookups (``record_windows`` windows), a span long enough that one lucky window
does not carry it and short enough that a change of traffic is followed within it.

Why a lead must stand clear of its spread. Hits come in lumps: a request that resumes
resumes its whole chain, tens of pages at once on block-hash traces of long prompts. A
lead of the margin can then be one or two requests that one order happened to keep, and
the next window as likely favours the other order (Mooncake's synthetic trace: 12
switches on such leads, 14.47% against `--eviction lru`'s 15.01%). The sum of per-lookup
differences is a random walk when neither order is better; ``z`` asks that it be more
than ``z`` standard deviations of such a walk (sqrt of the sum of the squared
differences), so a lead made of a few lumps is not taken, while one made of many small
steps -- an order that keeps winning -- is. It decides whether a switch is worth paying
for, so it never forces one, and a run that never switched is unchanged. The floor's exit
cannot decline: a candidate under LRU is left at once. It goes to the best candidate
lately only if that one's lead over LRU across the record (``record`` lookups) is clear,
else to LRU: a candidate tied with LRU is not worth a second switch, while one ahead over
the longer span is (docs/policy.md).

Why a trial. A candidate's ghost has followed its order all along; the real cache, on
switching, starts from what the followed order kept and must give that up to reach the
ghost's contents. Where the new order drops first what the traffic is about to come back
for, that transition is the whole cost, and no ghost shows it: on a mix (seed 126, host 1
GiB) `value` led LRU's ghost clearly, was taken at lookup 715, and the real cache, having
dropped intermediate snapshots a burst of requests then resumed from, fell under LRU and
never recovered what it had dropped (59.6% against `--eviction lru`'s 60.8%). The clone
is exactly that transition -- the followed ghost at the moment of the switch, ranking by
the new order, fed the same events as every ghost since -- beside the counterfactual of
not switching (the followed ghost itself). There the clone trailed by 1,038 pages after
275 lookups, and the switch was dropped. The clone must lead by the margin a window asks,
counted over the trial's lookups: it has paid the switch's cost, but it is a ghost, off
the cache by a few percent either way (a mix, seed 138: a clone 2.6% of the pages ahead,
taken, and the cache 81 pages under staying; docs/policy.md). The price is time: a
switch that pays is taken ``trial`` lookups late. Two consequences: a trial whose
candidate's own ghost has fallen under the floor's by its end is dropped (taken, the
floor's exit would leave it at the next lookup: on a mix, seed 128, a `probation` trial
that passed then was followed by two exits, to `value` and to `reuse`, 0.8 under LRU), and
the floor's exit goes to the floor, from which any other candidate is tried -- an exit
straight to another candidate would be a switch no clone had tried.

Why a whole window first. On a cold cache the ghosts differ by a few pages over a few
lookups, and the margin, counted in the window's pages, is as small; a lead measured over
120 lookups of a 300-lookup window took the cache into `probation` on a bursty mix; its ghost
then led LRU's by up to half again for 800 lookups, while a run following `probation`
throughout hits 27.8% against LRU's 40.8% (docs/policy.md). The lead is judged over the
span the window names.

Why this has LRU as its floor. Plain LRU is a candidate and its ghost is fed the same
events as the cache. The margin is one-sided around it: leaving LRU takes a lead of the
margin, but a candidate is followed only while its ghost hits at least as much as LRU's
over the window (``floor``; when it falls under, the best candidate lately is taken, as a
switch is paid for either way), so at every lookup the followed policy's ghost hit at
least as much as LRU's over the last window. Without the floor the followed candidate may
trail LRU by up to the margin for good (on a bursty mix one candidate led for a window, was
taken, and then trailed LRU by under 3% for 490 lookups). What remains is the cost of
having switched: after a switch the real cache holds what the *previous* policy kept, and
converges to the new policy's contents within about one turnover of the cache, and what
no ghost sees (docs/policy.md). ``regret`` counts, window by window, the ghost hits
of the window's best candidate minus those of the candidate followed at each lookup -- the
price of choosing online rather than knowing the best policy in advance -- so a run shows
how close to the best it stayed. How
well the ghost of the followed candidate predicts the real cache is measured too
(``ghost_hits`` against the real hits the caller reports).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, Sequence

from hicache.tree.ghost import GhostCache
from hicache.tree.outputs import FloorOrders

if TYPE_CHECKING:
    from hicache.tree.eviction import EvictionStrategy


@dataclass(frozen=True)
class SelectorStats:
    """What the selector saw (pages: whole pages looked up / resumed, summed over lookups)."""

    followed: str                   # the candidate the cache follows now
    switches: int
    lookups: int
    looked_up_pages: int
    ghost_hit_pages: dict[str, int]  # per candidate, over every lookup
    regret_pages: int                # per window: the best candidate's ghost hits - the followed ones'
    followed_hit_pages: int          # each lookup's ghost hits under the candidate followed at it
    window: int
    trials: int = 0                  # switches tried in a clone of the followed ghost


class _Trial:
    """A switch on trial: ``ghost`` is the followed candidate's ghost as it stood when the
    trial began, ranking by the candidate's order since; each lookup adds its hits minus
    the followed ghost's (``lead``; ``sq``, the sum of their squares), its pages looked up
    (``pages``) and the followed ghost's hits (``base``): what the lead is measured against."""

    __slots__ = ("candidate", "ghost", "lead", "sq", "lookups", "pages", "base")

    def __init__(self, candidate: int, ghost: GhostCache):
        self.candidate = candidate
        self.ghost = ghost
        self.lead = self.sq = self.lookups = self.pages = self.base = 0


class PolicySelector:
    """Runs one ghost per candidate and names the one to follow (module docstring)."""

    def __init__(self, candidates: Sequence["EvictionStrategy"], capacity_units: float, snapshot_units: float, *,
                 stateless: bool = False, window: int = 300, margin: float = 0.01, margin_hits: float = 0.0,
                 floor: str | None = None, record_windows: int = 4, z: float = 0.0, trial: int = 0,
                 tails: "EvictionStrategy | None" = None, dead_outputs: int = 0):
        assert candidates, "at least one candidate"
        names = [c.name for c in candidates]
        assert len(set(names)) == len(names), f"candidate names must differ: {names}"
        self.candidates = tuple(candidates)
        self._names = tuple(names)
        self.ghosts = [GhostCache(c, capacity_units, snapshot_units, stateless=stateless) for c in candidates]
        self.window = window
        self.margin = margin
        self.margin_hits = margin_hits
        assert floor is None or floor in names, f"the floor {floor!r} is not a candidate: {names}"
        self._floor = names.index(floor) if floor is not None else None
        # the floor's order once the traffic shows decodes' outputs are never read (`tails`)
        assert dead_outputs >= 0, f"dead_outputs must be a non-negative number of lookups: {dead_outputs}"
        self._outputs: FloorOrders | None = None
        if tails is not None and dead_outputs > 0 and self._floor is not None:
            self._outputs = FloorOrders(self.candidates[self._floor], tails, dead_outputs,
                                        limit=2 * int(capacity_units) + 64)
        assert record_windows >= 1, f"record_windows must be at least 1: {record_windows}"
        self.record = record_windows * window
        assert z >= 0, f"z must be non-negative: {z}"
        self.z = z
        assert trial >= 0, f"trial must be a non-negative number of lookups: {trial}"
        self.trial = trial
        self.trials = 0
        self._trial: _Trial | None = None
        k = len(candidates)
        # over the window, per candidate i: the sum of (h_i - h_followed)^2 over its lookups --
        # the spread a lead over the followed one is judged against (`_clear`); rebuilt from
        # the window at a switch, so a lookup costs O(k), not O(k^2) for every pair
        self._sq = [0] * k
        self.followed = 0
        self.switches = 0
        self.lookups = 0
        self.looked_up_pages = 0
        self.total = [0] * len(candidates)
        self.regret_pages = 0
        self.followed_hit_pages = 0
        self._recent: deque[tuple[int, ...]] = deque()
        self._recent_pages: deque[int] = deque()
        self._sums = [0] * len(candidates)
        self._pages_sum = 0
        self._older: deque[tuple[int, ...]] = deque()   # the record's lookups before the window
        self._record_sums = [0] * len(candidates)        # over the last `record` lookups
        self._record_sq = [0] * len(candidates)          # ... sum of (h_c - h_floor)^2
        self._since = 0           # lookups since the last regret tally
        self._followed_hits = 0   # since then: each lookup's ghost hits under the candidate followed at it

    @property
    def strategy(self) -> "EvictionStrategy":
        return self.candidates[self.followed]

    # -- events (the real cache's, in its order) ---------------------------------------------
    def lookup(self, request: object, keys: Sequence[Hashable], prompt_pages: int | None = None) -> bool:
        """A lease opened for ``keys`` (``prompt_pages``: its prompt's whole pages, see
        :meth:`GhostCache.lookup`); True when the followed candidate changed."""
        hits = tuple(g.lookup(request, keys, prompt_pages) for g in self.ghosts)
        self._followed_hits += hits[self.followed]
        self.followed_hit_pages += hits[self.followed]
        n = len(keys)
        t = self._trial
        if t is not None:
            d = t.ghost.lookup(request, keys, prompt_pages) - hits[self.followed]
            t.lead += d
            t.sq += d * d
            t.lookups += 1
            t.pages += len(keys)
            t.base += hits[self.followed]
        self.lookups += 1
        self.looked_up_pages += n
        for i, h in enumerate(hits):
            self.total[i] += h
            self._sums[i] += h
            self._record_sums[i] += h
        self._pages_sum += n
        self._recent.append(hits)
        self._recent_pages.append(n)
        self._spread(hits, 1)
        self._record_spread(hits, 1)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            self._spread(old, -1)
            for i, h in enumerate(old):
                self._sums[i] -= h
            self._pages_sum -= self._recent_pages.popleft()
            self._older.append(old)
            if len(self._older) + len(self._recent) > self.record:
                gone = self._older.popleft()
                self._record_spread(gone, -1)
                for i, h in enumerate(gone):
                    self._record_sums[i] -= h
        self._since += 1
        if self._since >= self.window:   # one regret tally per window of lookups
            self._since = 0
            self.regret_pages += max(max(self._sums) - self._followed_hits, 0)
            self._followed_hits = 0
        floor_changed = False
        if self._outputs is not None:   # the floor takes its other order: its ghost, and the cache if followed
            order = self._outputs.lookup(request, keys, len(keys) if prompt_pages is None else prompt_pages)
            if order is not None:
                f = self._floor
                assert f is not None
                self.candidates = tuple(order if i == f else c for i, c in enumerate(self.candidates))
                self.ghosts[f].reorder(order)
                floor_changed = self.followed == f
        return self._choose() or floor_changed

    def _spread(self, hits: tuple[int, ...], sign: int) -> None:
        if self.z <= 0:
            return
        f = hits[self.followed]
        for i, h in enumerate(hits):
            self._sq[i] += (h - f) ** 2 * sign

    def _record_spread(self, hits: tuple[int, ...], sign: int) -> None:
        if self.z <= 0 or self._floor is None:
            return
        f = hits[self._floor]
        for i, h in enumerate(hits):
            self._record_sq[i] += (h - f) ** 2 * sign

    def _clear_on_record(self, i: int) -> bool:
        """Candidate i's lead over the floor across the record stands clear of its spread
        (with ``z`` 0, any candidate trusted: the rule before the spread test)."""
        assert self._floor is not None
        if self.z <= 0:
            return True
        return self._stands_clear(self._record_sums[i] - self._record_sums[self._floor], self._record_sq[i])

    def _clear(self, i: int) -> bool:
        """Candidate i's lead over the followed one in the window stands clear of its
        lookups' spread: more than ``z`` standard deviations of a sum of per-lookup
        differences that could have had either sign (docstring above; always, with ``z`` 0)."""
        return self._stands_clear(self._sums[i] - self._sums[self.followed], self._sq[i])

    def _stands_clear(self, lead: int, sq: int) -> bool:
        """A positive ``lead``, a sum of per-lookup differences whose squares sum to ``sq``,
        more than ``z`` standard deviations of such a sum (any positive one, with ``z`` 0)."""
        return lead > 0 and lead * lead > self.z * self.z * sq

    def _choose(self) -> bool:
        if self.lookups < self.window:   # scores over a partial window: too few lookups to judge
            return False
        trusted = self._trusted()
        best = max(trusted, key=lambda i: (self._sums[i], -i))
        if best == self.followed:
            return self._judge_trial(trusted)
        # Under the floor over the window: leave now (a switch is paid for either way), for
        # the best candidate lately among those clearly ahead of the floor over the record,
        # else the floor. Otherwise a switch needs a lead, and one clear of the lookups'
        # spread: whether to pay for a switch at all.
        floor = self._floor
        if floor is not None and self._sums[self.followed] < self._sums[floor]:
            if self.trial > 0:   # to the floor: any other candidate is tried from there
                return self._switch(floor)
            best = max((i for i in trusted if i == floor or self._clear_on_record(i)),
                       key=lambda i: (self._sums[i], -i))
        elif (self._sums[best] - self._sums[self.followed] <= self._lead_needed()
              or not self._clear(best)):
            return self._judge_trial(trusted)
        elif self.trial > 0:
            if self._trial is None:   # try it from where the cache stands before paying for it
                self._trial = _Trial(best, self.ghosts[self.followed].clone(self.candidates[best]))
                self.trials += 1
                return False
            return self._judge_trial(trusted)
        return self._switch(best)

    def _switch(self, to: int) -> bool:
        self.followed = to
        self.switches += 1
        self._trial = None   # it was tried against the candidate followed until now
        self._sq = [0] * len(self.ghosts)   # the window's spreads, now against the new one
        for hits in self._recent:
            self._spread(hits, 1)
        return True

    def _judge_trial(self, trusted: list[int]) -> bool:
        """The trial, once ``trial`` lookups long, is taken if its clone beat the followed
        ghost by the lead a window asks, counted over the trial's lookups, and one clear of
        its spread, else dropped (docstring above: the clone paid the switch's cost, not
        the ghosts' error)."""
        t = self._trial
        if t is None or t.lookups < self.trial:
            return False
        self._trial = None
        c = t.candidate
        if self._floor is not None and self._sums[c] < self._sums[self._floor]:
            return False   # its own ghost is under the floor now: the exit would follow at once
        if c in trusted and t.lead > self._lead_needed(t.pages, t.base) and self._stands_clear(t.lead, t.sq):
            return self._switch(c)
        return False

    def _trusted(self) -> list[int]:
        """The candidates that may be taken: with a floor, those whose ghost hit at least as
        much as the floor's over the record (the floor itself always); else all."""
        if self._floor is None:
            return list(range(len(self.ghosts)))
        bar = self._record_sums[self._floor]
        return [i for i, s in enumerate(self._record_sums) if s >= bar]

    def _lead_needed(self, looked_up: int | None = None, hits: int | None = None) -> float:
        """Ghost hit pages by which a candidate must beat the followed one (docstring above),
        over ``looked_up`` pages where the followed one hit ``hits`` (default: the window)."""
        pages = self.margin * (self._pages_sum if looked_up is None else looked_up)
        if self.margin_hits <= 0:
            return pages
        base = self._sums[self.followed] if hits is None else hits
        return max(min(pages, self.margin_hits * base), pages / 10)

    # The cache's events go to every candidate's ghost and to a running trial's clone.
    def publish(self, request: object, keys: Sequence[Hashable], why: str, snapshot: bool) -> None:
        if self._outputs is not None:
            self._outputs.publish(request, keys, why)
        for g in self.ghosts:
            g.publish(request, keys, why, snapshot)
        if self._trial is not None:
            self._trial.ghost.publish(request, keys, why, snapshot)

    def expect(self, keys: Sequence[Hashable]) -> None:
        for g in self.ghosts:
            g.expect(keys)
        if self._trial is not None:
            self._trial.ghost.expect(keys)

    def release(self, request: object) -> None:
        if self._outputs is not None:
            self._outputs.release(request)
        for g in self.ghosts:
            g.release(request)
        if self._trial is not None:
            self._trial.ghost.release(request)

    def stats(self) -> SelectorStats:
        return SelectorStats(followed=self.strategy.name, switches=self.switches, lookups=self.lookups,
                             looked_up_pages=self.looked_up_pages,
                             ghost_hit_pages=dict(zip(self._names, self.total)),
                             regret_pages=self.regret_pages, followed_hit_pages=self.followed_hit_pages,
                             window=self.window, trials=self.trials)
