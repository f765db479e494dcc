"""How the GPU suite judges each step's output, and the markdown it writes.

Kept apart from the runner (``suite.py``) so the tests can feed it recorded outputs: a
step passes only on exit status 0 *and* what its output says (every byte verified, no
page mismatched, bit-exact logits, no test failed), never on the exit status alone.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

GB = 1e9


def _last_json(text: str) -> dict | None:
    """The last JSON object that starts a line and runs to the end of ``text`` (the commands
    print one, last; their progress goes to standard error)."""
    for m in reversed(list(re.finditer(r"(?m)^\{", text))):
        try:
            obj = json.loads(text[m.start():])
        except ValueError:
            continue
        return obj if isinstance(obj, dict) else None
    return None


def junit_cases(path: Path) -> list[dict]:
    """Every test case of a pytest JUnit XML file: its id, outcome and first message line."""
    if not path.is_file():
        return []
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return []
    cases = []
    for tc in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = (el.get("message") or el.text or "").strip()
                message = text.splitlines()[0][:300] if text else ""
                break
        cases.append({"test": f"{tc.get('classname', '')}::{tc.get('name', '')}", "outcome": outcome,
                      "seconds": float(tc.get("time") or 0), "message": message})
    return cases


def verbose_cases(stdout: str) -> list[dict]:
    """Test outcomes from ``pytest -v`` lines, when no JUnit file was written (a run killed
    at its timeout): ``tests/a.py::test_x[cuda] PASSED  [ 10%]``."""
    words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped", "XFAIL": "skipped"}
    cases = []
    for m in re.finditer(r"(?m)^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL)\b", stdout):
        cases.append({"test": m.group(1), "outcome": words[m.group(2)], "seconds": 0.0, "message": ""})
    return cases


def judge(kind: str, rc: int, stdout: str, junit: Path, status: str | None = None) -> dict:
    """``status`` (pass / fail, or a ``timeout`` already found), a one-line ``summary`` and
    the ``data`` the tables use, from a step's exit status and standard output."""
    out: dict = {}
    if kind == "tests":
        cases = junit_cases(junit) or verbose_cases(stdout)
        counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
        bad = [c for c in cases if c["outcome"] in ("failed", "error")]
        out.update(data={"counts": counts, "cases": cases},
                   summary=f"{counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
                           f"{counts['skipped']} skipped")
        ok = rc == 0 and not bad and counts["passed"] > 0
    else:
        data = _last_json(stdout)
        out["data"] = data
        ok = rc == 0 and data is not None and _good(kind, data)
        out["summary"] = _summary(kind, data) if data is not None else "no JSON output"
    out["status"] = status or ("pass" if ok else "fail")
    return out


def _good(kind: str, d: dict) -> bool:
    if kind == "env":
        return "torch" in d
    if kind == "replay":
        return d.get("mismatched_pages") == 0 and d.get("verified_pages", 0) > 0
    if kind == "replay_tiny":
        return d.get("mismatched_pages") == 0 and d.get("exact") is True
    return d.get("verified") is True   # transfer, overlap, tune


