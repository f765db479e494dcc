"""The transfer controller on each device, with the Triton backend on both.

CUDA half (``gpu``): batches on one side stream per direction, ordered across directions by
events, completion read from events. CPU half: worker threads, the same kernel in Triton's
interpreter. A batch is held back -- to prove what waits on what -- by a GPU sleep queued on
its side stream (CUDA) or a fault injector that blocks its worker (CPU); either way nothing
else about the controller changes. Bytes are checked exactly.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hicache.transfer import TransferConfig, TransferController
from tests.transfer.conftest import make_pools, tiny_layout

SLEEP_CYCLES = 2_000_000_000   # torch.cuda._sleep: about a second at an H100's clock


def rows(tier, source, ids) -> dict[str, torch.Tensor]:
    """The bytes of rows ``ids`` of every family on ``source``, on the CPU."""
    idx = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    return {f.name: tier.view(f.name)[:, idx.to(tier.device)].cpu() for f in tier.layout.families_on(source)}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def write(tier, source, ids, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    idx = torch.as_tensor(np.asarray(ids, dtype=np.int64)).to(tier.device)
    for f in tier.layout.families_on(source):
        v = tier.view(f.name)
        v[:, idx] = torch.randint(0, 256, (v.shape[0], len(ids), v.shape[2]), dtype=torch.uint8,
                                  generator=g).to(tier.device)


class Hold:
    """Holds batches of one direction until :meth:`release`.

    CPU: a fault injector blocks that direction's worker before its first copy group.
    CUDA: a GPU sleep of about a second is queued on that direction's side stream, so the
    launches queue behind it; ``release`` lets the sleep run out.
    """

    def __init__(self, ctl: TransferController, direction: str, device: torch.device):
        self.ctl, self.direction, self.cuda = ctl, direction, device.type == "cuda"
        self.gate, self.blocked = threading.Event(), threading.Event()
        if self.cuda:
            with torch.cuda.stream(ctl._exec.streams[direction]):
                torch.cuda._sleep(SLEEP_CYCLES)
        else:
            ctl.set_fault_injector(self._inject)

    def _inject(self, point) -> None:
        if point.direction == self.direction and not self.gate.is_set():
            self.blocked.set()
            assert self.gate.wait(30), "test gate never opened"

    def release(self) -> None:
        self.gate.set()


@pytest.fixture
def setup(device):
    pools = make_pools(tiny_layout(), device=device, device_pages=12, host_pages=16, device_snapshots=6,
                       host_snapshots=8)
    ctl = TransferController(pools, TransferConfig(backend="triton", load_granularity="layer"))
    assert ctl.backend == "triton"
    warm(ctl, pools)
    yield pools, ctl
    ctl.shutdown()
    pools.check_integrity()


def warm(ctl: TransferController, pools) -> None:
    """Backups and loads of each anchor alone and of both together, so every kernel variant
    the tests launch (a variant per mix of families in a launch) is compiled before a held
    stream's sleep starts counting: a compile inside a held step would outlast the sleep."""
    for sources in (("page",), ("state",), ("page", "state")):
        handles = []
        for source in sources:
            dev = pools.device.alloc(source, 1).ids
            b = ctl.backup(dev, source=source)
            handles += [b, ctl.load(b.dst_ids, source=source)]
        ctl.step()
        assert all(h.wait(60) for h in handles)
        assert all(a.ok for a in ctl.poll())
        for h in handles:
            (pools.host if h.direction == "d2h" else pools.device).free(h.source, h.dst_ids)
            if h.direction == "d2h":
                pools.device.free(h.source, h.src_ids)


def test_acks_come_back_in_submission_order_per_direction(setup, device):
    pools, ctl = setup
    dev = pools.device.alloc("page", 3).ids
    snap = pools.device.alloc("state", 1).ids
    host = pools.host.alloc("page", 2).ids
    write(pools.device, "page", dev, seed=1)
    hold = Hold(ctl, "d2h", device)
    a = ctl.backup(dev[:2], tag="a")
    ctl.step()
    b = ctl.backup(snap, source="state", tag="b")
    c = ctl.backup(dev[2:], tag="c")
    ctl.step()
    ld = ctl.load(host, tag="load")              # unrelated rows: runs while the backups wait
    ctl.step()
    assert ld.wait(30) and not a.done() and not c.done()
    assert [x.tag for x in ctl.poll()] == ["load"]
    hold.release()
    assert a.wait(30) and b.wait(30) and c.wait(30)
    acks = ctl.poll()
    assert [(x.tag, x.ok) for x in acks] == [("a", True), ("b", True), ("c", True)]
    assert [x.seq for x in acks] == sorted(x.seq for x in acks)
    assert same(rows(pools.host, "page", a.dst_ids), rows(pools.device, "page", dev[:2]))
    assert same(rows(pools.host, "page", c.dst_ids), rows(pools.device, "page", dev[2:]))
    assert same(rows(pools.host, "state", b.dst_ids), rows(pools.device, "state", snap))
    assert same(rows(pools.device, "page", ld.dst_ids), rows(pools.host, "page", host))


