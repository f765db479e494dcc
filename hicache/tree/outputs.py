"""Do later prompts read a decode's output? Counted from page keys, apart from every tree.

Why. What a finished request leaves behind past its prompt -- the decode's pages and the
state at their end (a ``finish`` snapshot) -- is worth keeping only if a later prompt goes
*through* that output: a chat whose next turn carries the previous answer, an agent whose
next step carries its tool call. Where the next turn resumes at the previous *prompt's*
end instead (a trace of block hashes without conversation ids, a reasoning model whose
template drops the thinking), no prompt ever reads it, and plain LRU spends a share of
the cache on bytes no hit can use: on ShareGPT without conversation ids up to 2.5 points
of hit rate at the same bytes, enough to leave hicache's LRU under kvcache-simulator's
(which caches prompts only). The selector's floor drops such tails first once the traffic
has *shown* that shape (:class:`~hicache.tree.selector.PolicySelector`, ``tails``).

The evidence must not come from a tree: a tree that drops idle tails first holds no
output for the next turn to go through, and would confirm its own rule. So this counts
from page keys alone, remembering where each recent decode left its prompt::

    finish publish   keys k_0 .. k_{p-1} | k_p .. k_n     (p = the prompt's whole pages)
                     remember  k_{p-1} -> {k_p}           (the prompt's last page -> the
                                                           decode's first)
    lookup keys q_0 .. q_m, over every i < m with q_i remembered:
        some q_{i+1} in its set  through   the prompt went on into a decode's output
        else, any such i         around    it went on past a decode's start, never into one
    (a prompt that ends at a remembered page repeats it: neither)

``dead`` holds once ``needed`` lookups went around and none ever went through; the first
that goes through ends it for good (traffic that mixes the two shapes ends on plain
LRU). ``needed`` is a confidence, not a tuning: were one continuation in five to go
through, 32 in a row going around would happen 0.8^32 < 0.1% of the time. A decode
shorter than a page leaves no key of its own and is not counted. Memory: the decodes'
starts of the last ``limit`` prompt ends (a cache of C pages holds at most C decode
tails), at most ``PER_PROMPT`` per prompt end (a prompt sampled many times keeps its
newest).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Hashable, Sequence

if TYPE_CHECKING:
    from hicache.tree.eviction import EvictionStrategy

PER_PROMPT = 64   # decodes remembered per prompt end


class OutputEvidence:
    """Counts prompts that went into a decode's output (``through``) or past its start
    without entering it (``around``); ``dead`` says outputs are shown never to be read."""

    def __init__(self, needed: int, limit: int):
        assert needed >= 1, f"needed must be a positive number of lookups: {needed}"
        assert limit >= 1, f"limit must be a positive number of decodes: {limit}"
        self.needed = needed
        self.limit = limit
        self.through = 0
        self.around = 0
        # prompt's last page -> its decodes' first pages (an ordered set, newest last)
        self._starts: OrderedDict[Hashable, dict[Hashable, None]] = OrderedDict()

    @property
    def dead(self) -> bool:
        """No prompt went into a decode's output, and ``needed`` went around one."""
        return self.through == 0 and self.around >= self.needed

    def finished(self, keys: Sequence[Hashable], prompt_pages: int) -> None:
        """A request published ``keys`` at its decode's end; the first ``prompt_pages`` are
        its prompt's."""
        if prompt_pages < 1 or len(keys) <= prompt_pages:
            return   # no whole page of its own past the prompt, or none of the prompt's
        end = keys[prompt_pages - 1]
        starts = self._starts.get(end)
        if starts is None:
            starts = self._starts[end] = {}
            if len(self._starts) > self.limit:
                self._starts.popitem(last=False)
        else:
            self._starts.move_to_end(end)
        starts.pop(keys[prompt_pages], None)
        starts[keys[prompt_pages]] = None
        if len(starts) > PER_PROMPT:   # one prompt decoded many ways: its oldest decodes go
            del starts[next(iter(starts))]

    def lookup(self, keys: Sequence[Hashable]) -> None:
        """A prompt of page keys ``keys`` was looked up."""
        if self.through or not self._starts:
            return   # settled for good, or nothing to go through yet
        starts = self._starts
        past = False
        for i in range(len(keys) - 1):
            nxt = starts.get(keys[i])
            if nxt is not None:
                if keys[i + 1] in nxt:
                    self.through += 1
                    return
                past = True
        self.around += past


class FloorOrders:
    """The selector floor's two orders and the evidence that picks between them: ``plain``
    until the evidence shows outputs unread, ``tails`` from then on, ``plain`` again for
    good once a prompt goes through one. Fed the cache's lookups, finish publishes and
    releases (a request's prompt pages are needed to tell its decode's pages apart)."""

    def __init__(self, plain: "EvictionStrategy", tails: "EvictionStrategy", needed: int, limit: int):
        self.evidence = OutputEvidence(needed, limit)
        self._orders = (plain, tails)
        self._prompt_pages: dict[object, int] = {}   # request -> its prompt's whole pages

    def lookup(self, request: object, keys: Sequence[Hashable], prompt_pages: int) -> "EvictionStrategy | None":
        """A lease opened for ``keys``; the floor's new order if the evidence just settled
        either way, else None."""
        self._prompt_pages[request] = prompt_pages
        ev = self.evidence
        was = ev.dead
        ev.lookup(keys)
        return None if ev.dead == was else self._orders[ev.dead]

    def publish(self, request: object, keys: Sequence[Hashable], why: str) -> None:
        if why == "finish" and request in self._prompt_pages:
            self.evidence.finished(keys, self._prompt_pages[request])

    def release(self, request: object) -> None:
        self._prompt_pages.pop(request, None)
