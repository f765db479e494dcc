"""The Redis backend alone (no L3Store: no header, checksum or breaker): one JSON line with
the median latency of a 64-key ``EXISTS`` batch and the GB/s of a 128 x 1 MiB ``put`` and
``get_into``, against ``--url``.

It imports whichever hicache ``PYTHONPATH`` names first (printed as ``hicache``), so two
checkouts can be compared on one server, alternating, in the same minutes::

    for i in 1 2 3; do for d in /tmp/before /work/wt-x; do
        PYTHONPATH=$d python bench/redis_path.py --url redis://127.0.0.1:7493/0; done; done
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import hicache
from hicache.storage import open_backend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--lookups", type=int, default=200, help="EXISTS batches timed (default 200)")
    p.add_argument("--rounds", type=int, default=8, help="put/get rounds timed (default 8)")
    args = p.parse_args()
    b = open_backend(args.url)
    keys = [f"hc:bench-path:{i}" for i in range(128)]
    src = np.random.default_rng(0).integers(0, 256, size=(128, 1 << 20), dtype=np.uint8)
    dst = np.zeros_like(src)
    try:
        assert all(b.put(keys, list(src))), "the server refused the warm-up writes"
        b.get_into(keys, list(dst))
        look = [keys[i // 2] if i % 2 == 0 else f"hc:bench-path:absent:{i}" for i in range(64)]
        ex, put, get = [], [], []
        for _ in range(args.lookups):
            t = time.perf_counter()
            b.exists(look)
            ex.append(time.perf_counter() - t)
        for _ in range(args.rounds):
            t = time.perf_counter()
            b.put(keys, list(src))
            put.append(src.nbytes / (time.perf_counter() - t) / 1e9)
            dst[:] = 0
            t = time.perf_counter()
            b.get_into(keys, list(dst))
            get.append(src.nbytes / (time.perf_counter() - t) / 1e9)
        verified = bool(np.array_equal(dst, src))
    finally:
        b.delete(keys)
        b.close()
    print(json.dumps({"hicache": hicache.__file__, "exists_us": round(statistics.median(ex) * 1e6, 1),
                      "put_gbps": round(statistics.median(put), 3), "get_gbps": round(statistics.median(get), 3),
                      "verified": verified}))


if __name__ == "__main__":
    main()
