"""Pools without bytes (``bytes_mode="none"``) and their transfer controller, in lockstep
with pools that hold bytes: every allocation, arena move, queued copy, refusal, failure and
ack is the same, the stats count the same bytes, and ``check_integrity()`` holds after
every rule -- nothing but the bytes is missing.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hicache.errors import MisuseError
from hicache.pools import PoolConfig, PoolPlan, TieredPools, TierPools, build_pools, plan_pools
from hicache.transfer import CopyHandle, QueueFull, TransferConfig, TransferController
from hicache.layout import CacheLayout
from tests.transfer.conftest import CONFIGS, tiny_layout

TIERS = ("device", "host")
SOURCES = ("page", "state")
DIR_TIERS = {"d2h": ("device", "host"), "h2d": ("host", "device")}
STAT_KEYS = ("bytes", "launched_bytes", "ops", "batches", "launches", "failures")


def twin_pools(device: str, host_arena: bool) -> TieredPools:
    """Split device pools and a host arena (as ``shared_host`` builds), on ``device``."""
    layout = tiny_layout()
    page, snap = layout.object_bytes("page"), layout.object_bytes("state")
    dev = TierPools(layout, "device", num_pages=6, num_snapshots=4, device=device)
    if host_arena:
        host = TierPools(layout, "host", arena_bytes=8 * page + 2 * snap, device=device)
    else:
        host = TierPools(layout, "host", num_pages=8, num_snapshots=5, host_layout="page_first", device=device)
    plan = PoolPlan(6, 4, host.capacity("page"), host.capacity("state"), page, snap)
    return TieredPools(layout, plan, dev, host)


def result(r):
    """What an alloc / backup / load / copy decided, comparable across the twins."""
    if isinstance(r, CopyHandle):
        return ("queued", r.seq, r.kind, r.dst_ids.tolist())
    if isinstance(r, QueueFull):
        return ("queue_full", r.queued_ops, r.queued_bytes, r.requested_bytes)
    if not r.ok:
        return ("no_room", r.requested, r.available, r.blocked_by)
    return ("ids", r.ids.tolist())


class TwinMachine(RuleBasedStateMachine):
    """One machine, two caches' worth of pools and controllers: ``real`` and ``none``."""

    host_arena = True
    granularity = "layer"

    def __init__(self):
        super().__init__()
        self.pools = {m: twin_pools("cpu" if m == "real" else "meta", self.host_arena) for m in ("real", "none")}
        assert self.pools["real"].holds_bytes and not self.pools["none"].holds_bytes
        self.ctl = {m: TransferController(p, TransferConfig(max_queued_ops=6, load_granularity=self.granularity),
                                          fault_injector=self._inject)
                    for m, p in self.pools.items()}
        assert self.ctl["none"].backend == "none"
        self.used = {(t, s): set() for t in TIERS for s in SOURCES}   # allocated ids (same in both)
        self.unacked: dict[int, tuple] = {}   # seq -> (direction, source, src, dst, owns)
        self.handles: dict[str, list] = {"real": [], "none": []}
        self.counter = 0

    @staticmethod
    def _inject(point):
        if any(tag[1] for tag in point.tags):
            raise RuntimeError("injected")

    def both(self, call):
        """``call(mode)`` on each twin; the two outcomes must be the same."""
        out = {m: call(m) for m in ("real", "none")}
        assert result(out["real"]) == result(out["none"]), out
        return out["real"], out

    def busy(self, tier, source):
        out = set()
        for direction, s, src, dst, _ in self.unacked.values():
            if s == source:
                st_, dt_ = DIR_TIERS[direction]
                out |= set(src) if st_ == tier else set()
                out |= set(dst) if dt_ == tier else set()
        return out

    def pick(self, data, ids, k, label):
        ids = sorted(ids)
        if not ids:
            return []
        return data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=k, unique=True), label=label)

    def queued(self, handles, direction, source, src, dst, owns):
        for m, h in handles.items():
            self.handles[m].append(h)
        seq = handles["real"].seq
        self.unacked[seq] = (direction, source, list(src), list(dst), owns)
        if owns:
            self.used[(DIR_TIERS[direction][1], source)] |= set(dst)

    def process(self):
        acks = {m: c.poll() for m, c in self.ctl.items()}
        key = [(a.seq, a.tag, a.kind, a.direction, a.source, a.src_ids.tolist(), a.dst_ids.tolist(), a.ok, a.error)
               for a in acks["real"]]
        assert key == [(a.seq, a.tag, a.kind, a.direction, a.source, a.src_ids.tolist(), a.dst_ids.tolist(), a.ok,
                        a.error) for a in acks["none"]]
        for a in acks["real"]:
            direction, source, _, dst, owns = self.unacked.pop(a.seq)
            if not a.ok and owns:
                self.used[(DIR_TIERS[direction][1], source)] -= set(dst)

    # -- rules ----------------------------------------------------------------------------
    @rule(tier=st.sampled_from(TIERS), source=st.sampled_from(SOURCES), n=st.integers(1, 3))
    def alloc(self, tier, source, n):
        r, _ = self.both(lambda m: self.pools[m].tier(tier).alloc(source, n))
        if r.ok:
            self.used[(tier, source)] |= set(r.ids.tolist())

    @rule(data=st.data(), direction=st.sampled_from(["d2h", "h2d"]), source=st.sampled_from(SOURCES),
          fail=st.booleans())
    def backup_or_load(self, data, direction, source, fail):
        src = self.pick(data, self.used[(DIR_TIERS[direction][0], source)], 3, "src")
        if not src:
            return
        fail = fail and data.draw(st.integers(0, 3)) == 0
        tag = (self.counter, fail)
        self.counter += 1
        h, out = self.both(lambda m: (self.ctl[m].backup if direction == "d2h" else self.ctl[m].load)(
            src, source=source, tag=tag))
        if isinstance(h, CopyHandle):
            self.queued(out, direction, source, src, h.dst_ids.tolist(), owns=True)

    @rule(data=st.data(), direction=st.sampled_from(["d2h", "h2d"]), source=st.sampled_from(SOURCES),
          fail=st.booleans())
    def copy(self, data, direction, source, fail):
        src_t, dst_t = DIR_TIERS[direction]
        src = self.pick(data, self.used[(src_t, source)], 3, "src")
        dst = self.pick(data, self.used[(dst_t, source)] - self.busy(dst_t, source), len(src) or 1, "dst")
        if not src or not dst:
            return
        src = src[: len(dst)]
        tag = (self.counter, fail and data.draw(st.integers(0, 3)) == 0)
        self.counter += 1
        h, out = self.both(lambda m: self.ctl[m].copy(direction, source, src, dst, tag=tag))
        if isinstance(h, CopyHandle):
            self.queued(out, direction, source, src, dst, owns=False)

    @rule(data=st.data(), tier=st.sampled_from(TIERS), source=st.sampled_from(SOURCES))
    def free(self, data, tier, source):
        chosen = self.pick(data, self.used[(tier, source)] - self.busy(tier, source), 2, "free")
        if chosen:
            for p in self.pools.values():
                p.tier(tier).free(source, chosen)
            self.used[(tier, source)] -= set(chosen)

    @precondition(lambda self: self.host_arena and not self.unacked)
    @rule(source=st.sampled_from(SOURCES), k=st.integers(1, 3))
    def compact(self, source, k):
        """Arena compaction: the same moves, the same ids afterwards; only ``real`` copies."""
        moves = {m: p.host.compaction_moves(source, k) for m, p in self.pools.items()}
        assert moves["real"] == moves["none"]
        if moves["real"]:
            old, new = [a for a, _ in moves["real"]], [b for _, b in moves["real"]]
            for p in self.pools.values():
                p.host.move(source, old, new)
            self.used[("host", source)] = (self.used[("host", source)] - set(old)) | set(new)

    @rule()
    def step(self):
        reports = {m: c.step() for m, c in self.ctl.items()}
        assert reports["real"] == reports["none"]

    @rule()
    def poll(self):
        for h in self.handles["real"]:   # replayable: every launched op has landed
            if h.status != "pending":
                h.wait(10)
        self.process()

    @precondition(lambda self: self.unacked)
    @rule()
    def drain(self):
        for c in self.ctl.values():
            c.step()
        for h in self.handles["real"]:
            assert h.wait(10) is not None and h.done()
        for h in self.handles["none"]:
            assert h.done()   # no bytes: done the moment it launched
        self.handles = {"real": [], "none": []}
        self.process()
        assert not self.unacked and all(c.pending() == 0 for c in self.ctl.values())

    @invariant()
    def same_state(self):
        for m, p in self.pools.items():
            p.check_integrity()
            for (tier, source), ids in self.used.items():
                assert sorted(ids) == p.tier(tier).anchors[source].used_ids().tolist(), (m, tier, source)
        stats = {m: c.stats() for m, c in self.ctl.items()}
        for d in DIR_TIERS:
            assert {k: stats["real"][d][k] for k in STAT_KEYS} == {k: stats["none"][d][k] for k in STAT_KEYS}

    def teardown(self):
        for c in self.ctl.values():
            c.shutdown(wait=True)
        self.process()
        assert not self.unacked


