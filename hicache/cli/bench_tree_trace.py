"""``hicache bench tree --trace`` and ``--scale``: the facade's tree path, request by request.

Both drive the real engine calls -- ``match``, then ``load`` + ``alloc_pages`` (evicting at
capacity) + ``publish`` + ``release`` -- on pools that are allocated but never touched (a
layout of one history family with one byte per page), so what is measured is the cache's
bookkeeping: tree, eviction order, allocators, leases.

``--trace FILE --capacity-tokens N``: the method of SGLang's peer harness for its radix
caches. A token trace has one JSON object per line with ``input_ids`` and ``output_ids``
(``bench/token_trace.py`` writes one from a workload); per request, in file order,
``match(prompt)`` is one op and publishing ``prompt + output`` at finish (evicting to stay
within N tokens) is the other. ``bench/sglang_tree_compare.py`` runs SGLang's caches on
the same file the same way, in the same run.

``--scale``: the mean cost of one request (match + publish + the eviction it causes) with
~1k to ~1M pages cached. Each point fills a cache of that many pages with requests that
share prefixes, then times requests half of which extend a recent (still cached) request,
so every size does the same work per request; a cache whose costs do not depend on its
size gives ``scale_ratio`` (largest over smallest) near 1.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np

from hicache.errors import ConfigError

SCALE_POINTS = (1_024, 16_384, 262_144, 1_048_576)


def tiny_cache(page_tokens: int, device_pages: int, config: str | None = None):
    """A ``HiCache`` of ``device_pages`` pages whose contents are never touched.

    Without ``config``: one history family of one layer and one byte per page. The host tier
    holds one page and nothing is backed up (the peer harness measures one tier).
    """
    from hicache.cache import HiCache
    from hicache.config import HiCacheConfig, StorageConfig, WriteConfig, load_config
    from hicache.layout import CacheLayout, FamilySpec
    from hicache.pools import PoolConfig

    if config is None:
        layout = CacheLayout((FamilySpec("kv", "history", (0,), page_tokens, 1),), page_tokens, model="tiny-rows")
        cfg = HiCacheConfig()
    else:
        from hicache.cli.common import resolve_config
        layout, cfg = load_config(resolve_config(config))
    snaps = device_pages if layout.object_bytes("state") else 0
    pools = PoolConfig(device="cpu", device_bytes=cfg.pools.device_bytes, device_pages=device_pages,
                       device_snapshots=snaps, host_pages=1, host_snapshots=1 if snaps else 0,
                       host_layout="layer_first", host_reserve_bytes=1)
    cfg = dataclasses.replace(cfg, pools=pools, storage=StorageConfig(url="none://"),
                              write=WriteConfig(write_policy="write_through_selective",
                                                write_through_threshold=1 << 30))
    return HiCache(layout, cfg)


def serve(cache, prompt: np.ndarray, full: np.ndarray, clock: Callable[[], float] = time.perf_counter
          ) -> tuple[float, float, int]:
    """One request: match the prompt, then publish prompt + output at finish.

    Returns (match seconds, publish seconds, hit tokens). Publish covers ``load`` (lock the
    hit), ``alloc_pages`` (evicting at capacity), ``publish`` (with a snapshot at the
    finish boundary on layouts with state) and ``release``.
    """
    from hicache.cache import Boundary

    t0 = clock()
    m = cache.match(prompt)
    t1 = clock()
    lease = cache.load(m)
    n = len(full) // cache.page_tokens
    need = n - len(lease.page_table)
    if need > 0 and not cache.alloc_pages(lease, need).ok:
        cache.release(lease)
        raise ConfigError("--capacity-tokens", cache.pools.device.capacity("page") * cache.page_tokens,
                          f"too small for a request of {len(full)} tokens")
    sid = None
    if cache.layout.has_state and n > lease.published_pages:
        snap = cache.alloc_snapshot(lease)
        sid = int(snap.ids[0]) if snap.ok else None
    cache.publish(lease, full, n, snapshot_id=sid, why=Boundary.FINISH)
    cache.release(lease)
    return t1 - t0, clock() - t1, m.resume_tokens


def read_token_trace(path: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt, prompt + output) int32 arrays per line of a token trace."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("--trace", path, "no such file")
    out = []
    with p.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                prompt = np.asarray(rec["input_ids"], np.int32)
                full = np.concatenate([prompt, np.asarray(rec.get("output_ids", []), np.int32)])
            except (ValueError, KeyError, TypeError, OverflowError) as exc:
                raise ConfigError("--trace", f"{path}:{i}", f"needs input_ids and output_ids lists "
                                                           f"({str(exc)[:120]})") from None
            except RecursionError:
                raise ConfigError("--trace", f"{path}:{i}", "nests too deeply to parse") from None
            if prompt.ndim != 1 or len(prompt) == 0:
                raise ConfigError("--trace", f"{path}:{i}", "input_ids must be a non-empty list of integers")
            out.append((prompt, full))
    if not out:
        raise ConfigError("--trace", path, "holds no requests")
    return out


def _pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values) * 1e6, q)), 1)


def run_trace(trace: str, capacity_tokens: int, page_tokens: int, config: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Replay a token trace through the facade (see module docstring); the figures as a dict.

    With ``config`` the layout (and its page size) come from that config; layouts with state
    families publish a snapshot at each request's finish boundary.
    """
    if config is not None:
        from hicache.cli.common import resolve_config
        from hicache.config import load_config

        page_tokens = load_config(resolve_config(config))[0].page_tokens
    if capacity_tokens is None or capacity_tokens < page_tokens:
        raise ConfigError("--capacity-tokens", capacity_tokens, f"must be at least one page ({page_tokens})")
    requests = read_token_trace(trace)
    cache = tiny_cache(page_tokens, capacity_tokens // page_tokens, config)
    P = cache.page_tokens
    match_s, publish_s = [], []
    hit = total = 0
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    for i, (prompt, full) in enumerate(requests):
        m, p, h = serve(cache, prompt, full)
        match_s.append(m)
        publish_s.append(p)
        hit += h
        total += len(prompt)
        if progress is not None and i % 256 == 0:
            progress(i, len(requests))
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = cache.stats()
    cache.check_integrity()
    cache.close()
    return {"trace": str(trace), "requests": len(requests), "page_tokens": P,
            "capacity_tokens": capacity_tokens // P * P, "ops": 2 * len(requests),
            "seconds": round(elapsed, 4), "ops_per_s": round(2 * len(requests) / elapsed, 1),
            "cpu_seconds": round(cpu, 4), "ops_per_cpu_s": round(2 * len(requests) / cpu, 1),
            "match_us_p50": _pct(match_s, 50), "match_us_p99": _pct(match_s, 99),
            "publish_us_p50": _pct(publish_s, 50), "publish_us_p99": _pct(publish_s, 99),
            "match_us_mean": round(float(np.mean(match_s)) * 1e6, 1),
            "publish_us_mean": round(float(np.mean(publish_s)) * 1e6, 1),
            "hit_frac": round(hit / total, 4) if total else 0.0,
            "evicted_pages": stats["device_evicted_pages"] + stats["device_demoted_pages"],
            "cached_pages": stats["device_pages_used"]}


class _Requests:
    """Synthetic traffic for ``--scale``, the same work per request at every cache size.

    16 shared prefixes of 8 pages; a request is a prefix plus 24 pages of its own, or (every
    other one) one of the last 8 requests -- still cached at the smallest size -- plus 4 new
    pages. Prompts end half a page before the request's last page.
    """

    def __init__(self, page_tokens: int, seed: int = 0):
        self.P = page_tokens
        self.rng = np.random.default_rng(seed)
        self.prefixes = [self._fresh(8) for _ in range(16)]
        self.recent: list[np.ndarray] = []

    def _fresh(self, pages: int) -> np.ndarray:
        return self.rng.integers(1, 1 << 30, pages * self.P, dtype=np.int32)

    def next(self, revisit: bool) -> tuple[np.ndarray, np.ndarray]:
        base = self.recent[int(self.rng.integers(len(self.recent)))] if revisit and self.recent else None
        if base is not None and len(base) <= 60 * self.P:
            full = np.concatenate([base, self._fresh(4)])
        else:
            full = np.concatenate([self.prefixes[int(self.rng.integers(16))], self._fresh(24)])
        self.recent.append(full)
        if len(self.recent) > 8:
            self.recent.pop(0)
        return full[: len(full) - self.P // 2], full


def run_scale(points: tuple[int, ...] = SCALE_POINTS, page_tokens: int = 16, ops: int = 2000, rounds: int = 10,
              progress: Callable[[int, int], None] | None = None) -> dict:
    """Mean microseconds per request (match + publish + eviction) at each cached size.

    Every size gets its own cache, filled to capacity and warmed up first; then ``rounds``
    rounds each time ``ops / rounds`` requests on every cache in turn (the requests are made
    before the clock starts). A size's figure is its fastest round -- the one least
    disturbed by other jobs on the machine, as ``timeit`` advises; the median round is
    reported too -- and interleaving makes a change in the machine's load hit all sizes
    alike. The filled caches are frozen out of the garbage collector's scans
    (``gc.freeze()``, as long-running servers do), so a collection costs the same whatever
    the cache size.
    """
    caches, streams = [], []
    for k, pages in enumerate(points):
        cache = tiny_cache(page_tokens, pages)
        reqs = _Requests(page_tokens, seed=k)
        while cache.pools.device.num_used("page") < pages - 32:   # fill to capacity
            serve(cache, *reqs.next(revisit=False))
        for i in range(200):          # warm up at capacity (evicting from here on)
            serve(cache, *reqs.next(revisit=bool(i % 2)))
        caches.append(cache)
        streams.append(reqs)
        if progress is not None:
            progress(k + 1, len(points) + rounds)
    gc.collect()
    gc.freeze()
    per_round = max(ops // rounds, 1)
    samples: list[list[float]] = [[] for _ in points]
    try:
        for r in range(rounds):
            for k in list(range(r % len(points), len(points))) + list(range(r % len(points))):
                batch = [streams[k].next(revisit=bool(i % 2)) for i in range(per_round)]
                t0 = time.perf_counter()
                for prompt, full in batch:
                    serve(caches[k], prompt, full)
                samples[k].append((time.perf_counter() - t0) / per_round * 1e6)
            if progress is not None:
                progress(len(points) + r + 1, len(points) + rounds)
    finally:
        gc.unfreeze()
    out = []
    for k, cache in enumerate(caches):
        out.append({"cached_pages": cache.pools.device.num_used("page"),
                    "tree_nodes": cache.num_nodes,
                    "us_per_op": round(min(samples[k]), 1),
                    "us_per_op_median": round(float(np.median(samples[k])), 1),
                    "us_per_op_rounds": [round(x, 1) for x in samples[k]]})
        cache.check_integrity()
        cache.close()
    return {"page_tokens": page_tokens, "ops_per_point": per_round * rounds, "rounds": rounds,
            "scale_points": [[p["cached_pages"], p["us_per_op"]] for p in out], "points": out,
            "scale_ratio": round(out[-1]["us_per_op"] / out[0]["us_per_op"], 3)}
