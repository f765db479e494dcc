"""The L3 tier of a cache: prefetch into host shadow nodes, back host copies up to L3.

:class:`L3Tier` owns the :class:`~hicache.storage.L3Store`, the
:class:`~hicache.storage.Prefetcher`, the puts in flight, the host copies whose put must be
retried, the prefetches started and not finished, and the fetched host rows waiting for
their worker to settle. It reads and writes host pool *bytes* (put sources, fetch
destinations) but never allocates or frees an id: the facade hands it host rows and takes
back the rows to free.

Prefetch, after a host miss (``match.l3_hashes`` are the hashes past the host hit)::

    pf = cache.prefetch(match)          # lookup runs on a storage worker; never blocks
    ...                                 # (best_effort: give it a step)
    tokens = cache.finish_prefetch(pf)  # plan -> host rows -> fetch -> take (per policy)
                                        # -> insert verified pages as host-only nodes
    lease = cache.load(cache.match(tokens))   # loads them like any host hit

History pages and the snapshot a resume point needs arrive together or are not used (the
prefetcher's rule). Rows the fetch did not fill are freed once the worker has settled. An
open prefetch pins the node its pages will hang below (:meth:`RadixTree.pin`): the node
stays in the tree, though its device copy may still be demoted.

Backup: when a page or snapshot gains a host copy (a D2H ack), its host rows are queued to
L3 with ``put_async``; ``node.l3_put`` marks the rows as read until the put finishes. A put
dropped under backpressure, refused or failed is retried from :meth:`poll` while the
breaker lets writes through and the queue has room, up to ``MAX_PUT_RETRIES`` times. L3
faults never reach the engine: the store counts them and turns them into misses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from hicache.cache.results import L3Counters
from hicache.config import NO_L3, StorageConfig
from hicache.layout import CacheLayout
from hicache.pools import TierPools
from hicache.storage import (L3Config, L3Store, Prefetcher, PrefetchConfig, PrefetchPlan, PrefetchResult, PutTicket,
                             open_backend)
from hicache.tree import RadixTree, Snapshot, TreeNode

MAX_PUT_RETRIES = 3  # a put the backend keeps refusing (not a fault: a full store) gives up


@dataclass(eq=False)
class Prefetch:
    """A prefetch started by :meth:`HiCache.prefetch`; finish it with ``finish_prefetch``."""

    op: Any
    tokens: np.ndarray
    base_pages: int
    page_rows: np.ndarray | None = None
    state_row: int | None = None
    pinned: TreeNode | None = None   # end of the prefix the fetched pages will hang off
    finished: bool = False
    fetch_started: bool = False      # its plan was carried out ahead of finish (start_fetch)
    inserted_tokens: int = 0


@dataclass(eq=False)
class _Put:
    nodes: list[TreeNode] = field(default_factory=list)
    snap: Snapshot | None = None
    snap_node: TreeNode | None = None
    attempt: int = 0        # 0: the first put of these host copies; n: the n-th retry


class PutDone(NamedTuple):
    """A put stopped reading these host copies (whatever its outcome)."""

    nodes: list[TreeNode]
    snap: Snapshot | None


def _rows(rows: np.ndarray | None) -> np.ndarray:
    assert rows is not None, "host rows expected"
    return rows


def _cut_to_landed(result: PrefetchResult, plan: PrefetchPlan | None, landed_pages: int) -> PrefetchResult:
    """``result`` limited to the first ``landed_pages`` pages (see ``finish_prefetch``)."""
    if plan is None or result.usable_pages <= landed_pages:
        return result
    if plan.state_index is not None:
        return dataclasses.replace(result, usable_pages=0, state_ok=False, complete=False, reason="not landed")
    return dataclasses.replace(result, usable_pages=max(0, landed_pages), complete=False, reason="not landed")


class L3Tier:
    """The L3 store and everything in flight to or from it (see module docstring)."""

    def __init__(self, cfg: StorageConfig, layout: CacheLayout, tree: RadixTree, host: TierPools,
                 host_budget_bytes: int, page_bytes: int):
        self._cfg = cfg
        self._tree = tree
        self._host = host
        self._has_state = layout.has_state
        self.counters = L3Counters()
        self._settling: list[Prefetch] = []       # fetched rows awaiting the worker's settle
        self._open: list[Prefetch] = []           # started, not finished: their prefix is pinned
        self._puts: dict[PutTicket, _Put] = {}   # ticket -> what it reads
        self._unstored: dict[TreeNode, int] = {}  # host copies to put again -> retries spent
        self._unstored_snaps: dict[Snapshot, tuple[TreeNode, int]] = {}
        self._foreign: list[PutTicket] = []      # finished puts of L3 admission (not ours)
        self.store: L3Store | None = None
        self.prefetcher: Prefetcher | None = None
        if cfg.url == NO_L3:
            return
        self.store = L3Store(open_backend(cfg.url), layout.fingerprint, cfg.salt,
                             L3Config(auth_key=cfg.auth_key or None))
        pcfg = PrefetchConfig(policy=cfg.prefetch_policy, timeout_s=cfg.prefetch_timeout_s,
                              threshold_pages=max(1, -(-cfg.prefetch_threshold_tokens // layout.page_tokens)),
                              max_host_bytes=max(host_budget_bytes // 2, page_bytes))
        self.prefetcher = Prefetcher.for_layout(self.store, layout, pcfg)

    @property
    def enabled(self) -> bool:
        return self.store is not None

    # -- host rows as buffers ---------------------------------------------------------------
    def _pieces(self, source: str, row: int) -> list[torch.Tensor]:
        """One host row as the pieces of its object, in object order: a view of the row with
        page_first; with layer_first one view per (family, layer) -- no staging copy."""
        host = self._host
        if host.host_layout == "page_first":
            return [host.object_view(source)[row]]
        return [host.view(s.family)[layer, row] for s in host.slots[source] if s.unit_bytes
                for layer in range(s.num_layers)]

    # -- prefetch ---------------------------------------------------------------------------
    def start(self, tokens: np.ndarray, hashes: tuple[bytes, ...], base_pages: int, node: TreeNode) -> Prefetch | None:
        """Start looking up ``hashes`` (pages past ``node``, ``base_pages`` deep); pins ``node``."""
        if self.prefetcher is None or not hashes or self._host.host_layout != "page_first":
            return None  # fetches land straight in host objects; layer_first has none
        self._tree.pin(node)
        op = self.prefetcher.start(list(hashes), need_state=self._has_state)
        pf = Prefetch(op, tokens, base_pages, pinned=node)
        self._open.append(pf)
        return pf

    def await_plan(self, pf: Prefetch, landed_pages: int | None) -> PrefetchPlan | None:
        """Mark ``pf`` finished, wait for its lookup as the policy says (in full with
        ``landed_pages``), and return the fetch plan if there is one to carry out."""
        pf.finished = True
        op = pf.op
        policy = self._cfg.prefetch_policy
        if landed_pages is not None:
            op.wait_planned()
        elif policy != "best_effort":
            op.wait_planned(None if policy == "wait_complete" else self._cfg.prefetch_timeout_s)
        return op.plan if op.status.value == "planned" else None

    def fetch(self, pf: Prefetch, page_rows: np.ndarray, state_row: int | None) -> None:
        """Fetch the plan into these host rows (now the prefetch's until it settles)."""
        pf.page_rows, pf.state_row = page_rows, state_row
        objs = self._host.object_view("page")
        sdst = self._host.object_view("state")[state_row] if state_row is not None else None
        pf.op.fetch([objs[int(r)] for r in page_rows], sdst)

    def abandon(self, pf: Prefetch) -> None:
        """No host rows for the plan: give the fetch up."""
        pf.op.cancel()

    def complete(self, pf: Prefetch, landed_pages: int | None) -> int:
        """Take what arrived, insert it as host-only nodes below the pinned prefix, unpin;
        returns the tokens the prefix now reaches (0 if nothing was added)."""
        op = pf.op
        if landed_pages is not None:
            op.wait()
        result = op.take()
        if landed_pages is not None:
            result = _cut_to_landed(result, op.plan, landed_pages)
        if pf.page_rows is not None:
            self._insert(pf, result)
            self._settling.append(pf)
        self._unpin(pf)
        return pf.inserted_tokens

    def cancel(self, pf: Prefetch) -> None:
        """Give up on a prefetch that will not be finished (releases its memory budget;
        host rows a started fetch holds go back once its worker settles)."""
        if not pf.finished:
            pf.finished = True
            pf.op.cancel()
            if pf.page_rows is not None:
                self._settling.append(pf)
            self._unpin(pf)

    def _unpin(self, pf: Prefetch) -> None:
        node, pf.pinned = pf.pinned, None
        if node is not None:
            self._tree.pin(node, -1)
        if pf in self._open:
            self._open.remove(pf)

    def _insert(self, pf: Prefetch, result: PrefetchResult) -> None:
        n = result.usable_pages
        if n == 0 or pf.page_rows is None:
            return
        P = self._tree.page_tokens
        upto = (pf.base_pages + n) * P
        unused, last, added = self._tree.insert_host(pf.tokens[:upto], pf.page_rows[:n], start_page=pf.base_pages,
                                                     root=None if pf.pinned is None else self._tree.root_of(pf.pinned))
        used = set(pf.page_rows[:n].tolist()) - set(unused.tolist())
        pf.page_rows = np.asarray([r for r in pf.page_rows.tolist() if r not in used], np.int64)
        for node in added:
            node.from_l3 = node.is_shadow   # a page already on the device is no L3 hit
            node.l3_stored = True
        if result.state_ok and pf.state_row is not None and last is not None and last.parent is not None:
            if last.snapshot is None or last.snapshot.empty:
                last.snapshot = Snapshot(host_id=pf.state_row, last_access=self._tree.tick())
                pf.state_row = None
        self.counters.l3_prefetched_pages += len(used)
        pf.inserted_tokens = (pf.base_pages + n) * P if used or not unused.size else 0

    def take_free_rows(self) -> tuple[np.ndarray, list[int]]:
        """Host rows fetches left unused, once their workers settled: the caller frees them."""
        keep, pages, states = [], [], []
        for pf in self._settling:
            if not pf.op.settled:
                keep.append(pf)
                continue
            if pf.page_rows is not None:
                pages.append(pf.page_rows)
            if pf.state_row is not None:
                states.append(pf.state_row)
            pf.page_rows, pf.state_row = np.zeros(0, np.int64), None
        self._settling = keep
        return (np.concatenate(pages) if pages else np.zeros(0, np.int64)), states

    # -- backup to L3 -----------------------------------------------------------------------
    def put_pages(self, nodes: list[TreeNode], *, attempt: int = 0) -> int:
        """Queue the host copies of ``nodes`` not yet in L3; returns objects queued."""
        if self.store is None:
            return 0
        nodes = [n for n in nodes if n.host_ids is not None and not n.l3_stored]
        if not nodes:
            return 0
        hashes = [h for n in nodes for h in n.hashes]
        srcs = [self._pieces("page", int(r)) for n in nodes for r in _rows(n.host_ids)]
        ticket = self.store.put_async(hashes, "page", srcs)
        if ticket.done and ticket.dropped:
            self.counters.l3_put_dropped += 1
            self._remember(nodes, attempt)
            return 0
        for n in nodes:  # the put reads the host rows until it is done
            n.l3_put = ticket
            n.l3_stored = True
        self._puts[ticket] = _Put(nodes=nodes, attempt=attempt)
        return len(hashes)

    def put_snapshot(self, node: TreeNode, snap: Snapshot, *, attempt: int = 0) -> int:
        if self.store is None or snap.host_id is None or snap.put_pending or not node.hashes:
            return 0
        ticket = self.store.put_async([node.hashes[-1]], "state", [self._pieces("state", snap.host_id)])
        if ticket.done and ticket.dropped:
            self.counters.l3_put_dropped += 1
            self._unstored_snaps[snap] = (node, attempt)
            return 0
        snap.put_pending = True
        self._puts[ticket] = _Put(snap=snap, snap_node=node, attempt=attempt)
        return 1

    def _remember(self, nodes: list[TreeNode], attempt: int) -> None:
        for n in nodes:
            if attempt < MAX_PUT_RETRIES:
                self._unstored[n] = max(self._unstored.get(n, 0), attempt)
            else:
                self.counters.l3_put_abandoned += n.num_pages

    def _finish_put(self, put: _Put, ticket: PutTicket) -> PutDone:
        seen: set[int] = set()
        done: list[TreeNode] = []
        for start in put.nodes:
            for n in start.iter_ancestors():  # splits share the ticket with new parents
                if n.l3_put is not ticket or n.node_id in seen:
                    break
                seen.add(n.node_id)
                n.l3_put = None
                n.l3_stored = ticket.ok
                done.append(n)
        if not ticket.ok:
            self._remember([n for n in done if n.on_host], put.attempt)
        if put.snap is not None:
            put.snap.put_pending = False
            if not ticket.ok:
                if put.attempt < MAX_PUT_RETRIES:
                    assert put.snap_node is not None
                    self._unstored_snaps[put.snap] = (put.snap_node, put.attempt)
                else:
                    self.counters.l3_put_abandoned += 1
        self.counters.l3_put_objects += sum(ticket.stored or []) if ticket.ok else 0
        self.counters.l3_put_dropped += bool(ticket.dropped)
        return PutDone(done, put.snap)

    def _retry_puts(self) -> None:
        """Re-queue host copies an earlier put did not store, while L3 takes them.

        Only while the breaker lets writes through and the backup queue has room, so an
        outage costs nothing per step; each copy is retried up to ``MAX_PUT_RETRIES`` times.
        A split leaves the unstored upper part of a node above it: the walk up collects it.
        """
        assert self.store is not None
        room = self.store.backup_room() if (self._unstored or self._unstored_snaps) else 0
        batch: list[TreeNode] = []
        attempt = 0
        while self._unstored and room > 0:
            node = next(iter(self._unstored))
            tries = self._unstored.pop(node)
            for n in node.iter_ancestors():
                if not n.on_host or n.l3_stored or n.l3_put is not None or n in batch:
                    break
                batch.append(n)
                room -= n.num_pages
            attempt = max(attempt, tries + 1)
        if batch:
            self.counters.l3_put_retries += self.put_pages(batch, attempt=attempt)
        while self._unstored_snaps and room > 0:
            snap = next(iter(self._unstored_snaps))
            node, tries = self._unstored_snaps.pop(snap)
            if node.snapshot is snap and node.parent is not None:
                sent = self.put_snapshot(node, snap, attempt=tries + 1)
                self.counters.l3_put_retries += sent
                room -= sent

    def forget(self, removed: list[tuple[TreeNode, TreeNode | None]]) -> None:
        """Nodes that left the tree: an unstored host parent (a split's upper part) inherits
        a removed node's place in the retry queue."""
        for node, parent in removed:
            tries = self._unstored.pop(node, None)
            if (tries is not None and parent is not None and parent.parent is not None and parent.on_host
                    and not parent.l3_stored):
                self._unstored.setdefault(parent, tries)

    # -- progress ---------------------------------------------------------------------------
    def poll(self) -> list[PutDone]:
        """Finish the puts that completed, re-queue failed ones; returns what they read."""
        if self.store is None:
            return []
        done = []
        for ticket in self.store.poll_backups():
            put = self._puts.pop(ticket, None)
            if put is None:
                self._foreign.append(ticket)
            else:
                done.append(self._finish_put(put, ticket))
        self._retry_puts()
        return done

    def take_foreign(self) -> list[PutTicket]:
        """Finished puts this tier did not queue (L3 admission's): the caller settles them."""
        out, self._foreign = self._foreign, []
        return out

    def settle(self) -> list[PutDone]:
        """Wait for every queued put, then :meth:`poll` (a step boundary of a reproducible
        replay: which objects L3 holds when a later lookup runs must not depend on the put
        threads). Fetches are left running: their landing is the caller's clock's."""
        if self.store is None:
            return []
        self.store.flush(None)
        return self.poll()

    def drain(self, timeout: float | None) -> list[PutDone]:
        """Wait for every queued put and every fetch worker, then :meth:`poll`."""
        if self.store is None:
            return []
        self.store.flush(timeout)
        for pf in self._settling:
            pf.op.wait_settled(timeout)
        return self.poll()

    def close(self) -> list[PutDone]:
        """Cancel open prefetches, finish what is in flight (briefly), close the store."""
        if self.store is None:
            return []
        for pf in list(self._open):
            self.cancel(pf)
        done = self.drain(5.0)
        if self.prefetcher is not None:
            self.prefetcher.close()
        self.store.close()
        return done

    # -- what integrity checks and stats read ------------------------------------------------
    def open_prefetches(self) -> list[Prefetch]:
        return list(self._open)

    def held_rows(self) -> tuple[list[int], list[int]]:
        """Host page and state rows fetched and not yet inserted or freed."""
        pages = [int(r) for pf in self._settling for r in _rows(pf.page_rows)]
        states = [pf.state_row for pf in self._settling if pf.state_row is not None]
        return pages, states

    def stats(self) -> dict:
        return {} if self.store is None else self.store.stats(backend=False).to_dict()
