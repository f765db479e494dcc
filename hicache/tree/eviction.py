"""Eviction order per tier, with a pluggable strategy.

Victims are chosen leaf-first among unlocked nodes, lowest priority first::

    device tier: nodes on the device, no child on the device, no lock, no copy in flight
    host tier:   nodes on the host only (no device copy), no children, no lock, no copy
                 in flight, no locked snapshot at their end

After the caller evicts a victim its parent may become eligible; it then joins the order
at once, so one pass evicts a whole cold branch bottom-up.

Dead tails go first. With state families (hybrid models) a request can only resume at a
boundary that has a snapshot, so a childless node whose end has none (its snapshot was
evicted or never kept) can never be a resume point: its pages serve no hit. Such nodes are
evicted before any live one, whatever the strategy says; layouts without state have no
snapshots at all, so for them every node ranks alike and the strategy alone decides::

    key = (has children or a snapshot at its end, strategy.node_priority(node), node_id)

The order is not computed here: the tree keeps it current as nodes change
(:mod:`hicache.tree.order`), so each victim costs O(log n) whatever the tree's size. The
functions below are the entry points the cache calls.

A strategy is the pluggable part: an object with a ``name`` and two priority functions
(smaller is evicted first). They may read any field of the node or snapshot; the order
recomputes them on every change the tree observes (access, lock, residency, copies,
snapshot changes). A value-aware policy (a score per page run and per snapshot, e.g.
expected hits per byte) plugs in here; since page runs and snapshots are then ranked on
one scale, a caller wanting one budget across both merges ``device_victims`` and
``snapshot_victims`` by that priority.
"""


from __future__ import annotations

from typing import Callable, Iterator, Protocol

from hicache.errors import ConfigError
from hicache.tree.node import Snapshot, TreeNode
from hicache.tree.radix import RadixTree


