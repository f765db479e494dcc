"""The L3 tier in the facade: prefetch into host shadow nodes, back host copies up to L3.

Prefetch, after a host miss (``match.l3_hashes`` are the hashes past the host hit)::

    pf = cache.prefetch(match)          # lookup runs on a storage worker; never blocks
    ...                                 # (best_effort: give it a step)
    tokens = cache.finish_prefetch(pf)  # plan -> host rows -> fetch -> take (per policy)
                                        # -> insert verified pages as host-only nodes
    lease = cache.load(cache.match(tokens))   # loads them like any host hit

History pages and the snapshot a resume point needs arrive together or are not used (the
prefetcher's rule). Rows the fetch did not fill are freed once the worker has settled.

Backup: when a page or snapshot gains a host copy (a D2H ack), its host row is queued to
L3 with ``put_async``; the row stays host-locked until the put finishes, and a put dropped
under backpressure just unlocks. L3 faults never reach the engine: the store counts them
and turns them into misses (circuit breaker).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from hicache.cache.results import MatchResult
from hicache.storage import L3Store, Prefetcher, PrefetchConfig, open_backend
from hicache.tree import Snapshot, TreeNode

NO_L3 = "none://"


@dataclass(eq=False)
class Prefetch:
    """A prefetch started by :meth:`HiCache.prefetch`; finish it with ``finish_prefetch``."""

    op: object
    tokens: np.ndarray
    base_pages: int
    page_rows: np.ndarray | None = None
    state_row: int | None = None
    pinned: TreeNode | None = None   # end of the prefix the fetched pages will hang off
    finished: bool = False
    inserted_tokens: int = 0


def _cut_to_landed(result, plan, landed_pages: int):
    """``result`` limited to the first ``landed_pages`` pages (see ``finish_prefetch``)."""
    if plan is None or result.usable_pages <= landed_pages:
        return result
    if plan.state_index is not None:
        return dataclasses.replace(result, usable_pages=0, state_ok=False, complete=False, reason="not landed")
    return dataclasses.replace(result, usable_pages=max(0, landed_pages), complete=False, reason="not landed")


@dataclass(eq=False)
class _Put:
    nodes: list[TreeNode] = field(default_factory=list)
    snap: Snapshot | None = None
    snap_node: TreeNode | None = None
    attempt: int = 0        # 0: the first put of these host copies; n: the n-th retry


MAX_PUT_RETRIES = 3  # a put the backend keeps refusing (not a fault: a full store) gives up


class L3Mixin:
    """Prefetch and backup against an :class:`L3Store`; expects HiCache's attributes."""

    def _init_l3(self) -> None:
        cfg = self.config.storage
        self.store: L3Store | None = None
        self.prefetcher: Prefetcher | None = None
        self._prefetch_rows: list[Prefetch] = []   # fetched rows awaiting the worker's settle
        self._open_prefetches: list[Prefetch] = []  # started, not finished: their prefix is pinned
        self._prefetch_pins: dict[TreeNode, int] = {}  # prefix end -> open prefetches below it
        self._puts: dict[int, tuple[object, _Put]] = {}
        # Host copies whose L3 put was dropped, refused or failed, with the retries spent:
        # re-queued from poll() while the breaker is closed and the queue has room.
        self._unstored: dict[TreeNode, int] = {}
        self._unstored_snaps: dict[Snapshot, tuple[TreeNode, int]] = {}
        if cfg.url == NO_L3:
            return
        self.store = L3Store(open_backend(cfg.url), self.layout.fingerprint, cfg.salt)
        pcfg = PrefetchConfig(policy=cfg.prefetch_policy, timeout_s=cfg.prefetch_timeout_s,
                              threshold_pages=max(1, -(-cfg.prefetch_threshold_tokens // self.page_tokens)),
                              max_host_bytes=max(self.pools.plan.host_bytes // 2, self.pools.plan.page_bytes))
        self.prefetcher = Prefetcher.for_layout(self.store, self.layout, pcfg)

    # -- rows as buffers ----------------------------------------------------------------
    def _host_object(self, source: str, row: int) -> torch.Tensor:
        """One host row as a contiguous byte object (a view with page_first, else a copy)."""
        host = self.pools.host
        if host.host_layout == "page_first":
            return host.object_view(source)[row]
        parts = [host.view(s.family)[:, row].reshape(-1) for s in host.slots[source]]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8)

    # -- prefetch -----------------------------------------------------------------------
    def prefetch(self, match: MatchResult) -> Prefetch | None:
        """Start looking up (in L3) the pages past the host hit; None if there is nothing to ask."""
        if self.prefetcher is None or not match.l3_hashes:
            return None
        if self.pools.host.host_layout != "page_first":
            return None  # fetches land straight in host objects; layer_first has none
        base = match.history_tokens // self.page_tokens
        path = self.tree.walk(match.tokens, base)
        if path.num_pages < base:
            return None  # the tree changed since the match: match again
        # Keep the prefix in the tree until the fetched pages are inserted below it:
        # making room for the fetch must not evict the very pages it extends. The pin
        # keeps the node from being *removed* (host eviction, dropping a device-only
        # subtree); it does not hold device pages -- a prefetch waiting for its request to
        # be scheduled must never starve running requests of device room.
        node = self.tree.node_at(path, base)
        if not node.is_root:
            self._prefetch_pins[node] = self._prefetch_pins.get(node, 0) + 1
        op = self.prefetcher.start(list(match.l3_hashes), need_state=self.has_state)
        pf = Prefetch(op, match.tokens, base, pinned=node)
        self._open_prefetches.append(pf)
        return pf

    def _unpin(self, pf: Prefetch) -> None:
        node, pf.pinned = pf.pinned, None
        if node is not None and not node.is_root:
            left = self._prefetch_pins[node] - 1
            if left:
                self._prefetch_pins[node] = left
            else:
                del self._prefetch_pins[node]
        if pf in self._open_prefetches:
            self._open_prefetches.remove(pf)

    def finish_prefetch(self, pf: Prefetch | None, *, landed_pages: int | None = None) -> int:
        """Apply the prefetch policy, insert what arrived as host nodes; returns tokens added.

        ``landed_pages`` is for callers that keep their own clock (a simulator such as the
        reference engine, which decides from bytes and bandwidth what would have arrived
        by now): the lookup and the fetch are then waited for in full, whatever the policy,
        and only the first ``landed_pages`` fetched pages are inserted -- none when the plan
        carries a state snapshot and ``landed_pages`` is short of the whole plan (history
        without its state is of no use). ``None`` (the default): the policy decides.
        """
        if pf is None or pf.finished:
            return 0 if pf is None else pf.inserted_tokens
        pf.finished = True
        op = pf.op
        policy = self.config.storage.prefetch_policy
        if landed_pages is not None:
            op.wait_planned()
        elif policy != "best_effort":
            timeout = None if policy == "wait_complete" else self.config.storage.prefetch_timeout_s
            op.wait_planned(timeout)
        if op.status.value == "planned" and not self._start_fetch(pf):
            op.cancel()
        if landed_pages is not None:
            op.wait()
        result = op.take()
        if landed_pages is not None:
            result = _cut_to_landed(result, op.plan, landed_pages)
        if pf.page_rows is not None:
            self._insert_prefetched(pf, result)
            self._prefetch_rows.append(pf)
            self._free_settled_prefetches()
        self._unpin(pf)
        return pf.inserted_tokens

    def cancel_prefetch(self, pf: Prefetch | None) -> None:
        """Give up on a prefetch that will not be finished (releases its memory budget)."""
        if pf is not None and not pf.finished:
            pf.finished = True
            pf.op.cancel()
            self._unpin(pf)

    def _start_fetch(self, pf: Prefetch) -> bool:
        plan = pf.op.plan
        pages = self._alloc("host", "page", plan.pages)
        if not pages.ok:
            return False
        state = None
        if plan.state_index is not None:
            state = self._alloc("host", "state", 1)
            if not state.ok:
                self._free("host", "page", pages.ids.numpy())
                return False
        pf.page_rows = pages.ids.numpy()
        pf.state_row = int(state.ids[0]) if state is not None else None
        objs = self.pools.host.object_view("page")
        dsts = [objs[int(r)] for r in pf.page_rows]
        sdst = self.pools.host.object_view("state")[pf.state_row] if pf.state_row is not None else None
        pf.op.fetch(dsts, sdst)
        return True

    def _insert_prefetched(self, pf: Prefetch, result) -> None:
        n = result.usable_pages
        if n == 0:
            return
        P = self.page_tokens
        upto = (pf.base_pages + n) * P
        unused, last, added = self.tree.insert_host(pf.tokens[:upto], pf.page_rows[:n], start_page=pf.base_pages)
        used = set(pf.page_rows[:n].tolist()) - set(unused.tolist())
        pf.page_rows = np.asarray([r for r in pf.page_rows.tolist() if r not in used], np.int64)
        for node in added:
            node.from_l3 = node.is_shadow   # a page already on the device is no L3 hit
            node.l3_stored = True
        if result.state_ok and pf.state_row is not None and last is not None and last.parent is not None:
            if last.snapshot is None or last.snapshot.empty:
                last.snapshot = Snapshot(host_id=pf.state_row, last_access=self.tree.tick())
                pf.state_row = None
        self.counters.l3_prefetched_pages += len(used)
        pf.inserted_tokens = (pf.base_pages + n) * P if used or not unused.size else 0

    def _free_settled_prefetches(self) -> None:
        keep = []
        for pf in self._prefetch_rows:
            if not pf.op.settled:
                keep.append(pf)
                continue
            self._free("host", "page", pf.page_rows)
            if pf.state_row is not None:
                self._free("host", "state", [pf.state_row])
            pf.page_rows, pf.state_row = np.zeros(0, np.int64), None
        self._prefetch_rows = keep

    # -- backup to L3 -------------------------------------------------------------------
    def _l3_put_pages(self, nodes: list[TreeNode], *, attempt: int = 0) -> int:
        """Queue the host copies of ``nodes`` not yet in L3; returns objects queued."""
        if self.store is None:
            return 0
        nodes = [n for n in nodes if n.host_ids is not None and not n.l3_stored]
        if not nodes:
            return 0
        hashes = [h for n in nodes for h in n.hashes]
        srcs = [self._host_object("page", int(r)) for n in nodes for r in n.host_ids]
        ticket = self.store.put_async(hashes, "page", srcs)
        if ticket.done and ticket.dropped:
            self.counters.l3_put_dropped += 1
            self._remember_unstored(nodes, attempt)
            return 0
        for n in nodes:  # pin the host rows until the put has read them
            n.l3_put = ticket
            n.lock_host += 1
            n.l3_stored = True
        self._puts[id(ticket)] = (ticket, _Put(nodes=nodes, attempt=attempt))
        return len(hashes)

    def _l3_put_snapshot(self, node: TreeNode, snap: Snapshot, *, attempt: int = 0) -> int:
        if self.store is None or snap.host_id is None or snap.put_pending or not node.hashes:
            return 0
        src = self._host_object("state", snap.host_id)
        ticket = self.store.put_async([node.hashes[-1]], "state", [src])
        if ticket.done and ticket.dropped:
            self.counters.l3_put_dropped += 1
            self._unstored_snaps[snap] = (node, attempt)
            return 0
        snap.put_pending = True
        self._puts[id(ticket)] = (ticket, _Put(snap=snap, snap_node=node, attempt=attempt))
        return 1

    def _remember_unstored(self, nodes: list[TreeNode], attempt: int) -> None:
        for n in nodes:
            if attempt < MAX_PUT_RETRIES:
                self._unstored[n] = max(self._unstored.get(n, 0), attempt)
            else:
                self.counters.l3_put_abandoned += n.num_pages

    def _finish_put(self, put: _Put, ticket) -> None:
        seen: set[int] = set()
        failed: list[TreeNode] = []
        for start in put.nodes:
            for n in start.iter_ancestors():  # splits share the ticket with new parents
                if n.l3_put is not ticket or n.node_id in seen:
                    break
                seen.add(n.node_id)
                n.l3_put = None
                n.lock_host -= 1
                n.l3_stored = ticket.ok
                if not ticket.ok:
                    failed.append(n)
                if n in self._release_after_put:  # loaded while this put read the host rows
                    self._release_after_put.discard(n)
                    self._release_host_copy(n)
        self._remember_unstored([n for n in failed if n.on_host], put.attempt)
        if put.snap is not None:
            put.snap.put_pending = False
            if not ticket.ok:
                if put.attempt < MAX_PUT_RETRIES:
                    self._unstored_snaps[put.snap] = (put.snap_node, put.attempt)
                else:
                    self.counters.l3_put_abandoned += 1
            if put.snap in self._release_after_put:
                self._release_after_put.discard(put.snap)
                self._release_host_snapshot(put.snap)
            self._settle_orphan(put.snap)
        self.counters.l3_put_objects += sum(ticket.stored or []) if ticket.ok else 0
        self.counters.l3_put_dropped += bool(ticket.dropped)

    def _retry_l3_puts(self) -> None:
        """Re-queue host copies an earlier put did not store, while L3 takes them.

        Only while the breaker is closed and the backup queue has room, so an outage
        costs nothing per step; each copy is retried up to ``MAX_PUT_RETRIES`` times (a
        backend that refuses values, a full store, must not be asked forever). A split
        leaves the unstored upper part of a node above it: the walk up collects it too.
        """
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
            self.counters.l3_put_retries += self._l3_put_pages(batch, attempt=attempt)
        while self._unstored_snaps and room > 0:
            snap = next(iter(self._unstored_snaps))
            node, tries = self._unstored_snaps.pop(snap)
            if node.snapshot is snap and node.parent is not None:
                sent = self._l3_put_snapshot(node, snap, attempt=tries + 1)
                self.counters.l3_put_retries += sent
                room -= sent

    def _forget_unstored(self, node: TreeNode) -> None:
        """``node`` leaves the tree: an unstored host parent (a split's upper part) inherits
        its place in the retry queue."""
        tries = self._unstored.pop(node, None)
        parent = node.parent
        if (tries is not None and parent is not None and not parent.is_root and parent.on_host
                and not parent.l3_stored):
            self._unstored.setdefault(parent, tries)

    def _poll_l3(self) -> None:
        if self.store is None:
            return
        for ticket in self.store.poll_backups():
            entry = self._puts.pop(id(ticket), None)
            if entry is not None:
                self._finish_put(entry[1], ticket)
        self._retry_l3_puts()
        self._free_settled_prefetches()

    def _drain_l3(self, timeout: float | None) -> None:
        if self.store is None:
            return
        self.store.flush(timeout)
        for pf in self._prefetch_rows:
            pf.op.wait_settled(timeout)
        self._poll_l3()

    def _close_l3(self) -> None:
        if self.store is None:
            return
        for pf in list(self._open_prefetches):
            self.cancel_prefetch(pf)
        self._drain_l3(5.0)
        self.prefetcher.close()
        self._free_settled_prefetches()
        self.store.close()

    def l3_stats(self) -> dict:
        if self.store is None:
            return {}
        return self.store.stats(backend=False).to_dict()
