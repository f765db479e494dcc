"""Two processes on one L3 store at the shipped budgets (issue 26): what the second recomputes.

For each setting the store is emptied, ``hicache replay`` runs once (it fills the store) and
again as a second process (it finds the first's chains there). Prints per setting: the
first run's recomputed tokens and what L3 admission wrote, the second's recomputed tokens,
L3 hits and mismatched pages, and the ratio (issue 26 asks for <= 0.5).

    python bench/fleet_share.py --url redis://127.0.0.1:6379/0          # a server you started
    python bench/fleet_share.py --url file:///tmp/l3 --settings default
    python bench/fleet_share.py --url redis://... --settings admit     # the default's sweep

The store at ``--url`` is purged (namespace of the config) before every setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASE = ["--config", "configs/deepseek-v4-flash.yaml", "--workload", "synthetic", "--seed", "31337"]
SETTINGS = {
    "default": [[]],
    "admit": [["--l3-admit", "off"], ["--prefetch-policy", "best_effort"],
              ["--l3-admit-min-tokens", "256"], [], ["--l3-admit-min-tokens", "4096"],
              ["--l3-admit", "reused"], ["--l3-admit-gbps", "0.005"]],
}


def replay(url: str, flags: list[str]) -> dict:
    cmd = [sys.executable, "-m", "hicache.cli.main", "replay", *BASE, "--storage", url, "--json", "--quiet", *flags]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode not in (0, 1):
        raise SystemExit(f"replay failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout)


def purge(url: str) -> None:
    if url.startswith("file://"):
        import shutil

        shutil.rmtree(url[len("file://"):], ignore_errors=True)
        return
    from hicache.storage import open_backend, purge as purge_ns, survey

    backend = open_backend(url)
    try:
        for ns in survey(backend).namespaces:
            purge_ns(backend, ns.namespace)
    finally:
        backend.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the L3 store both processes share (purged first)")
    ap.add_argument("--settings", choices=sorted(SETTINGS), default="default")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for flags in SETTINGS[args.settings]:
        purge(args.url)
        a, b = replay(args.url, flags), replay(args.url, flags)
        rows.append({"flags": " ".join(flags) or "(shipped)", "first_recomputed": a["recomputed_tokens"],
                     "admitted_bytes": a["l3_admit_bytes"], "admit_gbps": a["l3_admit_gbps"],
                     "throttled": a["l3_admit_throttled"], "second_recomputed": b["recomputed_tokens"],
                     "second_l3_hit_tokens": b["l3_hit_tokens"], "mismatched": a["mismatched_pages"] + b["mismatched_pages"],
                     "ratio": round(b["recomputed_tokens"] / max(a["recomputed_tokens"], 1), 3),
                     "ttft_p50_first": a["ttft_p50_s"], "ttft_p50_second": b["ttft_p50_s"]})
        print(json.dumps(rows[-1]) if args.json else "  ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
