"""``hicache replay --model tiny``: the tiny DeepSeek-V4-style model served through every tier,
each computed logit compared with a full recompute without cache.

    hicache replay --model tiny [--conversations N] [--seed S] [--storage URL] [--device DEV]
                   [--retention N|none] [--max-running N] [--json] [--quiet]
                   [--requests-out FILE.jsonl] [--plot FILE.png]

The model's layout comes from its own config (``layout_for(TinyV4Config())``) and its pools
are counted in pages (:class:`~hicache.engine.tiny_serving.TinyPools`), so ``--config``,
``--device-gib``, ``--host-gib``, the clock flags, ``--verify``, ``--workload`` and ``--trace``
do not apply and are refused (it checks every byte and every logit). Exit status 1 when a
logit differs by more than ``TOLERANCE`` (1e-9) or a page read back differs from the
recompute's bits.
"""

from __future__ import annotations

import argparse
import math

import torch

from hicache.cli.common import at_least, parse_retention
from hicache.cli.limits import check_units
from hicache.cli.progress import Progress
from hicache.cli.replay_report import hit_rows
from hicache.cli.table import render_table
from hicache.errors import ConfigError
from hicache.storage import mask_url

DEFAULT_CONVERSATIONS = 6
_NOT_FOR_TINY = (("config", "--config", None), ("device_gib", "--device-gib", None),
                 ("host_gib", "--host-gib", None), ("prefill_tps", "--prefill-tps", None),
                 ("decode_step_ms", "--decode-step-ms", None), ("h2d_gbps", "--h2d-gbps", None),
                 ("d2h_gbps", "--d2h-gbps", None), ("l3_gbps", "--l3-gbps", None),
                 ("l3_rtt_ms", "--l3-rtt-ms", None), ("verify", "--verify", None), ("bytes", "--bytes", "real"),
                 ("trace", "--trace", None), ("workload", "--workload", "multi-turn"))


def _check_args(args: argparse.Namespace) -> tuple[int, int | None]:
    """Refuse flags that mean nothing for the tiny model; returns (conversations, retention)."""
    for attr, flag, default in _NOT_FOR_TINY:
        value = getattr(args, attr, default)
        if value != default:
            raise ConfigError(flag, value, "does not apply to --model tiny (its layout, pools and "
                                           "workload come from the tiny model's config)")
    n = args.conversations if args.conversations is not None else DEFAULT_CONVERSATIONS
    at_least("--conversations", n, 1)
    check_units("--conversations", n, "tiny")
    at_least("--max-running", args.max_running, 1)
    retention = None if args.retention is None else parse_retention("--retention", args.retention)
    return n, retention


def build_summary(cache, report, pools, model_cfg) -> dict:
    """One flat dict: the synthetic replay's keys that apply, plus the exactness figures."""
    from hicache.engine.tiny_model import TOLERANCE

    s = cache.stats()
    recs = report.records
    prompt = sum(r.prompt_tokens for r in recs)
    hit = sum(r.hit_tokens for r in recs)
    diff = report.max_logit_diff
    return {
        "model": "tiny-v4",
        "requests": len(recs),
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_rate": round(hit / prompt, 4) if prompt else 0.0,
        "device_hit_tokens": sum(r.device_hit_tokens for r in recs),
        "host_hit_tokens": sum(r.host_hit_tokens for r in recs),
        "l3_hit_tokens": sum(r.l3_hit_tokens for r in recs),
        "recomputed_tokens": sum(r.recomputed_tokens for r in recs),
        "checked_tokens": report.checked_tokens,
        # JSON has no infinity: a NaN logit (a row read that nobody wrote) reports "inf".
        "max_logit_diff": diff if math.isfinite(diff) else "inf",
        "tolerance": TOLERANCE,
        "exact": diff == 0.0,
        "verified_pages": report.verified_pages,
        "mismatched_pages": report.mismatched_pages,
        "device_evicted_pages": s["device_evicted_pages"] + s["device_demoted_pages"],
        "host_evicted_pages": s["host_evicted_pages"],
        "loaded_pages": s["loaded_pages"],
        "l3_prefetched_pages": s["l3_prefetched_pages"],
        "l3_put_objects": s["l3_put_objects"],
        "snapshots_offered": s["snapshots_offered"],
        "snapshots_kept": s["snapshots_kept"],
        "snapshots_provisional": s["snapshots_provisional"],
        "snapshots_dropped_retention": s["snapshots_dropped_retention"],
        "snapshots_evicted": s["snapshots_evicted_device"] + s["snapshots_evicted_host"],
        "l3_errors": s["l3_errors"],
        "l3_rejected": s["l3_rejected"],
        "steps": report.steps,
        "admission_waits": report.admission_waits,
        "load_failures": report.load_failures,
        "page_tokens": model_cfg.page_tokens,
        "device_pages": pools.device_pages,
        "device_snapshots": pools.device_snapshots,
        "host_pages": pools.host_pages,
        "host_snapshots": pools.host_snapshots,
        "retention_interval": cache.config.tree.retention_interval,
        "storage_url": mask_url(cache.config.storage.url),
        "device": str(cache.pools.device.device),   # where the device tier's pools live
        "wall_s": round(report.wall_s, 2),
    }


