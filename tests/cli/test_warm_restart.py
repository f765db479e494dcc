"""Warm restart (issue 26 part 2): an engine started on a store that a previous process
filled hits its chains, with their snapshots, from its first request -- file://, Redis and
a 3-node Redis Cluster. Two separate processes, as a restart is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cli.test_l3_cmd import store_url  # noqa: F401 (fixture: file://, a password-protected redis, a cluster)
from tests.storage.conftest import redis_cluster  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
# roomy tiers under write_back + exclusive: nothing would reach L3 without admission
FLAGS = ["--config", "tiny-hybrid", "--conversations", "4", "--l3-admit-min-tokens", "64",
         "--write-policy", "write_back", "--host-tier", "exclusive", "--prefetch-policy", "timeout",
         "--verify", "full", "--json", "--quiet"]


def replay(url: str, out: Path, *extra: str) -> tuple[dict, list[dict]]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "hicache.cli.main", "replay", *FLAGS, "--storage", url,
           "--requests-out", str(out), *extra]
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout), [json.loads(line) for line in out.read_text().splitlines()]


def test_a_restarted_engine_hits_the_previous_ones_chains_from_its_first_request(store_url, tmp_path):
    first, recs1 = replay(store_url, tmp_path / "a.jsonl")
    assert first["l3_admit_objects"] > 0 and first["mismatched_pages"] == 0
    assert recs1[0]["l3_hit_tokens"] == 0
    second, recs2 = replay(store_url, tmp_path / "b.jsonl")
    head = recs2[0]
    # the very first request resumes from the first process's chain and its snapshot
    assert head["l3_hit_tokens"] > 0 and head["l3_hit_tokens"] == head["hit_tokens"]
    assert head["mismatched_pages"] == 0 and head["verified_pages"] > 0
    assert second["recomputed_tokens"] < first["recomputed_tokens"] and second["mismatched_pages"] == 0
    assert second["l3_admit_skipped_existing"] > 0


def test_without_admission_a_restart_starts_cold(tmp_path):
    """The issue's symptom, kept as a check that the test above can fail."""
    url = f"file://{tmp_path}/l3"
    _, _ = replay(url, tmp_path / "a.jsonl", "--l3-admit", "off", "--device-pages", "4000", "--host-pages", "4000")
    _, recs = replay(url, tmp_path / "b.jsonl", "--l3-admit", "off", "--device-pages", "4000", "--host-pages", "4000")
    assert recs[0]["l3_hit_tokens"] == 0
