"""The Triton copy kernel: every layer of every family of a batch in one launch.

One program copies one chunk of one unit (a unit: one id's bytes of one layer of one
family; a chunk: at most ``chunk`` elements of it). Programs are laid out on a 3-D grid,
pairs on axis 0 (up to 2**31 - 1), segments on axis 1 and chunks on axis 2::

    grid = (max pairs, segments, chunks)   program (j, k, c): segment k, pair j, chunk c
    desc[k] = [src_off, dst_off, src_id_stride, dst_id_stride, unit, ids_start, n_pairs, 0]
    src address = base + src_off + src_ids[ids_start + j] * src_id_stride     (elements)
    elements copied = [c * chunk, min((c + 1) * chunk, unit))

Chunks keep every program short, so large units (a Llama-style page: 1 MiB per layer)
spread over many programs; units no larger than a chunk have one chunk. On an H200 16 KiB
chunks took DeepSeek-V4's D2H from 0.67x to 0.77x of the DMA rate and cost Llama's 0-3%
(``bench/gpu/tune_copy.py``). What had held Llama's D2H at a tenth of the DMA rate was the
access width, not the grid: 16-byte stores into pinned host memory; accesses are now at
most ``VEC_BYTES`` (8).

All addresses are element offsets from one *base* tensor, so families living in different
tensors -- and, on CUDA, host pools in pinned memory reached through unified virtual
addressing -- share one launch without pointer tables. The element is the widest of
int64 / int32 / int16 / uint8 that divides every unit, stride and address of the batch.

On a GPU the programs of short segments exit at once (``j >= n_pairs``); the cost is a few
cycles each. On CPU the same kernel runs under ``TRITON_INTERPRET=1`` in the tests.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch

from hicache.errors import MisuseError
from hicache.transfer.plan import CopyPlan, Segment, element_width

try:  # optional dependency: the CPU path never needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent
    triton = None
    tl = None

_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
_BASES: dict[tuple[str, int], torch.Tensor] = {}
DESC_FIELDS = 8
MAX_GRID_Z = 65535          # CUDA's limit on grid axes 1 and 2
# The most bytes one program copies, its warps, and the widest access promised, from the
# H200 sweep of bench/gpu/tune_copy.py (docs/transfer.md): 16-byte stores into pinned host
# memory ran at 0.07-0.11x the DMA rate on Llama pages, 8-byte ones at 0.85-0.89x; 16 KiB
# chunks took DeepSeek-V4's D2H from 0.67x (one program per unit) to 0.77x.
CHUNK_BYTES = 16 << 10
NUM_WARPS = 4
VEC_BYTES = 8


def available() -> bool:
    return triton is not None


def _copy_units(base, desc, src_ids, dst_ids, chunk, BLOCK: tl.constexpr, VEC: tl.constexpr):
    j = tl.program_id(0)
    d = desc + tl.program_id(1) * 8
    n_pairs = tl.load(d + 6)
    unit = tl.load(d + 4)
    start = tl.program_id(2) * chunk
    if j < n_pairs and start < unit:
        src_off = tl.load(d + 0)
        dst_off = tl.load(d + 1)
        src_stride = tl.load(d + 2)
        dst_stride = tl.load(d + 3)
        ids_start = tl.load(d + 5)
        s = tl.load(src_ids + ids_start + j)
        t = tl.load(dst_ids + ids_start + j)
        src_row = tl.multiple_of(src_off + s * src_stride, VEC)
        dst_row = tl.multiple_of(dst_off + t * dst_stride, VEC)
        end = tl.minimum(start + chunk, unit)
        for off in range(start, end, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            mask = idx < end
            vals = tl.load(base + src_row + idx, mask=mask)
            tl.store(base + dst_row + idx, vals, mask=mask)


def _copy_units_looped(base, desc, src_ids, dst_ids, chunk, max_pairs, n_seg, n_work,
                       BLOCK: tl.constexpr, VEC: tl.constexpr):
    # The same copy as _copy_units on a bounded 1-D grid: program p takes work items p,
    # p + programs, ... where item w is (pair w % max_pairs, segment (w // max_pairs) % n_seg,
    # chunk w // (max_pairs * n_seg)). A few programs then leave the other SMs to the layer
    # compute a per-layer load should hide behind (docs/transfer.md, "Per-layer overlap").
    # Kept apart from _copy_units so that the default path stays the code that was measured.
    for w in range(tl.program_id(0), n_work, tl.num_programs(0)):
        j = w % max_pairs
        d = desc + ((w // max_pairs) % n_seg) * 8
        n_pairs = tl.load(d + 6)
        unit = tl.load(d + 4)
        start = (w // (max_pairs * n_seg)) * chunk
        if j < n_pairs and start < unit:
            s = tl.load(src_ids + tl.load(d + 5) + j)
            t = tl.load(dst_ids + tl.load(d + 5) + j)
            src_row = tl.multiple_of(tl.load(d + 0) + s * tl.load(d + 2), VEC)
            dst_row = tl.multiple_of(tl.load(d + 1) + t * tl.load(d + 3), VEC)
            end = tl.minimum(start + chunk, unit)
            for off in range(start, end, BLOCK):
                idx = off + tl.arange(0, BLOCK)
                mask = idx < end
                tl.store(base + dst_row + idx, tl.load(base + src_row + idx, mask=mask), mask=mask)


_KERNELS: dict[tuple[bool, bool], object] = {}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernel(looped: bool = False):
    """The jitted kernel; decorated on first use so TRITON_INTERPRET=1 set by a test
    (after hicache was imported) still selects Triton's interpreter."""
    key = (interpreting(), looped)
    if key not in _KERNELS:
        # the looped kernel's counts change with every batch: one compilation for all of them
        _KERNELS[key] = (triton.jit(_copy_units_looped, do_not_specialize=["chunk", "max_pairs", "n_seg", "n_work"])
                         if looped else triton.jit(_copy_units))
    return _KERNELS[key]


