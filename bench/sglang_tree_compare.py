"""``hicache bench tree --trace`` against SGLang's radix caches on the same token trace, in one run.

    python bench/sglang_tree_compare.py TOKENS.jsonl --capacity-tokens 262144 \\
        [--sglang-python VENV/bin/python] [--rounds 3] [--json]

Three sides, each a fresh process per round, in rotating order within a round:

* ``hicache``: ``python -m hicache.cli.main bench tree --trace ... --json`` from this checkout
  (the facade: ``match``, then ``load`` + ``alloc_pages`` + ``publish`` + ``release``);
* ``sglang-python``: SGLang's ``RadixCache`` (pure Python);
* ``sglang-rust``: SGLang's ``UnifiedRadixCache`` over its Rust ``TreeCore`` (the default
  backend; one FULL component), i.e. what its scheduler calls.

The SGLang sides run this file with ``--worker`` in SGLang's venv (``.ci/sglang_venv.sh``,
i.e. ``../shared/tools/setup_sglang_venv.sh``), the way its peer harness drives a cache: per
request ``match_prefix(prompt[:-1])`` (one op), then at finish (the other op) lock the
matched node, read its device indices, evict to make room at the capacity, allocate the
rest from a ``PagedTokenToKVPoolAllocator`` (pools allocated, never touched), insert
prompt + output (page-aligned), free the duplicates insert reports, unlock. Each side
reports ops/s (2 ops per request), p50/p99 of both ops and the hit fraction; the table
gives the median over rounds and the ratios hicache / SGLang (median of the per-round
ratios, each round's sides measured back to back), per CPU second, and of each side's best
round (the one least disturbed by other jobs on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROG = "bench/sglang_tree_compare.py"
SIDES = ("hicache", "sglang-python", "sglang-rust")
KEYS = ("ops_per_s", "ops_per_cpu_s", "match_us_p50", "match_us_p99", "publish_us_p50", "publish_us_p99",
        "hit_frac")


# -- the SGLang worker (runs in SGLang's venv; imports nothing of hicache) ----------------------
def _stub_missing_modules() -> None:
    """SGLang's mem_cache import chain reaches torchvision, tvm_ffi and datasets, which a CPU
    venv lacks; give it empty modules (transformers records torchvision as absent first)."""
    import importlib.abc
    import importlib.machinery
    import types

    class Anything:
        def __init__(self, name: str):
            self._name = name

        def __getattr__(self, attr: str):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return Anything(f"{self._name}.{attr}")

        def __call__(self, *args, **kwargs):
            return Anything(f"{self._name}()")

        def __mro_entries__(self, bases):
            return (object,)

    class Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        names = ("tvm_ffi", "datasets", "torchvision")

        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in self.names:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return types.ModuleType(spec.name)

        def exec_module(self, module):
            module.__path__ = []
            module.__getattr__ = lambda attr, _n=module.__name__: Anything(f"{_n}.{attr}")

    import transformers.utils.import_utils  # noqa: F401  (decides "no torchvision" before the stub exists)
    sys.meta_path.insert(0, Stubs())


def _worker(kind: str, trace: str, capacity: int, page: int) -> dict:
    import gc
    import warnings
    from array import array

    import numpy as np

    warnings.filterwarnings("ignore")
    _stub_missing_modules()
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    requests = []
    with open(trace, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                full = rec["input_ids"] + rec.get("output_ids", [])
                requests.append((array("q", rec["input_ids"][:-1]), array("q", full[: len(full) // page * page]),
                                 len(rec["input_ids"])))
    capacity = capacity // page * page
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=page))
    kv = MHATokenToKVPool(size=capacity, page_size=page, dtype=torch.bfloat16, head_num=1, head_dim=1, layer_num=1,
                          device="cpu", enable_memory_saver=False)
    alloc = PagedTokenToKVPoolAllocator(capacity, page, torch.bfloat16, "cpu", kv, need_sort=False)
    params = CacheInitParams(disable=False, req_to_token_pool=ReqToTokenPool(4, 8, "cpu", False),
                             token_to_kv_pool_allocator=alloc, page_size=page, eviction_policy="lru")
    if kind == "sglang-python":
        cache = RadixCache(params)
        backend = "RadixCache (python)"
    else:
        import dataclasses

        from sglang.srt.environ import envs
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        params = dataclasses.replace(params, tree_components=(ComponentType.FULL,))
        with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override("rust"):
            cache = UnifiedRadixCache(params=params)
        backend = f"UnifiedRadixCache ({cache._tree_core_backend} TreeCore)"
        assert cache._tree_core_backend == "rust", f"got the {cache._tree_core_backend} TreeCore"

    clock = time.perf_counter
    match_s, publish_s = [], []
    hit = total = 0
    gc.collect()
    c_start, t_start = time.process_time(), clock()
    for prompt, full, prompt_len in requests:
        t0 = clock()
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(prompt)))
        t1 = clock()
        lock = cache.lock(m.last_device_node)
        pre = m.device_prefix_len
        prefix = cache.path_device_indices(m.last_device_node)[:pre]
        need = len(full) - pre
        if need > 0:
            free = alloc.available_size()
            if free < need:
                cache.evict(EvictParams(num_tokens=need - free))
            new = alloc.alloc(need)
            assert new is not None, "capacity too small for one request"
            value = torch.cat([prefix, new])
        else:
            value = prefix[: len(full)]
        res = cache.insert(InsertParams(key=RadixKey(full), value=value))
        if res.prefix_len > pre:
            alloc.free(value[pre: res.prefix_len])   # duplicates of pages already in the tree
        cache.unlock(lock)
        t2 = clock()
        match_s.append(t1 - t0)
        publish_s.append(t2 - t1)
        hit += pre
        total += prompt_len
    elapsed, cpu = clock() - t_start, time.process_time() - c_start
    pct = lambda v, q: round(float(np.percentile(np.asarray(v) * 1e6, q)), 1)  # noqa: E731
    return {"backend": backend, "requests": len(requests), "seconds": round(elapsed, 4),
            "ops_per_s": round(2 * len(requests) / elapsed, 1), "cpu_seconds": round(cpu, 4),
            "ops_per_cpu_s": round(2 * len(requests) / cpu, 1),
            "match_us_p50": pct(match_s, 50), "match_us_p99": pct(match_s, 99),
            "publish_us_p50": pct(publish_s, 50), "publish_us_p99": pct(publish_s, 99),
            "hit_frac": round(hit / total, 4)}


# -- the driver ------------------------------------------------------------------------------
def _run_side(side: str, args: argparse.Namespace) -> dict:
    if side == "hicache":
        cmd = [sys.executable, "-m", "hicache.cli.main", "bench", "tree", "--trace", args.trace,
               "--capacity-tokens", str(args.capacity_tokens), "--page-tokens", str(args.page_tokens), "--json"]
    else:
        cmd = [args.sglang_python, str(Path(__file__).resolve()), args.trace, "--capacity-tokens",
               str(args.capacity_tokens), "--page-tokens", str(args.page_tokens), "--worker", side]
    # One intra-op thread on every side: the ops are on tiny tensors, and on a shared box
    # idle OpenMP workers only add noise (this favours SGLang, whose ops are torch calls).
    env = dict(os.environ, PYTHONPATH=str(ROOT) if side == "hicache" else "", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise SystemExit(f"{PROG}: error: {side} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="token trace (JSONL with input_ids / output_ids)")
    p.add_argument("--capacity-tokens", type=int, required=True)
    p.add_argument("--page-tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    venv = os.environ.get("HICACHE_SGLANG_VENV") or str(ROOT.parent / "venvs" / "sglang")
    p.add_argument("--sglang-python", default=f"{venv}/bin/python",
                   help="python of a venv with sglang 0.5.23 (default: $HICACHE_SGLANG_VENV or ../venvs/sglang, "
                        "as .ci/sglang_venv.sh builds it)")
    p.add_argument("--worker", choices=SIDES[1:], help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(args.worker, args.trace, args.capacity_tokens, args.page_tokens)))
        return 0
    for name, value, low in (("--capacity-tokens", args.capacity_tokens, args.page_tokens), ("--rounds", args.rounds, 1)):
        if value < low:
            print(f"{PROG}: error: {name}={value}: must be at least {low}", file=sys.stderr)
            return 2
    if not Path(args.trace).is_file():
        print(f"{PROG}: error: trace={args.trace}: no such file", file=sys.stderr)
        return 2
    if not Path(args.sglang_python).is_file():
        print(f"{PROG}: error: --sglang-python={args.sglang_python}: no such file "
              "(build one with ../shared/tools/setup_sglang_venv.sh)", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    for r in range(args.rounds):
        order = SIDES[r % 3:] + SIDES[: r % 3]
        for side in order:
            runs[side].append(_run_side(side, args))
            print(f"{PROG}: round {r + 1}/{args.rounds} {side}: {runs[side][-1]['ops_per_s']} ops/s",
                  file=sys.stderr)
    med = {s: {k: statistics.median(run[k] for run in runs[s]) for k in KEYS} for s in SIDES}
    ratios = {f"vs_{s.replace('-', '_')}": round(statistics.median(
        h["ops_per_s"] / o["ops_per_s"] for h, o in zip(runs["hicache"], runs[s])), 3) for s in SIDES[1:]}
    cpu_ratios = {f"vs_{s.replace('-', '_')}": round(statistics.median(
        h["ops_per_cpu_s"] / o["ops_per_cpu_s"] for h, o in zip(runs["hicache"], runs[s])), 3) for s in SIDES[1:]}
    best = {s: max(run["ops_per_s"] for run in runs[s]) for s in SIDES}
    best_ratios = {f"vs_{s.replace('-', '_')}": round(best["hicache"] / best[s], 3) for s in SIDES[1:]}
    out = {"trace": args.trace, "capacity_tokens": args.capacity_tokens, "page_tokens": args.page_tokens,
           "rounds": args.rounds, "median": med, "ops_per_s_ratio": ratios,
           "ops_per_cpu_s_ratio": cpu_ratios, "best_ops_per_s": best, "best_ops_per_s_ratio": best_ratios,
           "backends": {s: runs[s][0].get("backend", "hicache facade") for s in SIDES},
           "per_round_ops_per_s": {s: [run["ops_per_s"] for run in runs[s]] for s in SIDES}}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.trace}: capacity {args.capacity_tokens} tokens, page {args.page_tokens}, "
          f"median of {args.rounds} rounds")
    print(f"{'side':<15}" + "".join(f"{k:>16}" for k in KEYS))
    for s in SIDES:
        print(f"{s:<15}" + "".join(f"{med[s][k]:>16}" for k in KEYS))
    print("hicache ops/s over: " + ", ".join(f"{k[3:]} {v}x" for k, v in ratios.items())
          + "   (per CPU second: " + ", ".join(f"{k[3:]} {v}x" for k, v in cpu_ratios.items())
          + "; best rounds: " + ", ".join(f"{k[3:]} {v}x" for k, v in best_ratios.items()) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