class RankedSnapshot(Protocol):
    """What a strategy may read of a snapshot (a tree's :class:`Snapshot`, or a ghost's)."""

    @property
    def last_access(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def resumed(self) -> int: ...
    @property
    def passed(self) -> int: ...
    @property
    def expected(self) -> bool: ...


class RankedNode(Protocol):
    """What a strategy may read of a node (a tree's :class:`TreeNode`, or a ghost's page)."""

    @property
    def last_access(self) -> float: ...
    @property
    def hit_count(self) -> int: ...
    @property
    def depth(self) -> int: ...
    @property
    def branches(self) -> int: ...
    @property
    def forked(self) -> bool: ...
    @property
    def snapshots_below(self) -> int: ...
    @property
    def decoded(self) -> bool: ...


class EvictionStrategy(Protocol):
    """Orders victims: the smallest priority is evicted first.

    ``name`` identifies the strategy: one tree keeps one order per (strategy type, name),
    so two instances of a type with the same name must rank alike.
    """

    name: str

    def node_priority(self, node: RankedNode) -> tuple: ...

    def snapshot_priority(self, node: RankedNode, snap: RankedSnapshot) -> tuple: ...


class AccessStrategy:
    """A strategy over access time and hit count only: ``priority(last_access, hit_count)``."""

    name = "access"
    refresh_forks = False   # a request passing a branch point's snapshot does not count as using it

    def priority(self, last_access: float, hit_count: int) -> tuple:
        raise NotImplementedError

    def node_priority(self, node: RankedNode) -> tuple:
        return self.priority(node.last_access, node.hit_count)

    def snapshot_priority(self, node: RankedNode, snap: RankedSnapshot) -> tuple:
        return self.priority(snap.last_access, 0)


class LRU(AccessStrategy):
    """Least recently used first."""

    name = "lru"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        return (last_access,)


class LFU(AccessStrategy):
    """Least frequently used first; ties broken by age."""

    name = "lfu"

    def priority(self, last_access: float, hit_count: int) -> tuple:
        return (hit_count, last_access)


class Ranked:
    """Recency within classes, each class rule a switch: the candidates of ``adaptive``.

    Every rule is about what a snapshot has been *used* for, read off fields the tree keeps
    (``Snapshot.resumed`` / ``passed`` / ``kind``, the node's fan-out and
    ``snapshots_below``), so a candidate ranks by observed reuse instead of assuming one
    shape of traffic::

        snapshot   (0 if a rule below puts it first | 1 | 2 branch point (forks_last),  last_access)
        page run   (1, last_access)                    (dead tails first: the tree's order)

        superseded_first     a request resumed from it or passed it, a request's prompt
                             went on past it (exactly one branch taken, ``branches == 1``,
                             no fork) and a deeper snapshot hangs below: the chain moved on
                             past it, the way a conversation's next turn publishes deeper.
                             A decode's tail below it does not count (``decoded`` children
                             are not branches): a repeated prompt resumes at it and leaves
                             its own idle tail there, and the next repeat needs it again;
                             ``passed_only``: only a request that went *through* it to a
                             deeper point counts (resuming exactly there does not)
        idle_tails_first     offered at a decode's end (``kind == "finish"``) and no
                             request has resumed from or passed it yet, nor has a queued
                             one been seen to resume there (``expected``): where the next
                             request resumes at the previous *prompt's* end (a reasoning
                             model's template drops the thinking, a trace without
                             conversation ids), a decode's pages and state are never read
        intermediate_first   a deeper snapshot hangs below on its only path, used or not
                             (the old ``value`` rule: right when each turn continues
                             through the previous output, wrong when it does not)
        forks_last           a branch point (two children or more) ranks after every page
                             run and other snapshot; ``refresh_forks``: a request passing a
                             branch point's snapshot (or one that was, ``forked``) on its
                             way deeper counts as using it
        probation            a page run no request has resumed through (``hit_count`` 0)
                             and a snapshot nobody resumed from, passed or is queued to
                             resume from rank in class
                             0.5: after what the rules above put first, before everything
                             that was reused. Admission by rank (segmented LRU): on traffic
                             where most chains are used once (production), what never
                             came back goes before what did; on chat it drops each new
                             turn before its first reuse, so it is never a fixed default,
                             only a candidate the selector follows where its ghost leads
                             (``probation``, among the default candidates)
        decoded_first        (layouts without state: ``idle_tails_first`` there) a page run
                             a decode published that no request has gone through yet
                             (``TreeNode.decoded``) ranks in class 0. Without state there
                             is no snapshot to carry ``idle_tails_first``, and a decode's
                             pages are the whole of an idle tail: where no later prompt
                             enters a decode's output (a trace without conversation ids,
                             a template that drops the thinking) they hold bytes no hit
                             ever reads. With state the snapshot rule already does it (the
                             tail goes dead when its snapshot goes), so it stays off there

    With every switch off it ranks exactly as :class:`LRU` does. Which candidate suits the
    traffic is not decided here: :class:`~hicache.tree.selector.PolicySelector` runs each
    in a ghost of the cache and the cache follows the one that hit most lately.
    """

    def __init__(self, name: str, *, superseded_first: bool = False, idle_tails_first: bool = False,
                 intermediate_first: bool = False, forks_last: bool = False, refresh_forks: bool = False,
                 passed_only: bool = False, probation: bool = False, decoded_first: bool = False):
        self.name = name
        self.decoded_first = decoded_first
        self.probation = probation
        self.superseded_first = superseded_first
        self.idle_tails_first = idle_tails_first
        self.intermediate_first = intermediate_first
        self.forks_last = forks_last
        self.refresh_forks = refresh_forks
        self.passed_only = passed_only

    def node_priority(self, node: RankedNode) -> tuple:
        if self.decoded_first and node.decoded:
            return (0, node.last_access)
        return (0.5 if self.probation and node.hit_count == 0 else 1, node.last_access)

    def snapshot_priority(self, node: RankedNode, snap: RankedSnapshot) -> tuple:
        nb = node.branches
        if self.forks_last and nb >= 2:
            return (2, snap.last_access)
        if node.snapshots_below > 0 and nb <= 1 and not node.forked:
            if self.intermediate_first or (self.superseded_first and nb == 1
                                           and (snap.passed if self.passed_only else (snap.resumed or snap.passed))):
                return (0, snap.last_access)
        if (self.idle_tails_first or self.probation) and not (snap.resumed or snap.passed or snap.expected):
            if self.idle_tails_first and snap.kind == "finish":
                return (0, snap.last_access)
            if self.probation:
                return (0.5, snap.last_access)
        return (1, snap.last_access)

    def first_class(self, node: RankedNode, snap: RankedSnapshot) -> bool:
        """Does a rule put this snapshot first (so it is not worth a host copy)?"""
        return self.snapshot_priority(node, snap)[0] == 0


class Value(Ranked):
    """Recency within value classes: what a victim's bytes still protect decides first.

    A snapshot is *intermediate* when a deeper snapshot hangs below it on its node's only
    path (``node.snapshots_below`` > 0, at most one child): a request that reaches it almost
    always goes on to the deeper resume point, as a multi-turn conversation resumes at its
    latest turn, so its bytes protect little that the deeper one does not. Intermediate
    snapshots go first. A snapshot at a *branch point* (two or more children: requests
    diverged there, e.g. a task prompt shared by its rollouts) goes last: every branch below
    it, and every new one, resumes there, while its own access time only says when a request
    last resumed exactly there (agentic traces: +0.6 points at the tightest budget over
    ranking it with the leaves). Between them, the snapshot at the end of a path (the newest
    turn) ranks with the page runs, and so does a *former* branch point: a node where
    requests once diverged (``node.forked``) whose other branches have since been evicted.
    It is not intermediate, though it has one child and a deeper snapshot below: the next
    request to leave the path there (a new task on a shared system prompt) resumes at it.
    Ranked as intermediate, it went first, and every new task on a prompt whose other tasks
    had gone recomputed the whole prompt (agentic traces: +1.0 to +1.4 points at the
    tightest budget with this rule)::

        snapshot  (0 intermediate | 1 end of a path | 2 branch point,  last_access)
        page run  (1,                                                   last_access)

    Its rules hold when each turn continues through the previous turn's output; where the
    next request resumes at the previous *prompt's* end, the prompt's snapshot is
    "intermediate" (the decode's lies below it) and goes first though it is the one the
    next turn needs. The rules that look at what requests were *seen* to use are
    ``reuse`` / ``reuse-prompt`` (:class:`Ranked`); ``adaptive`` chooses between them.
    """

    def __init__(self) -> None:
        super().__init__("value", intermediate_first=True, forks_last=True, refresh_forks=True)

    @staticmethod
    def intermediate(node: RankedNode) -> bool:
        """A deeper snapshot hangs below ``node`` on its only path, and no request ever
        left that path here (``node.forked``)."""
        return node.snapshots_below > 0 and node.branches <= 1 and not node.forked


# The named candidates of ``eviction: adaptive`` (each also usable alone as ``eviction``),
# and ``lru-tails``: the order ``adaptive``'s LRU floor takes once the traffic shows that no
# prompt reads a decode's output (:mod:`hicache.tree.outputs`); not an ``eviction`` of its
# own, since alone nothing would turn it off where outputs are read.
CANDIDATES: dict[str, dict[str, bool]] = {
    "lru-tails": {"idle_tails_first": True},
    "reuse": {"superseded_first": True, "forks_last": True, "refresh_forks": True},
    "reuse-prompt": {"superseded_first": True, "idle_tails_first": True},
    "reuse-prompt-late": {"superseded_first": True, "passed_only": True, "idle_tails_first": True},
    # reuse-prompt plus admission by rank (a default candidate of adaptive, not a fixed default)
    "probation": {"superseded_first": True, "idle_tails_first": True, "probation": True},
}


STRATEGIES: dict[str, type] = {"lru": LRU, "lfu": LFU, "value": Value}


def get_strategy(name: str | EvictionStrategy, *, stateless: bool = False) -> EvictionStrategy:
    """The strategy called ``name`` (a strategy object is returned as it is).

    ``stateless``: for a layout without state (MHA, MLA), where a candidate's
    ``idle_tails_first`` ranks a decode's idle pages first (``decoded_first``) since there is
    no snapshot to carry it. A tree is stateless or not for its whole life, so one name
    still ranks alike within a tree."""
    if not isinstance(name, str):
        return name
    if name in CANDIDATES:
        rules = CANDIDATES[name]
        return Ranked(name, **rules, decoded_first=stateless and rules.get("idle_tails_first", False))
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ConfigError("eviction", name, f"must be one of {sorted([*STRATEGIES, *CANDIDATES])}") from None


def device_victims(tree: RadixTree, strategy: EvictionStrategy,
                   busy: Callable[[TreeNode], bool] | None = None) -> Iterator[TreeNode]:
    """Nodes whose device pages may go, coldest first (the caller demotes or drops each).

    ``busy`` (optional) passes over more nodes, each checked as it comes up; the tree
    already leaves out every node whose copies are in flight.
    """
    return tree.eviction_order(strategy).device_victims(busy)


def host_victims(tree: RadixTree, strategy: EvictionStrategy) -> Iterator[TreeNode]:
    """Host-only leaves whose host pages may go, coldest first (the caller removes each)."""
    return tree.eviction_order(strategy).host_victims()


def snapshot_victims(tree: RadixTree, strategy: EvictionStrategy, tier: str) -> Iterator[tuple[TreeNode, Snapshot]]:
    """Unlocked snapshots holding a ``tier`` copy, coldest first.

    On the host, only snapshots without a device copy are candidates (the device copy is
    the one in use; its host copy is its backup).
    """
    return tree.eviction_order(strategy).snapshot_victims(tier)
