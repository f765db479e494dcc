"""Upper bounds of the command line's counts, checked before anything is built.

Why: a count with no upper bound is a request for all the memory there is.
``replay --conversations 1000000000`` built its workload until the machine ran out, and
``stress --seeds 0-99999999999999999999999`` overflowed ``len(range)``; the README promises
one line and exit status 2 for bad input instead.

A built workload lives in memory whole (every request's token blocks), so its bound is a
memory budget, :data:`WORKLOAD_BUDGET_BYTES`, over what one unit of the family costs
(:data:`UNIT_BYTES`, measured with ``tracemalloc`` on 40 units, rounded up): the cheap
``multi-turn`` family allows 200,000 conversations, ``long-revisit`` about 2,100.
"""

from __future__ import annotations

from hicache.errors import ConfigError

WORKLOAD_BUDGET_BYTES = 8 * 1024**3
MAX_UNITS = 200_000         # no family beyond this, however small its units
MAX_SEEDS = 100_000         # stress --seeds A-B: one fresh cache per seed
MAX_SEED = 2**63 - 1        # numpy's generators take seeds up to here
KB = 1000

# bytes one unit of each family holds once built (peak while building); see module doc
UNIT_BYTES = {
    "chat": 40 * KB, "synthetic": 40 * KB, "multi-turn": 40 * KB, "long-context": 3_000 * KB,
    "long-revisit": 4_100 * KB, "agentic": 260 * KB, "sharegpt": 4_000 * KB, "sharegpt-nosys": 4_000 * KB,
    "reasoning": 220 * KB, "rag": 600 * KB, "mix": 350 * KB, "mix-poisson": 350 * KB, "production": 80 * KB,
    "tiny": 40 * KB,
}


def max_units(workload: str) -> int:
    """The most units (``--conversations``) of ``workload`` a replay builds."""
    per_unit = UNIT_BYTES.get(workload, max(UNIT_BYTES.values()))
    return min(MAX_UNITS, WORKLOAD_BUDGET_BYTES // per_unit)


def check_units(flag: str, n: int, workload: str) -> int:
    """``n`` units of ``workload``, refused in one line above :func:`max_units`."""
    top = max_units(workload)
    if n > top:
        raise ConfigError(flag, n, f"at most {top:,} for {workload} (about "
                                   f"{WORKLOAD_BUDGET_BYTES // 1024**3} GiB of requests built in memory)")
    return n


def check_seed_range(flag: str, text: str, lo: int, hi: int) -> range:
    """Seeds ``lo..hi``: each at most :data:`MAX_SEED`, at most :data:`MAX_SEEDS` of them."""
    if hi > MAX_SEED:
        raise ConfigError(flag, text, f"seeds must be <= {MAX_SEED}")
    if hi - lo + 1 > MAX_SEEDS:
        raise ConfigError(flag, text, f"runs {hi - lo + 1:,} seeds; at most {MAX_SEEDS:,} in one command")
    return range(lo, hi + 1)
