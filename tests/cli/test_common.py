"""``hicache.cli.common``: what several commands share."""

from __future__ import annotations

from hicache.cli.main import build_parser
from tests.conftest import CONFIGS

BASE = ["stress", "--config", str(CONFIGS / "tiny-hybrid.yaml")]


def test_replay_and_stress_take_the_same_adaptive_flags_with_their_own_defaults():
    """One definition (``common.add_adaptive_flags``): the same flags on both commands; replay
    leaves every one to the config, stress switches often (window 16, no z, no trial)."""
    names = ("candidates", "adaptive_window", "adaptive_record", "adaptive_z", "adaptive_trial",
             "adaptive_dead_outputs", "adaptive_floor")
    stress_args = build_parser().parse_args(BASE)
    replay_args = build_parser().parse_args(["replay"])
    assert {n: getattr(replay_args, n) for n in names} == dict.fromkeys(names)
    assert {n: getattr(stress_args, n) for n in names} == {
        "candidates": None, "adaptive_window": 16, "adaptive_record": None, "adaptive_z": 0.0,
        "adaptive_trial": 0, "adaptive_dead_outputs": None, "adaptive_floor": None}
    given = ["--candidates", "lru,value", "--adaptive-window", "7", "--adaptive-record", "3", "--adaptive-z", "1.5",
             "--adaptive-trial", "9", "--adaptive-dead-outputs", "4", "--adaptive-floor", "off"]
    for args in (build_parser().parse_args(BASE + given), build_parser().parse_args(["replay"] + given)):
        assert [getattr(args, n) for n in names] == ["lru,value", 7, 3, 1.5, 9, 4, "off"]
