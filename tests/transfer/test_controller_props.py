"""Random op sequences against a model that applies every op in submission order.

The controller promises that merging and asynchrony never change results: after all acks,
every row holds what executing the ops one by one, in submission order, would give --
except destinations of failed ops (freed for backup/load, undefined for copy). Faults are
injected at random; dependents of a failed op must fail too, and no row may leak.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from hicache.pools import NoRoom
from hicache.transfer import QueueFull, TransferConfig, TransferController
from tests.transfer.conftest import make_pools, tiny_layout

TIERS = ("device", "host")
SOURCES = ("page", "state")
DIR_TIERS = {"d2h": ("device", "host"), "h2d": ("host", "device")}


class ControllerMachine(RuleBasedStateMachine):
    host_layout = "page_first"
    granularity = "layer"

    def __init__(self):
        super().__init__()
        self.pools = make_pools(tiny_layout(), host_layout=self.host_layout, device_pages=6,
                                host_pages=8, device_snapshots=4, host_snapshots=5, seed=1)
        self.ctl = TransferController(
            self.pools, TransferConfig(max_queued_ops=6, load_granularity=self.granularity),
            fault_injector=self._inject)
        # model: (tier, source) -> {id: {family: bytes} | None (undefined)}
        self.model = {(t, s): {} for t in TIERS for s in SOURCES}
        self.unacked: dict[int, tuple] = {}   # seq -> (direction, source, src, dst, owns)
        self.handles = []
        self.counter = 0

    @staticmethod
    def _inject(point):
        if any(tag[1] for tag in point.tags):
            raise RuntimeError("injected")

    # -- helpers --------------------------------------------------------------------------
    def tier(self, name):
        return getattr(self.pools, name)

    def read(self, tier, source, i):
        t = self.tier(tier)
        return {f.name: t.view(f.name)[:, i].clone() for f in t.layout.families_on(source)}

    def busy(self, tier, source):
        out = set()
        for direction, src_ids, op_src, op_dst, _ in self.unacked.values():
            st_, dt_ = DIR_TIERS[direction]
            if src_ids == source:
                out |= set(op_src) if st_ == tier else set(op_dst)
        return out

    def owned(self, tier, source):
        out = set()
        for direction, s, _, op_dst, owns in self.unacked.values():
            if owns and s == source and DIR_TIERS[direction][1] == tier:
                out |= set(op_dst)
        return out

    def submitted(self, handle, direction, source, src, dst, owns):
        src_t, dst_t = DIR_TIERS[direction]
        ms, md = self.model[(src_t, source)], self.model[(dst_t, source)]
        for s, d in zip(src, dst):
            md[d] = ms[s]
        self.unacked[handle.seq] = (direction, source, list(src), list(dst), owns)
        self.handles.append(handle)

    def process(self, acks):
        for a in acks:
            direction, source, _, dst, owns = self.unacked.pop(a.seq)
            assert a.dst_ids.tolist() == dst
            if not a.ok:
                md = self.model[(DIR_TIERS[direction][1], source)]
                for d in dst:
                    if owns:
                        del md[d]
                    else:
                        md[d] = None

    def pick(self, data, ids, k, label):
        ids = sorted(ids)
        if not ids:
            return []
        chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=k, unique=True), label=label)
        return chosen

    # -- rules ----------------------------------------------------------------------------
    @rule(tier=st.sampled_from(TIERS), source=st.sampled_from(SOURCES), n=st.integers(1, 3))
    def alloc_and_write(self, tier, source, n):
        t = self.tier(tier)
        r = t.alloc(source, n)
        if not r.ok:
            return
        g = torch.Generator().manual_seed(self.counter)
        self.counter += 1
        for f in t.layout.families_on(source):
            v = t.view(f.name)
            v[:, r.ids] = torch.randint(0, 256, (v.shape[0], n, v.shape[2]), dtype=torch.uint8, generator=g)
        for i in r.ids.tolist():
            self.model[(tier, source)][i] = self.read(tier, source, i)

    @rule(data=st.data(), direction=st.sampled_from(["d2h", "h2d"]), source=st.sampled_from(SOURCES),
          fail=st.booleans())
    def backup_or_load(self, data, direction, source, fail):
        src_t, _ = DIR_TIERS[direction]
        src = self.pick(data, self.model[(src_t, source)].keys(), 3, "src")
        if not src:
            return
        fail = fail and data.draw(st.integers(0, 3)) == 0
        call = self.ctl.backup if direction == "d2h" else self.ctl.load
        h = call(src, source=source, tag=(self.counter, fail))
        self.counter += 1
        if isinstance(h, (NoRoom, QueueFull)):
            return
        self.submitted(h, direction, source, src, h.dst_ids.tolist(), owns=True)

    @rule(data=st.data(), direction=st.sampled_from(["d2h", "h2d"]), source=st.sampled_from(SOURCES),
          fail=st.booleans())
    def copy(self, data, direction, source, fail):
        src_t, dst_t = DIR_TIERS[direction]
        src = self.pick(data, self.model[(src_t, source)].keys(), 3, "src")
        if not src:
            return
        free_dst = set(self.model[(dst_t, source)]) - self.owned(dst_t, source)
        dst = self.pick(data, free_dst, len(src), "dst")
        if not src or not dst:
            return
        src = src[: len(dst)]
        fail = fail and data.draw(st.integers(0, 3)) == 0
        h = self.ctl.copy(direction, source, src, dst, tag=(self.counter, fail))
        self.counter += 1
        if isinstance(h, QueueFull):
            return
        self.submitted(h, direction, source, src, dst, owns=False)

    @rule(data=st.data(), tier=st.sampled_from(TIERS), source=st.sampled_from(SOURCES))
    def free(self, data, tier, source):
        ids = set(self.model[(tier, source)]) - self.busy(tier, source)
        chosen = self.pick(data, ids, 2, "free")
        if chosen:
            self.tier(tier).free(source, chosen)
            for i in chosen:
                del self.model[(tier, source)][i]

    @rule()
    def step(self):
        self.ctl.step()

    @rule()
    def poll(self):
        # Wait for every launched op first, so which acks arrive (and so what later rules
        # draw) never depends on thread timing: hypothesis needs replayable runs.
        for h in self.handles:
            if h.status != "pending":
                assert h.wait(10) is not None and h.done()
        self.process(self.ctl.poll())

    @precondition(lambda self: self.unacked)
    @rule()
    def drain_and_check(self):
        self.ctl.step()
        for h in self.handles:
            h.wait(10)
            assert h.done()
        self.handles = []
        self.process(self.ctl.poll())
        assert not self.unacked and self.ctl.pending() == 0
        self.check()

    def check(self):
        self.pools.check_integrity()
        for (tier, source), rows in self.model.items():
            used = self.tier(tier).anchors[source].used_ids().tolist()
            assert sorted(rows) == used, f"{tier}/{source}: allocated rows leak or vanish"
            for i, want in rows.items():
                if want is None:
                    continue
                got = self.read(tier, source, i)
                for name in want:
                    assert torch.equal(got[name], want[name]), f"{tier}/{source} id {i} {name}"

    def teardown(self):
        self.ctl.shutdown(wait=True)
        self.process(self.ctl.poll())
        assert not self.unacked
        self.check()


SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class LayerFirstMachine(ControllerMachine):
    host_layout = "layer_first"
    granularity = "batch"


TestControllerPageFirst = ControllerMachine.TestCase
TestControllerPageFirst.settings = SETTINGS
TestControllerLayerFirst = LayerFirstMachine.TestCase
TestControllerLayerFirst.settings = SETTINGS