def test_a_load_waits_for_the_backup_it_reads(setup, device):
    """The load's stream (or worker) waits on the backup's event: without that it would
    read the host rows before the backup wrote them."""
    pools, ctl = setup
    dev = pools.device.alloc("page", 2).ids
    write(pools.device, "page", dev, seed=5)
    want = rows(pools.device, "page", dev)
    hold = Hold(ctl, "d2h", device)
    b = ctl.backup(dev)
    ctl.step()
    ld = ctl.load(b.dst_ids)
    ctl.step()
    assert ld.wait(timeout=0.1) is False and not b.done()
    hold.release()
    assert ld.wait(30) and b.wait(30)
    assert all(a.ok for a in ctl.poll())
    assert same(rows(pools.device, "page", ld.dst_ids), want)
    assert same(rows(pools.host, "page", b.dst_ids), want)


def test_a_failed_batch_fails_its_dependants_and_frees_their_rows(setup):
    pools, ctl = setup

    def inject(point):
        if point.direction == "d2h" or point.layer_id == 3:
            raise RuntimeError(f"injected fault at layer {point.layer_id}")

    ctl.set_fault_injector(inject)
    dev = pools.device.alloc("page", 2).ids
    host = pools.host.alloc("page", 2).ids
    used_dev = pools.device.num_used("page")
    ctl.copy("d2h", "page", dev, host, tag="c")
    same_step = ctl.load(host, tag="reads-c")            # reads what c writes
    ctl.step()
    later = ctl.load(host[:1], tag="reads-c-later")      # next step: c's batch is still unacked
    ctl.step()
    assert same_step.wait(30) is False and "depends on batch" in (same_step.error or "")
    assert later.wait(30) is False and "depends on batch" in (later.error or "")
    acks = {a.tag: a for a in ctl.poll()}
    assert not acks["c"].ok and "injected fault" in acks["c"].error
    assert not acks["reads-c"].ok and not acks["reads-c-later"].ok
    assert pools.host.anchors["page"].is_used(host).all()   # copy(): the caller's rows stay
    assert pools.device.num_used("page") == used_dev        # the loads' rows were freed
    # A per-layer load failing at its second layer: no layer counts as landed, no row kept.
    ld = ctl.load(pools.host.alloc("page", 1).ids, tag="fails-at-layer-3")
    ctl.step()
    assert ld.wait(30) is False and ld.wait_layer(2) is False and "layer 3" in (ld.error or "")
    ack, = ctl.poll()
    assert not ack.ok and pools.device.num_used("page") == used_dev


def test_wait_layer_returns_as_each_layer_lands(setup, device):
    pools, ctl = setup
    host = pools.host.alloc("page", 3).ids
    write(pools.host, "page", host, seed=9)
    page_layers = sorted({l for f in pools.layout.families_on("page") for l in f.layer_ids})
    hold = Hold(ctl, "h2d", device)
    h = ctl.load(host)
    write(pools.device, "page", h.dst_ids, seed=10)     # other bytes where the load lands
    ctl.step()
    assert h.wait_layer(page_layers[0], timeout=0.1) is False and not h.done()
    hold.release()
    for layer in page_layers:
        assert h.wait_layer(layer, timeout=30)
        for fam in pools.layout.families_on("page"):
            if layer in fam.layer_ids:
                i = fam.layer_ids.index(layer)
                idx = torch.as_tensor(h.dst_ids).to(pools.device.device)
                assert torch.equal(pools.device.view(fam.name)[i, idx].cpu(),
                                   pools.host.view(fam.name)[i, torch.as_tensor(host)]), (layer, fam.name)
    assert h.wait(30)
    ack, = ctl.poll()
    assert ack.ok
    st = ctl.stats()["h2d"]
    assert st["launches"] >= len(page_layers) and st["failures"] == 0
    assert same(rows(pools.device, "page", h.dst_ids), rows(pools.host, "page", host))
