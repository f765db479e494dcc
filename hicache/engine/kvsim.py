"""kvcache-simulator's LRU and optimal policies on a trace, at capacities given in our tokens.

Used by ``hicache sweep`` and ``bench/kvsim_compare.py``. It calls the simulator's own
``run_sweep`` (the code behind ``kvcache-simulator run``), so its figures are what that
command prints for the same trace and budgets (``sim_gib`` below).

Measured its way: hit tokens / prompt tokens over the last half of the requests
(``floor(N/2)`` warm-up requests), after a first half that must fill the cache.

Budget scaling. The simulator sizes its cache in GiB and converts with its own DeepSeek-V4
accounting (``calculator.py``, formula ``deepseek_v4_hybrid``): 512 elements per KV row at
the KV precision (fp8 by default: 512 B, where our FP8 rows are 584 B), indexer rows of 128
elements at the indexer precision (fp4 by default: 64 B, ours 132 B), and the 128-token
sliding window of every layer amortised over ``estimate_tokens`` (by default the trace's
mean prompt length)::

    bytes_per_token = (43*128*512 + sum_l floor(T/r_l)*512 + 21*floor(T/4)*64) / T
    capacity_blocks = floor(GiB * 2**30 / (bytes_per_token * block_size))

We hold ``capacity_tokens`` history tokens (device + host pages x page tokens), so we ask
it for ``capacity_blocks = capacity_tokens // block_size`` blocks: ``GiB =
(capacity_blocks + 0.5) * bytes_per_block / 2**30``, checked with its own
``cache_blocks_for_gib`` to give exactly that block count. Both caches then hold the same
number of tokens; the GiB figures differ by the ratio of the two byte accountings.

Shared budget (``budget: shared``): our page count is not fixed (pages and snapshots share
one arena per tier), so the capacity we give the simulator comes from bytes, amortising one
snapshot over a mean prompt the way its own formula amortises the sliding window
(:func:`shared_capacity_tokens`)::

    bytes_per_token_ours = (snapshot_bytes + (T / page_tokens) * page_bytes) / T
    capacity_tokens      = floor((device_bytes + host_bytes) / bytes_per_token_ours)

with ``T`` the trace's mean prompt tokens. Split budgets keep the page-count rule above.

A capacity the simulator omits is reported by ``status``: ``capacity_holds_whole_trace``
(at least its unique blocks: nothing is ever evicted, every policy is the ceiling) or
``underfilled`` (the cache was not full when measurement began: no figure).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from hicache.errors import ConfigError
from hicache.units import check_int

POLICIES = ("lru", "optimal")
DEFAULT_MODEL = "deepseek-v4-flash"


def modules():
    """The simulator's modules, or a ConfigError saying how to install it."""
    try:
        import kvcache_sim
        from kvcache_sim import calculator, simulator, trace
    except ImportError:
        raise ConfigError("kvcache-simulator", "not installed",
                          "pip install kvcache-simulator (the comparison runs its policies)") from None
    return kvcache_sim, calculator, simulator, trace


def available() -> bool:
    try:
        modules()
    except ConfigError:
        return False
    return True


def model_for(name: str | None) -> str:
    """``name`` when kvcache-simulator knows it, else :data:`DEFAULT_MODEL` (its byte
    accounting only turns our capacity into its GiB; the block count is exact either way)."""
    _, calculator, _, _ = modules()
    known = calculator.models_by_id(calculator.load_models_data())
    return name if name is not None and name in known else DEFAULT_MODEL