def print_summary(s: dict, *, title: str) -> None:
    pt = max(s["prompt_tokens"], 1)

    def share(n: int) -> str:
        return f"{n:,} ({n / pt:.1%})"

    diff = s["max_logit_diff"]
    if diff == 0.0:
        diff_text = "0 (bit-exact)"
    else:
        verdict = "ok" if diff != "inf" and diff <= s["tolerance"] else "FAILED"
        diff_text = f"{diff if diff == 'inf' else format(diff, '.3g')} ({verdict})"
    rows = hit_rows(s) + [
        ["recomputed tokens", share(s["recomputed_tokens"])],
        ["logits checked (tokens)", f"{s['checked_tokens']:,}"],
        [f"max |logit diff| (tolerance {s['tolerance']:g})", diff_text],
        ["pages verified / mismatched", f"{s['verified_pages']:,} / {s['mismatched_pages']:,}"],
        ["evicted pages device / host", f"{s['device_evicted_pages']:,} / {s['host_evicted_pages']:,}"],
        ["pages loaded from host / prefetched from L3", f"{s['loaded_pages']:,} / {s['l3_prefetched_pages']:,}"],
        ["snapshots offered / kept / provisional", f"{s['snapshots_offered']:,} / {s['snapshots_kept']:,} / "
                                                   f"{s['snapshots_provisional']:,}"],
        ["snapshots dropped (retention) / evicted", f"{s['snapshots_dropped_retention']:,} / "
                                                    f"{s['snapshots_evicted']:,}"],
        ["L3 faults / rejected values", f"{s['l3_errors']:,} / {s['l3_rejected']:,}"],
        ["pools device / host (pages, snapshots)", f"{s['device_pages']}, {s['device_snapshots']} / "
                                                   f"{s['host_pages']}, {s['host_snapshots']}"],
        ["retention / L3", f"{'none' if s['retention_interval'] is None else s['retention_interval']} / "
                           f"{s['storage_url']}"],
        ["wall time", f"{s['wall_s']} s"],
    ]
    print(render_table(["metric", "value"], rows, align="lr", title=title))


def run_tiny(args: argparse.Namespace) -> int:
    from hicache.cli.replay_report import emit
    from hicache.engine.tiny_model import TOLERANCE, TinyV4Config, TinyV4Model
    from hicache.engine.tiny_serving import TinyEngine, TinyEngineConfig, TinyPools, tiny_cache, tiny_workload

    conversations, retention = _check_args(args)
    model_cfg = TinyV4Config()
    pools = TinyPools()
    requests = tiny_workload(conversations, args.seed, vocab=model_cfg.vocab)
    # --device puts the pools there (the model computes on the CPU in float64 and reads and
    # writes its rows across the boundary), so the same exactness check covers CUDA pools.
    cache = tiny_cache(model_cfg, pools=pools, storage_url="memory://" if args.storage is None else args.storage,
                       retention=retention, device=args.device or "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: extra intra-op threads only add barrier waits
    try:
        engine = TinyEngine(cache, TinyV4Model(model_cfg), TinyEngineConfig(max_running=args.max_running),
                            progress=Progress("replay tiny", len(requests), enabled=not args.quiet))
        report = engine.run(requests)
        cache.check_integrity()
        summary = build_summary(cache, report, pools, model_cfg)
    finally:
        torch.set_num_threads(threads)
        cache.close()
    emit(args, summary, report,
         lambda: print_summary(summary, title=f"hicache replay --model tiny: {len(requests)} requests, "
                                              f"{model_cfg.num_layers} layers, {model_cfg.page_tokens}-token pages"))
    diff = report.max_logit_diff
    return 0 if diff <= TOLERANCE and summary["mismatched_pages"] == 0 else 1