def _summary(kind: str, d: dict) -> str:
    if kind == "env":
        return f"{d.get('gpu') or 'no GPU'}; torch {d.get('torch')}, triton {d.get('triton')}, CUDA {d.get('cuda')}"
    if kind == "replay":
        return (f"{d.get('requests')} requests, {d.get('verified_pages', 0):,} pages checked, "
                f"{d.get('mismatched_pages')} mismatched; hits device/host/L3 {d.get('device_hit_tokens', 0):,} / "
                f"{d.get('host_hit_tokens', 0):,} / {d.get('l3_hit_tokens', 0):,} tokens")
    if kind == "replay_tiny":
        return (f"{d.get('requests')} requests, max logit diff {d.get('max_logit_diff')}, "
                f"{d.get('mismatched_pages')} pages mismatched; hits device/host/L3 {d.get('device_hit_tokens', 0):,} / "
                f"{d.get('host_hit_tokens', 0):,} / {d.get('l3_hit_tokens', 0):,} tokens")
    if kind == "transfer":
        return (f"{d.get('layout')}: D2H {d.get('d2h_ratio', 0):.2f}x, H2D {d.get('h2d_ratio', 0):.2f}x, "
                f"both {d.get('duplex_ratio', 0):.2f}x of the contiguous copy; verified {d.get('verified')}")
    if kind == "overlap":
        return (f"{d.get('layout')}: {d.get('hidden_per_layer', 0):.0%} of the copy hidden with per-layer "
                f"waits ({d.get('hidden_free', 0):.0%} without); verified {d.get('verified')}")
    if kind == "tune":
        best = d.get("best") or []
        worst = min(best, key=lambda b: b.get("default_x") or 0, default=None)
        return (f"{len(d.get('rows') or [])} launch shapes, verified {d.get('verified')}; shipped default "
                f"{(d.get('default_chunk_bytes') or 0) >> 10} KiB x {d.get('default_num_warps')} warps, lowest "
                + (f"{_f(worst.get('default_x'))}x DMA ({worst['layout']} {worst['host_layout']} {worst['direction']})"
                   if worst else "-"))
    return ""


def _f(x: object, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt) if isinstance(x, (int, float)) else str(x)


