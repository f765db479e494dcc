"""Copy kernels against the pure-torch reference: every backend, layout, row size, direction."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hicache.errors import MisuseError
from hicache.transfer import copy_batch, copy_rows, make_row_copy, resolve_backend
from hicache.transfer.kernels import build_pieces
from hicache.transfer.plan import CopyPlan, element_width
from tests.transfer.conftest import make_pools, row_size_layout, snapshot, tiny_layout

from hicache.transfer import native, triton_copy

NATIVE = pytest.param("native", marks=pytest.mark.skipif(native.load() is None,
                                                         reason="no C compiler for the native copy"))
BACKENDS = [NATIVE, "torch", "triton", "reference"]


def expected_after(pools, direction, ids):
    """What every pool of the destination tier must hold after the copy (the oracle)."""
    src_tier, dst_tier = (pools.device, pools.host) if direction == "d2h" else (pools.host, pools.device)
    want = snapshot(dst_tier)
    for fam in pools.layout.families:
        s, d = ids[fam.index_source]
        s, d = torch.as_tensor(s), torch.as_tensor(d)
        for layer in range(fam.num_layers):     # per layer, per pair: the obvious loop
            for j in range(len(s)):
                want[fam.name][layer, d[j]] = src_tier.view(fam.name)[layer, s[j]]
    return want


def batch_items(pools, direction, ids):
    src_tier, dst_tier = (pools.device, pools.host) if direction == "d2h" else (pools.host, pools.device)
    return [make_row_copy(src_tier.view(f.name), dst_tier.view(f.name), *ids[f.index_source],
                          name=f.name, layer_ids=f.layer_ids) for f in pools.layout.families]


def scattered_ids(pools, direction, seed):
    """Unsorted, non-contiguous ids; sources may repeat, destinations never do."""
    rng = np.random.default_rng(seed)
    out = {}
    for source in ("page", "state"):
        n_dev, n_host = pools.device.capacity(source), pools.host.capacity(source)
        n_src, n_dst = (n_dev, n_host) if direction == "d2h" else (n_host, n_dev)
        k = min(n_src, n_dst) - 1
        src = rng.permutation(n_src)[:k]
        src[-1] = src[0]                      # a repeated source row is legal
        out[source] = (src, rng.permutation(n_dst)[:k])
    return out


@pytest.mark.parametrize("layout_fn", [tiny_layout, row_size_layout], ids=["tiny", "rowsizes"])
@pytest.mark.parametrize("host_layout", ["layer_first", "page_first"])
@pytest.mark.parametrize("direction", ["d2h", "h2d"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_matches_reference(layout_fn, host_layout, direction, backend, interpret):
    pools = make_pools(layout_fn(), host_layout=host_layout, seed=7)
    ids = scattered_ids(pools, direction, seed=3)
    want = expected_after(pools, direction, ids)
    copy_batch(batch_items(pools, direction, ids), backend=backend)
    dst_tier = pools.host if direction == "d2h" else pools.device
    for name, tensor in want.items():
        assert torch.equal(dst_tier.view(name), tensor), f"{backend}: {name} differs"
    if host_layout == "page_first":   # the objects hold exactly the family views' bytes
        for source in ("page", "state"):
            obj = pools.host.object_view(source)
            parts = [pools.host.view(f.name).permute(1, 0, 2).reshape(obj.shape[0], -1)
                     for f in pools.layout.families_on(source)]
            assert torch.equal(torch.cat(parts, dim=1), obj)


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_rows_single_family_every_row_size(backend, interpret):
    for row_bytes in (584, 132, 68, 8192, 2048, 7, 1):
        src = torch.randint(0, 256, (3, 9, row_bytes), dtype=torch.uint8)
        dst = torch.randint(0, 256, (3, 6, row_bytes), dtype=torch.uint8)
        want = dst.clone()
        s, d = [8, 0, 5, 5], [2, 5, 0, 3]
        want[:, d] = src[:, s]
        copy_rows(src, dst, s, d, backend=backend)
        assert torch.equal(dst, want), (backend, row_bytes)


@pytest.mark.parametrize("backend", [NATIVE, "triton"])
def test_triton_and_native_handle_negative_address_offsets(backend, interpret):
    # The Triton kernel addresses everything relative to one base tensor, so some views
    # sit below it (negative offsets); a view that is a slice with a storage offset too.
    big = torch.randint(0, 256, (2, 40, 24), dtype=torch.uint8)
    src = big[:, 5:20]
    dst = torch.zeros(2, 7, 24, dtype=torch.uint8)
    want = dst.clone()
    want[:, [6, 1]] = src[:, [14, 0]]
    copy_rows(src, dst, [14, 0], [6, 1], backend=backend)
    assert torch.equal(dst, want)


@pytest.mark.parametrize("chunk_bytes", [0, 8, 48, 1000], ids=["whole-unit", "8B", "48B", "1000B"])
def test_triton_chunks_copy_exactly_the_unit(chunk_bytes, interpret):
    # Units cut into chunks (axis 2 of the grid): each byte once, the last chunk partial,
    # nothing past the unit; row sizes that are and are not multiples of the chunk.
    for row_bytes in (584, 7, 1, 2048):
        src = torch.randint(0, 256, (2, 9, row_bytes), dtype=torch.uint8)
        dst = torch.randint(0, 256, (2, 6, row_bytes), dtype=torch.uint8)
        want = dst.clone()
        s, d = [8, 0, 5, 5], [2, 5, 0, 3]
        want[:, d] = src[:, s]
        plan = CopyPlan([make_row_copy(src, dst, s, d)])
        triton_copy.launch(plan, plan.segments, chunk_bytes=chunk_bytes)
        assert torch.equal(dst, want), (chunk_bytes, row_bytes)


@pytest.mark.parametrize("programs", [1, 3, 1000])
def test_triton_bounded_grid_copies_every_chunk_once(programs, interpret):
    # A bounded grid (programs looping over the work): fewer programs than chunks, and
    # more than there is work; several families of different row sizes in one launch.
    g = torch.Generator().manual_seed(5)
    views = [(torch.randint(0, 256, (3, 9, rb), dtype=torch.uint8, generator=g),
              torch.randint(0, 256, (3, 6, rb), dtype=torch.uint8, generator=g)) for rb in (584, 8, 0, 40)]
    wants = []
    for src, dst in views:
        want = dst.clone()
        want[:, [2, 5, 0]] = src[:, [8, 0, 5]]
        wants.append(want)
    plan = CopyPlan([make_row_copy(src, dst, [8, 0, 5], [2, 5, 0], name=f"f{i}") for i, (src, dst) in enumerate(views)])
    triton_copy.launch(plan, plan.segments, chunk_bytes=64, programs=programs)
    for (_, dst), want in zip(views, wants):
        assert torch.equal(dst, want), programs


def test_triton_launches_more_segments_than_a_grid_axis_holds_in_slices(interpret, monkeypatch):
    # Grid axis 1 holds 65,535 segments; past that the launch is cut into slices (here the
    # limit is lowered to 2 so that 3 layers x 2 families = 6 segments take 3 launches).
    monkeypatch.setattr(triton_copy, "MAX_GRID_Z", 2)
    g = torch.Generator().manual_seed(9)
    views = [(torch.randint(0, 256, (3, 5, rb), dtype=torch.uint8, generator=g),
              torch.zeros(3, 4, rb, dtype=torch.uint8)) for rb in (24, 40)]
    plan = CopyPlan([make_row_copy(src, dst, [4, 1], [0, 3], name=f"f{i}") for i, (src, dst) in enumerate(views)])
    assert len(plan.segments) == 6
    triton_copy.launch(plan, plan.segments)
    for src, dst in views:
        assert torch.equal(dst[:, [0, 3]], src[:, [4, 1]]) and not dst[:, [1, 2]].any()


def test_triton_chunking_geometry():
    # (chunk, block, n_chunks) in elements: whole blocks per chunk, enough chunks to cover.
    assert triton_copy.chunking(131072, 8, 64 << 10) == (8192, 1024, 16)      # 1 MiB unit of int64
    assert triton_copy.chunking(73, 8, 64 << 10) == (128, 128, 1)             # unit below a chunk
    assert triton_copy.chunking(131072, 8, 0) == (131072, 1024, 1)            # 0: one chunk per unit
    assert triton_copy.chunking(100, 1, 48) == (64, 64, 2)
    chunk, block, n = triton_copy.chunking(10**9, 1, 16)                      # grid axis-2 limit
    assert n <= triton_copy.MAX_GRID_Z and chunk * n >= 10**9 and chunk % block == 0


def test_triton_leaves_out_zero_byte_families(interpret):
    # A family of 0 bytes per unit (an unused state family) launches nothing for itself.
    src = torch.randint(0, 256, (2, 4, 16), dtype=torch.uint8)
    dst = torch.zeros(2, 4, 16, dtype=torch.uint8)
    empty_src, empty_dst = torch.empty(2, 4, 0, dtype=torch.uint8), torch.empty(2, 4, 0, dtype=torch.uint8)
    plan = CopyPlan([make_row_copy(empty_src, empty_dst, [0], [1], name="empty"),
                     make_row_copy(src, dst, [3, 1], [0, 2], name="kv")])
    keep = triton_copy.launch(plan, plan.segments)
    assert keep and torch.equal(dst[:, [0, 2]], src[:, [3, 1]])
    only_empty = CopyPlan([make_row_copy(empty_src, empty_dst, [0], [1], name="empty")])
    assert triton_copy.launch(only_empty, only_empty.segments) == []


def test_empty_copy_is_a_no_op():
    src = torch.ones(2, 4, 8, dtype=torch.uint8)
    dst = torch.zeros(2, 4, 8, dtype=torch.uint8)
    copy_rows(src, dst, [], [], backend="cpu")
    assert int(dst.sum()) == 0


@pytest.mark.parametrize("backend", [NATIVE, "torch", "reference"])
def test_bad_ids_raise_and_write_nothing(backend):
    src = torch.ones(2, 4, 8, dtype=torch.uint8)
    dst = torch.zeros(2, 5, 8, dtype=torch.uint8)
    with pytest.raises(MisuseError, match="dst_ids: id 3 given twice"):
        copy_rows(src, dst, [0, 1, 2], [3, 1, 3], backend=backend)
    with pytest.raises(MisuseError, match=r"src_ids: id 4 out of range \[0, 4\)"):
        copy_rows(src, dst, [4], [0], backend=backend)
    with pytest.raises(MisuseError, match=r"dst_ids: id -1 out of range \[0, 5\)"):
        copy_rows(src, dst, [0], [-1], backend=backend)
    with pytest.raises(MisuseError, match="2 src_ids but 1 dst_ids"):
        copy_rows(src, dst, [0, 1], [0], backend=backend)
    with pytest.raises(MisuseError, match="must be integers"):
        copy_rows(src, dst, [0.5], [0], backend=backend)
    assert int(dst.sum()) == 0


def test_bad_views_raise(monkeypatch):
    src = torch.ones(2, 4, 8, dtype=torch.uint8)
    with pytest.raises(MisuseError, match="uint8 view"):
        copy_rows(src.float(), src.clone(), [0], [0])
    with pytest.raises(MisuseError, match="differ in layers or unit bytes"):
        copy_rows(src, torch.zeros(3, 4, 8, dtype=torch.uint8), [0], [0])
    with pytest.raises(MisuseError, match="share storage"):
        copy_rows(src[:, :2], src[:, 2:], [0], [1])
    with pytest.raises(MisuseError, match="unknown copy backend 'gpu'"):
        copy_rows(src, src.clone(), [0], [0], backend="gpu")
    with pytest.raises(MisuseError, match="TRITON_INTERPRET"):
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        copy_rows(src, src.clone(), [0], [0], backend="triton")


def test_pieces_are_pair_major_in_page_first_object_order():
    pools = make_pools(tiny_layout(), host_layout="page_first")
    ids = {"page": (np.array([4, 1]), np.array([2, 7])), "state": (np.array([0]), np.array([3]))}
    plan = CopyPlan(batch_items(pools, "d2h", ids))
    src, dst, n = build_pieces(plan, plan.segments)
    assert int(n.sum()) == plan.nbytes and len(src) == len(dst) == len(n)
    obj = pools.host.object_view("page")
    page_bytes = obj.shape[1]
    offsets = [int(a) - obj.data_ptr() for a in dst if obj.data_ptr() <= a < obj.data_ptr() + obj.numel()]
    # Sorted by the device (layer_first) side: device row 1 first, so host page 7's object
    # is written front to back, then page 2's.
    assert offsets == sorted(offsets[: len(offsets) // 2]) + sorted(offsets[len(offsets) // 2:])
    assert offsets[0] == 7 * page_bytes and offsets[len(offsets) // 2] == 2 * page_bytes
    dev_c4 = pools.device.view("c4_kv")
    c4_src = [int(a) for a in src if dev_c4.data_ptr() <= a < dev_c4.data_ptr() + dev_c4.numel()]
    rows = [(a - dev_c4.data_ptr()) % dev_c4.stride(0) // dev_c4.stride(1) for a in c4_src]
    assert rows == [1, 1, 4, 4]          # two layers of device row 1, then of row 4
    # H2D into the device: sorted by destination (the device side).
    plan = CopyPlan(batch_items(pools, "h2d", {"page": (np.array([2, 7]), np.array([4, 1])),
                                               "state": (np.array([3]), np.array([0]))}))
    src, dst, n = build_pieces(plan, plan.segments)
    dst_rows = [(int(a) - dev_c4.data_ptr()) % dev_c4.stride(0) // dev_c4.stride(1) for a in dst
                if dev_c4.data_ptr() <= a < dev_c4.data_ptr() + dev_c4.numel()]
    assert dst_rows == [1, 1, 4, 4]


def test_element_width_and_backend_resolution():
    assert element_width([584, 1168, 0]) == 8
    assert element_width([132, 264]) == 4
    assert element_width([68, 7]) == 1
    assert element_width([32], limit=2) == 2
    plan = CopyPlan([make_row_copy(torch.zeros(1, 2, 4, dtype=torch.uint8),
                                   torch.zeros(1, 2, 4, dtype=torch.uint8), [0], [1])])
    assert resolve_backend("auto", plan) in ("native", "torch")
    assert resolve_backend("reference", plan) == "reference"


def test_consecutive_runs_coalesce_into_one_piece_per_plane():
    pools = make_pools(tiny_layout(), host_layout="layer_first", device_pages=8, host_pages=10)
    ids = {"page": (np.array([3, 4, 5, 0]), np.array([6, 7, 8, 1])), "state": (np.array([], dtype=np.int64),) * 2}
    plan = CopyPlan(batch_items(pools, "d2h", ids))
    src, dst, n = build_pieces(plan, plan.segments)
    planes = sum(f.num_layers for f in pools.layout.families_on("page"))
    assert len(n) == 2 * planes                      # per plane: the run 3-5 and the single 0
    assert int(n.sum()) == plan.nbytes
    want = expected_after(pools, "d2h", ids)
    copy_batch(batch_items(pools, "d2h", ids), backend="cpu")
    assert all(torch.equal(pools.host.view(k), v) for k, v in want.items())


def test_coalesce_merges_only_runs_continuing_on_both_sides():
    from hicache.transfer.kernels import coalesce
    s, d, n = coalesce(np.array([0, 10, 20, 40, 50]), np.array([100, 110, 130, 140, 150]),
                       np.array([10, 10, 10, 10, 10]))
    assert s.tolist() == [0, 20, 40] and d.tolist() == [100, 130, 140] and n.tolist() == [20, 10, 20]