def shared_capacity_tokens(budget_bytes: int, page_bytes: int, snapshot_bytes: int, page_tokens: int,
                           mean_prompt_tokens: float) -> int:
    """History tokens a shared budget of ``budget_bytes`` holds at one snapshot per mean
    prompt of ``mean_prompt_tokens`` (see the module docstring)."""
    t = float(mean_prompt_tokens)
    if not t > 0:
        raise ConfigError("mean_prompt_tokens", mean_prompt_tokens, "must be > 0")
    per_token = (snapshot_bytes + (t / page_tokens) * page_bytes) / t
    return int(budget_bytes // per_token)


def scaled_budget_gib(capacity_blocks: int, bytes_per_block: float, simulator) -> float:
    """The GiB budget for which kvcache-simulator allocates exactly ``capacity_blocks``."""
    gib = (capacity_blocks + 0.5) * bytes_per_block / simulator.BYTES_PER_GIB
    got = simulator.cache_blocks_for_gib(gib, bytes_per_block)
    assert got == capacity_blocks, f"budget scaling gives {got} blocks, not {capacity_blocks}"
    return gib


def _policy(r: dict) -> dict:
    return {"hit_rate": r["hitRate"], "hit_tokens": r["hitTokens"], "total_tokens": r["totalTokens"]}


def simulate(trace_path: str | Path, capacities_tokens: Sequence[int], *, model: str = DEFAULT_MODEL,
             kv_precision: str | None = None, indexer_precision: str | None = None, backend: str = "cpp",
             progress: Callable[[float, float, str], None] | None = None, block_size: int | None = None) -> dict:
    """Run LRU and optimal at each capacity (history tokens) in one simulator sweep.

    ``block_size`` is the fallback for lines without one (the simulator's ``--block-size``).

    Returns the trace's figures, the simulator settings (``kvsim``), its ceiling and one
    point per capacity: ``capacity_tokens``, ``capacity_blocks``, ``budget_gib`` (what to
    pass to ``kvcache-simulator run --budgets-gib``), ``status`` and per policy
    ``{"hit_rate", "hit_tokens", "total_tokens"}`` (None when ``underfilled``).
    """
    kvsim, calculator, simulator, trace_mod = modules()
    for c in capacities_tokens:
        check_int("capacity_tokens", c, minimum=1, reason="must be a positive integer")
    if not Path(trace_path).is_file():
        raise ConfigError("trace", str(trace_path), "no such file")
    try:
        trace = trace_mod.parse_trace_file(trace_path, block_size=block_size)
    except ValueError as exc:
        raise ConfigError("trace", str(trace_path), f"kvcache-simulator refuses it: {exc}") from None
    data = calculator.load_models_data()
    models = calculator.models_by_id(data)
    if model not in models:
        raise ConfigError("model", model, "unknown to kvcache-simulator; see kvcache-simulator list-models")
    blocks = [c // trace.block_size for c in capacities_tokens]
    for c, b in zip(capacities_tokens, blocks):
        if b < 1:
            raise ConfigError("capacity_tokens", c, f"is less than one block ({trace.block_size} tokens)")
    # Exactly what run_sweep computes for its byte accounting.
    estimate = simulator.estimate_tokens_for_trace(trace)
    size = calculator.calculate_cache_size(models[model], tokens=estimate, precision=kv_precision,
                                           indexer_precision=indexer_precision, block_size=trace.block_size,
                                           models_data=data)
    bytes_per_block = float(size.bytes_per_block or size.bytes_per_token * trace.block_size)
    gibs = [scaled_budget_gib(b, bytes_per_block, simulator) for b in blocks]
    result = simulator.run_sweep(trace, model_id=model, precision=kv_precision, indexer_precision=indexer_precision,
                                 budgets_gib=sorted(set(gibs)), policies=list(POLICIES), backend=backend,
                                 progress=progress, models_data=data)
    meta = result["metadata"]
    by_blocks = {p["cacheBlocks"]: p for p in result["points"]}
    points = []
    for tokens, b, gib in zip(capacities_tokens, blocks, gibs):
        point = {"capacity_tokens": tokens, "capacity_blocks": b, "budget_gib": gib}
        if b in by_blocks:
            point["status"] = "measured"
            point.update({p: _policy(by_blocks[b]["results"][p]) for p in POLICIES})
        elif b >= meta["uniqueBlocks"]:
            point["status"] = "capacity_holds_whole_trace"
            point.update({p: _policy(result["ceiling"]) for p in POLICIES})
        else:
            point["status"] = "underfilled"
            point.update({p: None for p in POLICIES})
        points.append(point)
    return {
        "trace": str(trace_path), "requests": trace.request_count, "block_size": trace.block_size,
        "unique_blocks": meta["uniqueBlocks"], "warmup_requests": meta["warmupRequests"],
        "measured_tokens": meta["totalMeasuredTokens"], "measurement": meta["measurementWindow"],
        "skipped_records": meta["skippedRecords"], "parse_errors": meta["parseErrors"],
        "kvsim": {"version": kvsim.__version__, "model": model, "backend": backend,
                  "kv_precision": meta["precision"], "indexer_precision": meta["indexerPrecision"],
                  "estimate_tokens": meta["estimateTokens"], "bytes_per_token": meta["bytesPerToken"],
                  "bytes_per_block": meta["bytesPerBlock"]},
        "ceiling": _policy(result["ceiling"]),
        "points": points,
    }