def markdown(result: dict) -> str:
    """The suite's tables: steps, copy bandwidth, overlap, and any failed test."""
    steps = result.get("steps", {})
    env = (steps.get("env") or {}).get("data") or {}
    title = "CPU dry run" if result.get("device") == "cpu" else f"GPU run on {env.get('gpu', 'an unknown GPU')}"
    lines = [f"## GPU suite: {title}", "",
             f"{result.get('started', '')}; commit {result.get('commit', '?')}; python {env.get('python')}, "
             f"torch {env.get('torch')}, triton {env.get('triton')}, CUDA {env.get('cuda')}, "
             f"driver {env.get('nvidia_smi', '-')}; {env.get('cpus')} CPUs", "",
             "| step | status | seconds | result |", "|---|---|---|---|"]
    for name, r in steps.items():
        lines.append(f"| {name} | {r.get('status')} | {_f(r.get('seconds'), '.1f')} | "
                     f"{r.get('summary') or r.get('reason', '')} |")
    if "passed" in result:
        lines += ["", f"All steps passed: **{'yes' if result['passed'] else 'no'}** "
                      f"({_f(result.get('seconds'), '.0f')} s of a {_f(result.get('budget_s'), '.0f')} s budget)"]
    transfers = [r["data"] for r in steps.values() if r.get("data") and "d2h_ratio" in r["data"]]
    if transfers:
        lines += ["", "### Copy bandwidth: GB/s, and x the contiguous copy of the same bytes", "",
                  "| layout | per direction | path | hicache | contiguous copy | hicache x copy | per-page loop | "
                  "loop x copy |", "|---|---|---|---|---|---|---|---|"]
        for d in transfers:
            size = f"{d.get('bytes', 0) / 2**20:,.0f} MiB"
            limit = {k: d[f"{k}_gbps"] / d[f"{k}_ratio"] if d.get(f"{k}_ratio") else None for k in ("d2h", "h2d")}
            for key, label in (("d2h", "D2H"), ("h2d", "H2D")):
                lines.append(f"| {d.get('layout')} | {size} | {label} | {_f(d.get(f'{key}_gbps'))} | "
                             f"{_f(limit[key])} | {_f(d.get(f'{key}_ratio'))} | "
                             f"{_f(d.get(f'naive_{key}_gbps'))} | {_f(d.get(f'naive_{key}_ratio'))} |")
            lines.append(f"| {d.get('layout')} | {size} | H2D layer by layer | {_f(d.get('h2d_per_layer_gbps'))} | "
                         f"{_f(limit['h2d'])} | {_f(d.get('h2d_per_layer_ratio'))} | | |")
            if "duplex_gbps" in d:
                lines.append(f"| {d.get('layout')} | {size} | both at once (sum) | {_f(d.get('duplex_gbps'))} | "
                             f"{_f(d.get('memcpy_duplex_gbps'))} | {_f(d.get('duplex_ratio'))} | | |")
        on_gpu = all(d.get("device") != "cpu" for d in transfers)
        lines += ["", f"Backend {transfers[0].get('backend')} on {transfers[0].get('device')}; every byte verified: "
                      f"{all(d.get('verified') for d in transfers)}. The contiguous copy: "
                      + ("one pinned `copy_` of the same bytes per direction (cudaMemcpyAsync, the DMA limit); both "
                         "at once, one on each of two streams." if on_gpu else
                         "the faster of torch `copy_` and a streaming memcpy, one limit for both directions (on a "
                         "CPU both share one memory bus; both at once: the two one after the other).")]
    overlaps = [r["data"] for name, r in steps.items() if name.startswith("overlap") and r.get("data")]
    if overlaps:
        lines += ["", "### Per-layer load behind a stand-in layer compute", "",
                  "| layout | copy programs | pages | layers | copy ms | compute ms | wait_layer + compute ms | hidden | "
                  "no waits ms | hidden | bound |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for ov in overlaps:
            lines.append(f"| {ov.get('layout')} | {ov.get('gpu_programs') or 'one per chunk'} | {ov.get('pages')} | "
                         f"{ov.get('layers')} | {_f(ov.get('copy_s', 0) * 1e3)} | "
                         f"{_f(ov.get('compute_s', 0) * 1e3)} | {_f(ov.get('per_layer_s', 0) * 1e3)} | "
                         f"{_f(ov.get('hidden_per_layer'))} | {_f(ov.get('free_s', 0) * 1e3)} | "
                         f"{_f(ov.get('hidden_free'))} | {_f(ov.get('hidden_bound_per_layer'))} |")
        ov = overlaps[0]
        lines += ["", f"Stand-in: {ov.get('matmuls_per_layer')} x {ov.get('matmul')}^2 matmul per layer; copy "
                      f"{', '.join(_f(o.get('copy_gbps')) for o in overlaps)} GB/s."]
    tune = (steps.get("tune-copy") or {}).get("data")
    if tune and tune.get("best"):
        lines += ["", "### Triton launch shape: x the DMA copy of the same bytes", "",
                  "| layout | host layout | direction | DMA GB/s | one program per unit | shipped default | best | "
                  "best shape | one copy_ per unit | default on N programs |", "|---|---|---|---|---|---|---|---|---|---|"]
        for b in tune["best"]:
            lines.append(f"| {b['layout']} | {b['host_layout']} | {b['direction']} | {_f(b.get('dma_gbps'))} | "
                         f"{_f(b.get('whole_unit_x'))} | {_f(b.get('default_x'))} | {_f(b.get('best_x'))} | "
                         f"{(b.get('best_chunk_bytes') or 0) >> 10} KiB x {b.get('best_num_warps')} warps, "
                         f"{b.get('best_vec_bytes')} B access | {_f(b.get('per_unit_copy_x'))} | "
                         + (", ".join(f"{k}: {_f(v)}" for k, v in (b.get("bounded_x") or {}).items()) or "-")
                         + " |")
        lines += ["", f"Shipped default: {(tune.get('default_chunk_bytes') or 0) >> 10} KiB per program, "
                      f"{tune.get('default_num_warps')} warps, {tune.get('default_vec_bytes')} B access "
                      "(0 KiB: one program per unit)."]
    tests = ((steps.get("tests") or {}).get("data") or {}).get("cases") or []
    bad = [c for c in tests if c["outcome"] in ("failed", "error")]
    if bad:
        lines += ["", "### Failed tests", ""] + [f"- `{c['test']}`: {c['message']}" for c in bad]
    return "\n".join(lines) + "\n"
