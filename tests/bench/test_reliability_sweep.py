"""bench/reliability_sweep.py: every configuration it draws is a valid ``hicache stress`` command
that reaches the cache, and a run's summary counts what it ran."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from hicache.cli.main import build_parser
from hicache.cli.stress_cmd import build_cache, check_args

SPEC = importlib.util.spec_from_file_location("reliability_sweep",
                                              Path(__file__).parents[2] / "bench" / "reliability_sweep.py")
rs = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(rs)


def test_every_drawn_configuration_parses_and_its_adaptive_flags_reach_the_cache():
    rng = random.Random(3)
    seen = set()
    for _ in range(60):
        argv = rs.draw(rng, 10)
        args = build_parser().parse_args(["stress", *argv])
        check_args(args)
        flag = lambda name: argv[argv.index(name) + 1]   # noqa: E731
        cache = build_cache(args)
        try:
            tree = cache.config.tree
            assert tree.eviction == flag("--eviction")
            assert tree.adaptive_window == int(flag("--adaptive-window"))
            assert tree.adaptive_floor is (flag("--adaptive-floor") == "on")
            assert tree.adaptive_record == int(flag("--adaptive-record"))
            assert tree.adaptive_z == float(flag("--adaptive-z"))
            assert tree.adaptive_trial == int(flag("--adaptive-trial"))
        finally:
            cache.close()
        seen.add((tree.adaptive_floor, tree.adaptive_record, tree.adaptive_z, tree.adaptive_trial))
    assert {s[0] for s in seen} == {True, False} and {s[1] for s in seen} == {1, 2, 4}
    assert {s[2] for s in seen} == {0.0, 2.0} and {s[3] for s in seen} == {0, 8}


def test_one_configuration_runs_clean_and_is_counted():
    res = rs.run_one(rs.draw(random.Random(5), 40))
    assert not res["failed"], res["error"]
    assert res["ops"] == 40 and res["requests"] > 0