def kernel_device(plan: CopyPlan) -> torch.device:
    """Where the kernel runs: the CUDA side of the batch, else the CPU (interpreter)."""
    for dev in (plan.src_device, plan.dst_device):
        if dev is not None and dev.type == "cuda":
            return dev
    return torch.device("cpu")


def _base(device: torch.device, width: int) -> torch.Tensor:
    key = (str(device), width)
    if key not in _BASES:
        _BASES[key] = torch.zeros(64, dtype=_DTYPES[width], device=device)
    return _BASES[key]


def chunking(max_unit: int, width: int, chunk_bytes: int) -> tuple[int, int, int]:
    """``(chunk, block, n_chunks)`` in elements of ``width`` bytes for units of at most
    ``max_unit`` elements: a chunk is a whole number of blocks (a block at most 1024
    elements), ``chunk_bytes <= 0`` means one chunk per unit, and the chunk count stays
    within the grid's axis-2 limit."""
    assert max_unit > 0 and width > 0
    want = max_unit if chunk_bytes <= 0 else max(1, chunk_bytes // width)
    block = int(min(1024, max(16, 1 << (min(want, max_unit) - 1).bit_length())))
    chunk = -(-min(want, max_unit) // block) * block
    n_chunks = -(-max_unit // chunk)
    if n_chunks > MAX_GRID_Z:
        chunk = -(-(-(-max_unit // MAX_GRID_Z)) // block) * block
        n_chunks = -(-max_unit // chunk)
    return chunk, block, n_chunks


def launch(plan: CopyPlan, segments: Sequence[Segment], *, chunk_bytes: int | None = None,
           num_warps: int | None = None, vec_bytes: int | None = None,
           programs: int = 0) -> list[torch.Tensor]:
    """Launch one kernel for ``segments`` on the current stream.

    ``chunk_bytes`` (default :data:`CHUNK_BYTES`) is about the most one program copies
    (rounded up to whole blocks of at least 16 elements: :func:`chunking`);
    ``num_warps`` (default :data:`NUM_WARPS`) the warps of each program; ``vec_bytes``
    (default :data:`VEC_BYTES`) the widest alignment promised to the compiler, which
    bounds the width of each load and store. ``programs`` > 0 bounds the grid: that many
    programs loop over the chunks (``_copy_units_looped``), leaving the rest of the GPU to
    other streams' kernels; 0 (the default) launches one program per chunk. Families of zero
    bytes per unit (a state family a model does not use) are left out: nothing to copy, and
    an empty host tensor is never pinned.

    Returns the tensors the launch reads (descriptor, ids); the caller keeps them alive
    until the launch has completed.
    """
    if triton is None:
        raise MisuseError("backend 'triton' needs the triton package (pip install hicache[triton])")
    segments = [s for s in segments if plan.items[s.item].unit_bytes > 0]
    if not segments:
        return []
    device = kernel_device(plan)
    if device.type == "cpu":
        if not interpreting():
            raise MisuseError("backend 'triton' on CPU tensors runs only under TRITON_INTERPRET=1")
    if len(segments) > MAX_GRID_Z:   # grid axis 1 holds at most 65,535 segments: launch in slices
        keep: list[torch.Tensor] = []
        for i in range(0, len(segments), MAX_GRID_Z):
            keep += launch(plan, segments[i:i + MAX_GRID_Z], chunk_bytes=chunk_bytes, num_warps=num_warps,
                           vec_bytes=vec_bytes, programs=programs)
        return keep
    for it in (plan.items[i] for i in sorted({s.item for s in segments})):
        for t in (it.src, it.dst):
            if t.device.type == "cpu" and device.type == "cuda" and not t.is_pinned():
                raise MisuseError(f"{it.name}: host memory must be pinned for the Triton kernel")
    base8 = _base(device, 8)
    base_addr = base8.data_ptr()
    values = [base_addr]
    for s in segments:
        it = plan.items[s.item]
        values += [it.unit_bytes, it.src.stride(0), it.src.stride(1), it.dst.stride(0),
                   it.dst.stride(1), it.src.data_ptr() - base_addr, it.dst.data_ptr() - base_addr]
    width = element_width(values)
    base = _base(device, width)
    base_addr = base.data_ptr()
    item_start: dict[int, int] = {}
    src_ids, dst_ids, desc = [], [], []
    n = 0
    for s in segments:
        it = plan.items[s.item]
        if s.item not in item_start:
            item_start[s.item] = n
            src_ids.append(it.src_ids)
            dst_ids.append(it.dst_ids)
            n += it.num_pairs
        desc.append([(it.src.data_ptr() - base_addr + s.layer * it.src.stride(0)) // width,
                     (it.dst.data_ptr() - base_addr + s.layer * it.dst.stride(0)) // width,
                     it.src.stride(1) // width, it.dst.stride(1) // width,
                     it.unit_bytes // width, item_start[s.item], it.num_pairs, 0])
    max_pairs = max(plan.items[s.item].num_pairs for s in segments)
    max_unit = max(plan.items[s.item].unit_bytes for s in segments) // width
    chunk, block, n_chunks = chunking(max_unit, width, CHUNK_BYTES if chunk_bytes is None else chunk_bytes)
    vec = element_width([d[0] for d in desc] + [d[1] for d in desc]
                        + [d[2] for d in desc] + [d[3] for d in desc],
                        limit=max(1, (VEC_BYTES if vec_bytes is None else vec_bytes) // width))
    pin = device.type == "cuda"
    host = [torch.from_numpy(np.asarray(desc, dtype=np.int64)),
            torch.from_numpy(np.concatenate(src_ids)), torch.from_numpy(np.concatenate(dst_ids))]
    if pin:
        host = [h.pin_memory() for h in host]
    desc_t, src_t, dst_t = (h.to(device, non_blocking=True) for h in host)
    warps = NUM_WARPS if num_warps is None else num_warps
    if programs > 0:
        n_work = max_pairs * len(segments) * n_chunks
        _kernel(looped=True)[(min(programs, n_work),)](base, desc_t, src_t, dst_t, chunk, max_pairs, len(segments),
                                                       n_work, BLOCK=block, VEC=vec, num_warps=warps)
    else:
        _kernel()[(max_pairs, len(segments), n_chunks)](base, desc_t, src_t, dst_t, chunk, BLOCK=block, VEC=vec,
                                                          num_warps=warps)
    return host + [desc_t, src_t, dst_t]
