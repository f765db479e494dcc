"""``hicache sweep --policies``: the share of the simulator's LRU -> optimal gap a policy
closes, and the side-by-side table, on hand-made numbers."""

from __future__ import annotations

import pytest

from hicache.cli.sweep_report import gap_closed, policy_entry, print_policies_table


def test_gap_closed_on_hand_made_numbers():
    assert gap_closed(0.85, 0.8, 0.9) == pytest.approx(0.5)
    assert gap_closed(0.8, 0.8, 0.9) == 0.0          # LRU
    assert gap_closed(0.9, 0.8, 0.9) == pytest.approx(1.0)   # optimal
    assert gap_closed(0.75, 0.8, 0.9) == pytest.approx(-0.5)   # below LRU: the sign is kept
    assert gap_closed(0.95, 0.8, 0.9) == pytest.approx(1.5)    # above the simulator's optimal
    assert gap_closed(0.3, 0.2, 0.6) == pytest.approx(0.25)
    assert gap_closed(0.9, 0.8, 0.8) is None         # no gap
    assert gap_closed(0.9, 0.8, 0.7) is None         # optimal below LRU: no gap to close
    assert gap_closed(0.9, None, None) is None       # the simulator did not run, or was underfilled
    assert gap_closed(None, 0.8, 0.9) is None


def _summary(**kw) -> dict:
    s = {"hit_rate": 0.5, "hit_rate_last_half": 0.6, "hit_rate_last_half_sim": None, "eviction": "lru",
         "policy_followed": "lru", "policy_switches": 0, "rejected_requests": 0, "mismatched_pages": 0,
         "wall_s": 0.1, "device_pages": 10, "host_pages": 20}
    s.update(kw)
    return s


def test_a_policy_entry_compares_the_simulators_measure_at_our_precision():
    sim = {"sim_lru": 0.87634, "sim_optimal": 0.90387}
    e = policy_entry(_summary(hit_rate_last_half=0.8763), sim)
    # ours is rounded to 4 places: the simulator's LRU too, so a tie is a tie
    assert (e["measure"], e["measured"], e["at_least_sim_lru"], e["gap_closed"]) == \
           ("hit_rate_last_half", 0.8763, True, 0.0)
    e = policy_entry(_summary(hit_rate_last_half=0.95, hit_rate_last_half_sim=0.8901), sim)
    assert (e["measure"], e["measured"]) == ("hit_rate_last_half_sim", 0.8901)   # a trace: its own measure
    assert e["gap_closed"] == round((0.8901 - 0.8763) / (0.9039 - 0.8763), 4)
    e = policy_entry(_summary(hit_rate_last_half=0.85), sim)
    assert e["at_least_sim_lru"] is False and e["gap_closed"] < 0
    e = policy_entry(_summary(), {"sim_lru": None, "sim_optimal": None})
    assert e["gap_closed"] is None and e["at_least_sim_lru"] is None
    assert "device_pages" not in e   # a budget field: the point's, not the policy's


def test_the_policies_table_shows_each_policys_gap_and_mark(capsys):
    point = {"device_gib": 1.0, "host_gib": 2.0, "device_pages": 10, "host_pages": 20, "sim_status": "measured",
             "sim_lru": 0.8, "sim_optimal": 0.9, "policies": {
                 "lru": policy_entry(_summary(hit_rate_last_half=0.75), {"sim_lru": 0.8, "sim_optimal": 0.9}),
                 "adaptive": policy_entry(_summary(hit_rate_last_half=0.85, eviction="adaptive",
                                                   policy_followed="value", policy_switches=3),
                                          {"sim_lru": 0.8, "sim_optimal": 0.9})}}
    out = {"config": "configs/x.yaml", "workload": "w", "requests": 10, "write_policy": "write_back",
           "bytes": "none", "ceiling": 0.9, "ceiling_last_half": 0.95, "sim_model": None,
           "policies": ["lru", "adaptive"], "measure": "hit_rate_last_half", "points": [point]}
    print_policies_table(out)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("hicache sweep: x, w, 10 requests, device 1 GiB, write_back, policy-only")
    assert lines[1].split() == ["host", "GiB", "pages", "dev", "+", "host", "lru", "adaptive", "sim", "LRU", "sim",
                                "optimal", "gap", "lru", "gap", "adaptive", "adaptive", "follows", "(switches)",
                                "mismatched"]
    assert lines[3].split() == ["2", "10", "+", "20", "75.00%", "<", "85.00%", ">=", "80.00%", "90.00%", "-50.0%",
                                "50.0%", "value", "(3)", "0"]
    assert "policy columns: hit_rate_last_half: every prompt token" in lines[5]