class SplitBatchMachine(TwinMachine):
    host_arena = False
    granularity = "batch"


SETTINGS = settings(max_examples=30, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestTwinArenaPerLayer = TwinMachine.TestCase
TestTwinArenaPerLayer.settings = SETTINGS
TestTwinSplitBatch = SplitBatchMachine.TestCase
TestTwinSplitBatch.settings = SETTINGS


def test_a_pool_without_bytes_allocates_no_memory_and_refuses_byte_access():
    layout = CacheLayout.from_yaml(CONFIGS / "deepseek-v4-flash.yaml")   # ~1 MiB pages
    cfg = PoolConfig(device="cuda", device_bytes=100 << 30, host_bytes=1 << 40, budget="shared_host",
                     bytes_mode="none")
    plan = plan_pools(layout, cfg, available_bytes=4 << 30)   # 1 TiB host on a 4 GiB machine: ids only
    pools = build_pools(layout, cfg, plan=plan)
    assert not pools.holds_bytes and pools.device.device.type == "meta" and pools.host.arena is not None
    assert pools.host.nbytes == plan.host_bytes   # what it stands for; its tensors hold nothing
    view = pools.host.view(layout.families[0].name)
    assert view.device.type == "meta"
    with pytest.raises((NotImplementedError, RuntimeError)):
        view[:, 0].tolist()
    with pytest.raises(MisuseError, match="both hold bytes"):
        TransferController(TieredPools(layout, plan, TierPools(layout, "device", num_pages=2, num_snapshots=1),
                                       pools.host))


def test_bytes_mode_is_checked():
    from hicache.errors import ConfigError

    with pytest.raises(ConfigError, match="bytes_mode"):
        PoolConfig(bytes_mode="fake")
    with pytest.raises(ConfigError, match="host_bytes"):   # a real 1 TiB host is refused as before
        plan_pools(CacheLayout.from_yaml(CONFIGS / "deepseek-v4-flash.yaml"), PoolConfig(host_bytes=1 << 40),
                   available_bytes=4 << 30)
