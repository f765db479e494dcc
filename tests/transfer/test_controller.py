"""TransferController: merging, ordering, acks, rollback, per-layer waits, shutdown."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from hicache.errors import ConfigError, MisuseError
from hicache.pools import NoRoom
from hicache.transfer import QueueFull, TransferConfig, TransferController
from tests.transfer.conftest import make_pools, tiny_layout


def rows(tier, source, ids):
    """The bytes of ``ids`` in every family on ``source`` of ``tier``."""
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    return {f.name: tier.view(f.name)[:, ids].clone() for f in tier.layout.families_on(source)}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def write(tier, source, ids, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    for f in tier.layout.families_on(source):
        v = tier.view(f.name)
        v[:, ids] = torch.randint(0, 256, (v.shape[0], len(ids), v.shape[2]), dtype=torch.uint8, generator=g)


class Recorder:
    """A fault injector that records every launch group and can block or fail some."""

    def __init__(self):
        self.points = []
        self.fail_when = None            # predicate on FaultPoint -> raise
        self.block_when = None           # predicate on FaultPoint -> wait for self.gate
        self.gate = threading.Event()
        self.blocked = threading.Event()

    def __call__(self, point):
        self.points.append(point)
        if self.block_when is not None and self.block_when(point):
            self.blocked.set()
            assert self.gate.wait(10), "test gate never opened"
        if self.fail_when is not None and self.fail_when(point):
            raise RuntimeError(f"injected fault at layer {point.layer_id}")


@pytest.fixture
def setup(request):
    granularity = getattr(request, "param", "layer")
    pools = make_pools(tiny_layout(), device_pages=12, host_pages=16, device_snapshots=6,
                       host_snapshots=8)
    rec = Recorder()
    ctl = TransferController(pools, TransferConfig(load_granularity=granularity), fault_injector=rec)
    yield pools, ctl, rec
    rec.gate.set()
    ctl.shutdown()
    pools.check_integrity()


def test_backup_then_load_round_trip_in_one_step(setup):
    pools, ctl, rec = setup
    dev = pools.device.alloc("page", 4).ids
    snap = pools.device.alloc("state", 2).ids
    b1 = ctl.backup(dev[:3], tag="b1")
    b2 = ctl.backup(snap, source="state", tag="b2")
    b3 = ctl.backup(dev[3:], tag="b3")
    back = ctl.load(b1.dst_ids, tag="l1")   # reads host rows b1 writes: must run after it
    report = ctl.step()
    assert (report.ops, report.batches, report.phases) == (4, 2, 1)
    assert back.wait(5) and b3.wait(5)
    acks = ctl.poll()
    assert [a.tag for a in acks] == ["b1", "b2", "b3", "l1"]
    assert all(a.ok and a.error is None for a in acks)
    assert [a.kind for a in acks] == ["backup", "backup", "backup", "load"]
    assert acks[0].dst_ids.tolist() == b1.dst_ids.tolist() == [0, 1, 2]
    assert acks[3].dst_ids.tolist() == [4, 5, 6]
    assert same(rows(pools.host, "page", b1.dst_ids), rows(pools.device, "page", dev[:3]))
    assert same(rows(pools.host, "state", b2.dst_ids), rows(pools.device, "state", snap))
    assert same(rows(pools.device, "page", back.dst_ids), rows(pools.device, "page", dev[:3]))
    # One D2H launch for three ops over both anchors, and one H2D launch per layer.
    d2h = [p for p in rec.points if p.direction == "d2h"]
    h2d = [p for p in rec.points if p.direction == "h2d"]
    assert len(d2h) == 1 and d2h[0].op_seqs == (0, 1, 2) and d2h[0].layer_id is None
    assert [p.layer_id for p in h2d] == [2, 3, 4, 5]   # page families live on layers 2-5
    st = ctl.stats()
    assert st["d2h"]["launches"] == 1 and st["d2h"]["batches"] == 1 and st["d2h"]["ops"] == 3
    assert st["h2d"]["launches"] == 4 and st["h2d"]["failures"] == 0
    assert st["d2h"]["bytes"] == 4 * pools.layout.object_bytes("page") + 2 * pools.layout.object_bytes("state")
    assert ctl.pending() == 0


@pytest.mark.parametrize("setup", ["batch"], indirect=True)
def test_batch_granularity_loads_in_one_launch(setup):
    pools, ctl, rec = setup
    host = pools.host.alloc("page", 3).ids
    h = ctl.load(host)
    ctl.step()
    assert h.wait_layer(4, timeout=5) and h.wait(5)
    assert [p.layer_id for p in rec.points] == [None]
    assert ctl.poll()[0].ok


def test_acks_come_back_in_submission_order_per_direction(setup):
    pools, ctl, _ = setup
    dev = pools.device.alloc("page", 6).ids
    handles = []
    for step in range(3):
        handles += [ctl.backup(dev[2 * step: 2 * step + 1], tag=f"s{step}a"),
                    ctl.backup(dev[2 * step + 1: 2 * step + 2], tag=f"s{step}b")]
        ctl.step()
    assert all(h.wait(5) for h in handles)
    acks = ctl.poll()
    assert [a.tag for a in acks] == ["s0a", "s0b", "s1a", "s1b", "s2a", "s2b"]
    assert [a.seq for a in acks] == sorted(a.seq for a in acks)
    assert ctl.poll() == []


def test_no_room_allocates_nothing():
    lay = tiny_layout()
    pools = make_pools(lay, device_pages=6, host_pages=5, host_sidecar_rows={"c4_indexer": 3})
    ctl = TransferController(pools)
    dev = pools.device.alloc("page", 6).ids
    r = ctl.backup(dev)                          # anchor itself is too small
    assert isinstance(r, NoRoom) and r.blocked_by is None and r.available == 5
    r = ctl.backup(dev[:4])                      # anchor has room, a sidecar refuses
    assert isinstance(r, NoRoom) and r.blocked_by == "c4_indexer"
    assert pools.host.num_used("page") == 0 and ctl.pending() == 0
    assert ctl.step().ops == 0
    pools.check_integrity()
    ctl.shutdown()


def test_failed_batch_frees_allocated_rows_and_fails_every_op(setup):
    pools, ctl, rec = setup
    rec.fail_when = lambda p: p.direction == "d2h"
    dev = pools.device.alloc("page", 3).ids
    host_before = rows(pools.host, "page", range(16))
    a = ctl.backup(dev[:2], tag="a")
    b = ctl.backup(dev[2:], tag="b")
    assert pools.host.num_used("page") == 3
    ctl.step()
    assert a.wait(5) is False and b.done() and b.status == "failed"
    assert "injected fault" in a.error
    acks = ctl.poll()
    assert [(x.tag, x.ok) for x in acks] == [("a", False), ("b", False)]
    assert all("RuntimeError: injected fault" in x.error for x in acks)
    assert pools.host.num_used("page") == 0          # rolled back
    assert ctl.stats()["d2h"]["failures"] == 2 and ctl.stats()["d2h"]["bytes"] == 0
    assert same(rows(pools.host, "page", range(16)), host_before)   # fault hit before any byte
    pools.check_integrity()


def test_failed_copy_keeps_caller_rows_and_poisons_dependents(setup):
    pools, ctl, rec = setup
    rec.fail_when = lambda p: p.direction == "d2h"
    dev = pools.device.alloc("page", 2).ids
    host = pools.host.alloc("page", 2).ids
    ctl.copy("d2h", "page", dev, host, tag="c")
    later = ctl.load(host, tag="reads-c")        # reads what c writes: depends on it
    independent = ctl.load(pools.host.alloc("page", 1).ids, tag="free-standing")
    report = ctl.step()
    assert report.batches == 2
    assert later.wait(5) is False and "depends on batch" in later.error
    assert independent.wait(5) is False                 # same H2D batch: it fails with it
    acks = {a.tag: a for a in ctl.poll()}
    assert not acks["c"].ok and not acks["reads-c"].ok
    assert pools.host.anchors["page"].is_used(host).all()   # copy(): the caller's rows stay
    assert pools.device.num_used("page") == 2                # the loads' rows were freed


def test_wait_layer_returns_as_layers_land(setup):
    pools, ctl, rec = setup
    rec.block_when = lambda p: p.direction == "h2d" and p.layer_id == 4
    host = pools.host.alloc("page", 2).ids
    write(pools.host, "page", host, seed=1)
    h = ctl.load(host)
    with pytest.raises(MisuseError, match="step"):
        h.wait_layer(2)
    ctl.step()
    assert rec.blocked.wait(5)
    assert h.wait_layer(2, timeout=5) and h.wait_layer(3, timeout=5)
    assert h.wait_layer(0, timeout=0)              # no page family on layer 0: nothing to wait
    assert h.wait_layer(4, timeout=0.05) is False and not h.done()
    assert h.wait(timeout=0.05) is False and h.status == "in_flight"
    c4 = pools.layout.family("c4_kv")
    landed = pools.device.view("c4_kv")[c4.layer_ids.index(2), h.dst_ids]
    assert torch.equal(landed, pools.host.view("c4_kv")[0, host])
    with pytest.raises(MisuseError, match="layer 99"):
        h.wait_layer(99)
    rec.gate.set()
    assert h.wait_layer(5, timeout=5) and h.wait(5)
    assert same(rows(pools.device, "page", h.dst_ids), rows(pools.host, "page", host))


def test_wait_layer_after_failure_is_false(setup):
    pools, ctl, rec = setup
    rec.fail_when = lambda p: p.layer_id == 3
    h = ctl.load(pools.host.alloc("page", 1).ids)
    ctl.step()
    assert h.wait(5) is False
    assert h.wait_layer(2) is False and h.wait_layer(5) is False
    assert "layer 3" in h.error
    ack, = ctl.poll()
    assert not ack.ok and pools.device.num_used("page") == 0


def test_no_false_dependency_between_directions(setup):
    pools, ctl, rec = setup
    rec.block_when = lambda p: p.direction == "d2h"
    dev = pools.device.alloc("page", 2).ids
    host = pools.host.alloc("page", 2).ids
    b = ctl.backup(dev)
    ctl.step()
    assert rec.blocked.wait(5)
    ld = ctl.load(host)                            # unrelated rows: runs while the backup waits
    ctl.step()
    assert ld.wait(5) and not b.done()
    rec.gate.set()
    assert b.wait(5)
    assert [a.kind for a in ctl.poll()] == ["backup", "load"]


def test_load_in_a_later_step_waits_for_the_backup_it_reads(setup):
    pools, ctl, rec = setup
    rec.block_when = lambda p: p.direction == "d2h"
    dev = pools.device.alloc("page", 2).ids
    write(pools.device, "page", dev, seed=5)
    b = ctl.backup(dev)
    ctl.step()
    assert rec.blocked.wait(5)
    ld = ctl.load(b.dst_ids)
    ctl.step()
    assert ld.wait(timeout=0.1) is False            # held back by the backup it depends on
    rec.gate.set()
    assert ld.wait(5)
    assert same(rows(pools.device, "page", ld.dst_ids), rows(pools.device, "page", dev))


def test_same_step_write_after_write_keeps_submission_order(setup):
    pools, ctl, _ = setup
    dev = pools.device.alloc("page", 2).ids
    write(pools.device, "page", dev, seed=9)
    host = pools.host.alloc("page", 1).ids
    ctl.copy("d2h", "page", dev[:1], host, tag="first")
    ctl.copy("d2h", "page", dev[1:], host, tag="second")   # same destination: must land last
    report = ctl.step()
    assert (report.batches, report.phases) == (2, 2)
    assert ctl.shutdown() is None
    assert [a.tag for a in ctl.poll()] == ["first", "second"]
    assert same(rows(pools.host, "page", host), rows(pools.device, "page", dev[1:]))


def test_same_step_cycle_is_split_into_phases(setup):
    pools, ctl, _ = setup
    dev = pools.device.alloc("page", 3).ids
    host = pools.host.alloc("page", 3).ids
    write(pools.host, "page", host, seed=11)
    write(pools.device, "page", dev, seed=12)
    want_dev0 = rows(pools.host, "page", host[:1])
    ctl.copy("h2d", "page", host[:1], dev[:1], tag="load")        # writes dev0
    ctl.copy("d2h", "page", dev[:1], host[1:2], tag="backup")     # reads dev0: after load
    ctl.copy("h2d", "page", host[1:2], dev[2:3], tag="reload")    # reads host1: after backup
    report = ctl.step()
    assert report.phases == 2 and report.batches == 3
    ctl.shutdown()
    assert all(a.ok for a in ctl.poll())
    assert same(rows(pools.device, "page", dev[:1]), want_dev0)
    assert same(rows(pools.host, "page", host[1:2]), want_dev0)
    assert same(rows(pools.device, "page", dev[2:3]), want_dev0)


def test_queue_bound_refuses_without_allocating():
    pools = make_pools(tiny_layout(), device_pages=8, host_pages=8)
    ctl = TransferController(pools, TransferConfig(max_queued_ops=2))
    dev = pools.device.alloc("page", 3).ids
    assert not isinstance(ctl.backup(dev[:1]), QueueFull)
    assert not isinstance(ctl.backup(dev[1:2]), QueueFull)
    full = ctl.backup(dev[2:])
    assert isinstance(full, QueueFull) and not full.ok and full.queued_ops == 2
    assert pools.host.num_used("page") == 2
    ctl.step()
    ctl.shutdown()
    assert len(ctl.poll()) == 2
    pools.check_integrity()
    page = pools.layout.object_bytes("page")
    ctl2 = TransferController(pools, TransferConfig(max_queued_bytes=3 * page))
    assert not isinstance(ctl2.backup(dev[:2]), QueueFull)
    assert isinstance(ctl2.backup(dev[:2]), QueueFull)   # 4 pages queued > 3
    ctl2.shutdown()


def test_shutdown_wait_finishes_in_flight_and_pending(setup):
    pools, ctl, rec = setup
    rec.block_when = lambda p: p.direction == "d2h" and p.batch_seq == 0
    dev = pools.device.alloc("page", 2).ids
    a = ctl.backup(dev[:1], tag="in-flight")
    ctl.step()
    assert rec.blocked.wait(5)
    b = ctl.backup(dev[1:], tag="pending")
    threading.Timer(0.05, rec.gate.set).start()
    ctl.shutdown(wait=True)
    assert a.done() and b.done()
    assert [(x.tag, x.ok) for x in ctl.poll()] == [("in-flight", True), ("pending", True)]
    with pytest.raises(MisuseError, match="shut down"):
        ctl.backup(dev[:1])
    with pytest.raises(MisuseError, match="shut down"):
        ctl.step()


def test_shutdown_without_wait_fails_everything_unfinished(setup):
    pools, ctl, rec = setup
    rec.block_when = lambda p: p.direction == "h2d" and p.layer_id == 3
    host = pools.host.alloc("page", 2).ids
    h = ctl.load(host, tag="in-flight")
    ctl.step()
    assert rec.blocked.wait(5)
    p = ctl.backup(pools.device.alloc("page", 1).ids, tag="pending")
    assert pools.device.num_used("page") == 3 and pools.host.num_used("page") == 3
    threading.Timer(0.05, rec.gate.set).start()
    ctl.shutdown(wait=False)
    assert h.wait(1) is False and p.wait() is False and p.status == "failed"
    acks = ctl.poll()
    assert [(a.tag, a.ok) for a in acks] == [("in-flight", False), ("pending", False)]
    assert all("cancelled by shutdown" in a.error for a in acks)
    assert pools.device.num_used("page") == 1 and pools.host.num_used("page") == 2
    assert [pt.layer_id for pt in rec.points if pt.direction == "h2d"] == [2, 3]


def test_misuse_is_rejected(setup):
    pools, ctl, _ = setup
    dev = pools.device.alloc("page", 2).ids
    with pytest.raises(MisuseError, match="device page id 5 is not allocated"):
        ctl.backup([5])
    with pytest.raises(MisuseError, match="out of range"):
        ctl.backup([100])
    with pytest.raises(MisuseError, match="source must be one of"):
        ctl.backup(dev, source="kv")
    with pytest.raises(MisuseError, match="direction must be"):
        ctl.copy("h2h", "page", dev, dev)
    host = pools.host.alloc("page", 2).ids
    with pytest.raises(MisuseError, match="given twice"):
        ctl.copy("d2h", "page", dev, [host[0], host[0]])
    with pytest.raises(MisuseError, match="host page id 7 is not allocated"):
        ctl.copy("d2h", "page", dev, [host[0], 7])
    with pytest.raises(MisuseError, match="2 src_ids but 1 dst_ids"):
        ctl.copy("d2h", "page", dev, host[:1])
    h = ctl.backup(dev)
    with pytest.raises(MisuseError, match="call step"):
        h.wait()
    assert h.status == "pending" and ctl.pending() == 1
    with pytest.raises(MisuseError, match="TransferConfig"):
        TransferController(pools, {"backend": "cpu"})


def test_empty_op_is_acked(setup):
    _, ctl, _ = setup
    h = ctl.backup([], tag="nothing")
    ctl.step()
    assert h.wait(5) and h.dst_ids.tolist() == []
    ack, = ctl.poll()
    assert ack.ok and ack.tag == "nothing"


def test_config_is_validated_and_auto_granularity_is_batch_on_cpu():
    for bad in ({"backend": "gpu"}, {"load_granularity": "page"}, {"max_queued_ops": 0},
                {"max_queued_bytes": 0}, {"cpu_threads": -1}, {"max_queued_ops": True}):
        with pytest.raises(ConfigError, match="transfer."):
            TransferConfig(**bad)
    pools = make_pools(tiny_layout())
    ctl = TransferController(pools)
    assert ctl.load_granularity == "batch" and ctl.backend in ("native", "torch")
    h = ctl.load(pools.host.alloc("page", 2).ids)
    ctl.step()
    assert h.wait_layer(2, timeout=5) and h.wait(5)
    assert ctl.stats()["h2d"]["launches"] == 0          # counted when acked
    ctl.poll()
    assert ctl.stats()["h2d"]["launches"] == 1
    ctl.shutdown()


def test_controller_runs_the_triton_kernel_under_the_interpreter(interpret):
    pools = make_pools(tiny_layout(), host_layout="page_first")
    ctl = TransferController(pools, TransferConfig(backend="triton", load_granularity="layer"))
    assert ctl.backend == "triton"
    dev = pools.device.alloc("page", 3).ids
    snap = pools.device.alloc("state", 2).ids
    b = ctl.backup(dev[[2, 0, 1]])
    s = ctl.backup(snap, source="state")
    back = ctl.load(b.dst_ids)
    ctl.step()
    assert back.wait_layer(3, timeout=30) and back.wait(30) and s.wait(30)
    assert all(a.ok for a in ctl.poll())
    assert same(rows(pools.device, "page", back.dst_ids), rows(pools.device, "page", dev[[2, 0, 1]]))
    assert same(rows(pools.host, "state", s.dst_ids), rows(pools.device, "state", snap))
    ctl.shutdown()
    pools.check_integrity()


@pytest.mark.parametrize("host_layout", ["page_first", "layer_first"])
def test_an_op_reading_a_failed_ops_rows_fails_even_after_that_failure_was_acked(host_layout):
    # A load fails and is acked (its device row freed) before a backup reading that row,
    # queued while the load was in flight, is launched. The backup must fail too: it used
    # to miss the dependency (the load's batch had left the in-flight queue) and ack ok
    # with the bytes of a freed row. Found by test_controller_props (layer_first).
    pools = make_pools(tiny_layout(), host_layout=host_layout, device_pages=6, host_pages=8,
                       device_snapshots=4, host_snapshots=5, seed=1)

    def inject(point):
        if "bad" in point.tags:
            raise RuntimeError("injected")

    ctl = TransferController(pools, TransferConfig(max_queued_ops=6), fault_injector=inject)
    src = pools.host.alloc("state", 1)
    load = ctl.load([int(src.ids[0])], source="state", tag="bad")
    ctl.step()
    load.wait(10)
    backup = ctl.backup([int(load.dst_ids[0])], source="state", tag="reads the load's row")
    assert [(a.tag, a.ok) for a in ctl.poll()] == [("bad", False)]
    ctl.step()
    backup.wait(10)
    acks = ctl.poll()
    assert [(a.tag, a.ok) for a in acks] == [("reads the load's row", False)]
    assert "depends on batch" in acks[0].error
    ctl.shutdown()
