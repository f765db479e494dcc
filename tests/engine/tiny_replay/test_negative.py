"""Negative controls: the exactness check fails when a resume restores the wrong state.

The engine's ``resume_sequence`` is overridden to tamper with turn 2's resume (the
two-turn scenario of ``conftest.py``), after the cache's load and before the model reads:
corrupt one row of the device snapshot row the lease resumes from, or restore the
snapshot with its sliding base offset shifted by one position. Each must change the
logits, whichever tier the snapshot came from (device, or L3 -> host -> a fresh device
row); a corrupted row must also show up as a mismatched object. The untampered run of the
same scenario is exact (``test_tiers.py``), so the difference is the tampering's.
"""

from __future__ import annotations

import math

import pytest
import torch

from hicache.engine.tiny_model import TOLERANCE, restore_rows
from hicache.engine.tiny_serving import TinyEngine, snapshot_rows
from tests.engine.tiny_replay.conftest import CFG, COMPUTED, FILLERS, RESUME, small_cache, two_turns


class Tampering(TinyEngine):
    """Counts the resumes it tampered with, so a test knows the tampering happened."""

    tampered = 0


def corrupting(family: str, row: int) -> type[Tampering]:
    """Adds 0.5 to every value of snapshot row ``row`` of ``family``, first layer."""

    class Corrupt(Tampering):
        tampered = 0

        def resume_sequence(self, lease):
            if lease.resume_tokens:
                rows = self.cache.pools.device.view(family)[0, lease.snapshot_id].view(torch.float64)
                width = rows.numel() // self.cache.layout.family(family).rows_kept
                rows[row * width: (row + 1) * width] += 0.5
                type(self).tampered += 1
            return super().resume_sequence(lease)

    return Corrupt


def shifting(shift: int) -> type[Tampering]:
    """Restores the snapshot's rows again, as if they belonged to positions ``shift``
    later, over the correct restore: every slot the model reads then holds a finite row
    (no NaN poison left to trip the check), only the offsets are wrong."""

    class Shift(Tampering):
        tampered = 0

        def resume_sequence(self, lease):
            seq = super().resume_sequence(lease)
            b = lease.resume_tokens
            if b:
                kept = [f for f in seq.layout.state_families if f.rows_kept]
                rows = {f.name: snapshot_rows(self.cache.pools.device, f.name, lease.snapshot_id) for f in kept}
                for fam in kept:
                    restore_rows(seq.state, fam, rows[fam.name], first_pos=b - fam.rows_kept + shift)
                type(self).tampered += 1
            return seq

    return Shift


def _tampered_turn2(tier: str, engine_cls: type[Tampering]):
    cache = small_cache()
    report = two_turns(cache, FILLERS[tier], engine_cls)
    cache.close()
    rec = report.records[0]
    assert engine_cls.tampered == 1 and rec.hit_tokens == RESUME
    assert (rec.l3_hit_tokens if tier == "l3" else rec.device_hit_tokens) == RESUME
    assert report.checked_tokens == COMPUTED
    return report


W = CFG.window


@pytest.mark.parametrize("tier", ["device", "l3"])
@pytest.mark.parametrize("family, row", [("swa_kv", 0), ("swa_kv", W - 2), ("c4_state", 0), ("c4_state", 3),
                                         ("c4_indexer_state", 0), ("c4_indexer_state", 3)])
def test_one_corrupted_snapshot_row_changes_the_logits(tier, family, row):
    report = _tampered_turn2(tier, corrupting(family, row))
    assert TOLERANCE < report.max_logit_diff < math.inf
    assert report.mismatched_pages == 1          # the snapshot; the six pages are intact
    assert report.verified_pages == RESUME // 16


@pytest.mark.parametrize("tier", ["device", "l3"])
@pytest.mark.parametrize("shift", [1, -1])
def test_a_sliding_base_offset_shifted_by_one_changes_the_logits(tier, shift):
    report = _tampered_turn2(tier, shifting(shift))
    assert TOLERANCE < report.max_logit_diff < math.inf   # finite: wrong rows, not unwritten ones
    assert report.mismatched_pages == 0          # the bytes are right, their positions are not
