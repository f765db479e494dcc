"""``hicache bench storage --url URL [--object-mib M] [--json]``: L3 put/get GB/s vs a limit.

What is measured (each round, interleaved, medians reported, so noise hits all alike):

* ours: ``L3Store.put`` / ``L3Store.get`` of ``--objects`` objects of ``--object-mib`` MiB
  each (the batch repeated until at least 256 objects were moved in the timing), the full path the cache uses (header, xxh3 checksum, verification, reading
  straight into a preallocated array standing in for host pool rows);
* the limit, same value size, same run:
  - Redis URLs: ``redis-benchmark -t set,get -d BYTES -n N`` (N = the objects ours moves), run with our connection count and
    pipeline depth (``-c C -P P``) and with its default 50 clients; the faster of the two
    is the limit (requests/s x bytes = GB/s). A password is never put on its command line
    (``ps`` shows it to every local user): it goes in ``REDISCLI_AUTH`` where the binary
    reads that, and redis-benchmark 7.0-7.4 do not, so a URL with a password there has no limit;
  - ``memory://``: a numpy memcpy of the same bytes;
  - ``file://``: plain ``write``/``readinto`` of same-size files in the same directory;
* Redis URLs also: plain redis-py pipelines (``GET`` then copying each value into the array),
  the baseline that our data path is measured against; and the latency of one 64-key
  ``EXISTS`` batch (the lookup a prefetch starts with), ours against a redis-py pipeline.

GB/s are 10^9 bytes of payload per second. ``verified`` is true when the last round read
back every object with identical bytes and nothing was rejected. The benchmark writes its
own keys (a random salt) and deletes them at the end, and removes the single key
``key:__rand_int__`` that redis-benchmark writes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, TypeVar

import numpy as np
import psutil

from hicache.cli.common import at_least, positive_number, print_json
from hicache.cli.table import render_table
from hicache.errors import ConfigError
from hicache.storage import L3Config, L3Store, ObjectKeys, open_backend
from hicache.storage import mask_url

GB = 1e9


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="storage URL: memory://, file:///dir, redis://host:port/db, "
                   "rediss://, unix:///path.sock, redis+cluster://h1:p1,h2:p2")
    p.add_argument("--object-mib", type=float, default=1.0, metavar="M", help="object size in MiB (default 1)")
    p.add_argument("--objects", type=int, default=128, metavar="N",
                   help="objects moved per measurement (default 128)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported (default 3)")
    p.add_argument("--mac", action="store_true",
                   help="also time authenticated objects (HMAC-SHA256 under a random key, storage_auth_key) "
                        "in the same rounds, beside the plain ones")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _progress(msg: str) -> None:
    print(f"[bench storage] {msg}", file=sys.stderr, flush=True)


T = TypeVar("T")


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    t = time.perf_counter()
    r = fn()
    return time.perf_counter() - t, r


def run(args: argparse.Namespace) -> int:
    positive_number("--object-mib", args.object_mib)
    at_least("--objects", args.objects, 1)
    at_least("--rounds", args.rounds, 1)
    obj = max(1, int(args.object_mib * (1 << 20)))
    n = args.objects
    # source, destination and the limit's scratch copy, plus a 2 GiB reserve
    need, avail = 3 * n * obj, psutil.virtual_memory().available - (2 << 30)
    if need > avail:
        raise ConfigError("--object-mib", args.object_mib,
                          f"{n} objects need about {need / (1 << 30):.1f} GiB of memory but "
                          f"{max(avail, 0) / (1 << 30):.1f} GiB is available; use smaller or fewer objects")
    backend = open_backend(args.url)
    scheme = args.url.partition("://")[0].lower()
    salt = os.urandom(8).hex()
    store = L3Store(backend, "bench0storage000", salt, L3Config(read_batch=max(16, n // 4)))
    rng = np.random.default_rng(0)
    _progress(f"{n} objects x {obj:,} B on {mask_url(args.url)}")
    src = rng.integers(0, 256, size=(n, obj), dtype=np.uint8)
    dst = np.zeros_like(src)
    hashes = [hashlib.sha256(f"{salt}:{i}".encode()).digest() for i in range(n)]
    # Each timing moves at least 256 objects' worth (the batch, repeated), as many requests
    # as the redis-benchmark limit makes, so both sides are timed over the same volume.
    reps = max(1, -(-256 // n))
    limit = _limit_runner(scheme, args.url, backend, obj, n * reps, src, dst)
    is_redis = scheme.startswith("redis") or scheme == "unix"
    redis_py = _RedisPyBaseline.make(store, hashes, dst) if is_redis else None
    rows: dict[str, list[float]] = {k: [] for k in ("put", "get", "mac_put", "mac_get", "limit_put", "limit_get",
                                                    "redis_py_get", "lookup_us", "redis_py_lookup_us")}
    # Authenticated objects under a key made here (never shown), keys of their own.
    mstore = L3Store(backend, "bench0storage000", salt + "m", store.cfg,
                     keys=ObjectKeys([secrets.token_hex(32).encode()], "bench")) if args.mac else None
    mhashes = [hashlib.sha256(f"{salt}:mac:{i}".encode()).digest() for i in range(n)]
    verified = True
    try:
        # Warm up with one full untimed round: the first writes of a key make the server (or
        # page cache) allocate and fault in memory, a cost redis-benchmark -- which overwrites
        # one key -- never pays inside its own timing either.
        for s, hs in ((store, hashes), (mstore, mhashes)):
            if s is not None:
                _check_stored(s.put(hs, "page", list(src)), s, args.url)
                s.get(hs, "page", list(dst))
        if limit is not None:
            limit.measure()
        for r in range(args.rounds):
            _progress(f"round {r + 1}/{args.rounds}: ours")
            ok = _time_store(store, hashes, src, dst, reps, rows, "", args.url)
            if mstore is not None:
                _progress(f"round {r + 1}/{args.rounds}: ours with MAC")
                ok = _time_store(mstore, mhashes, src, dst, reps, rows, "mac_", args.url) and ok
            verified = ok if r == args.rounds - 1 else verified
            if limit is not None:
                _progress(f"round {r + 1}/{args.rounds}: limit ({limit.name})")
                p, g = limit.measure()
                rows["limit_put"].append(p)
                rows["limit_get"].append(g)
            if redis_py is not None:
                _progress(f"round {r + 1}/{args.rounds}: redis-py")
                rows["redis_py_get"].append(redis_py.get_gbps())
                ours_us, theirs_us = redis_py.lookup_us()
                rows["lookup_us"].append(ours_us)
                rows["redis_py_lookup_us"].append(theirs_us)
        for s in (store, mstore):
            st = s.stats(backend=False) if s is not None else None
            verified = verified and (st is None or (not st.rejected and not st.faults))
    finally:
        if mstore is not None:
            mstore.delete(mhashes, "page")
        store.delete(hashes, "page")
        if limit is not None:
            limit.cleanup()
        store.close()
    med = {k: (statistics.median(v) if v else None) for k, v in rows.items()}
    out = {
        "url": mask_url(args.url), "object_bytes": obj, "objects": n, "rounds": args.rounds,
        "put_gbps": med["put"], "get_gbps": med["get"],
        "mac_put_gbps": med["mac_put"], "mac_get_gbps": med["mac_get"],
        "mac_put_ratio": _ratio(med["mac_put"], med["put"]), "mac_get_ratio": _ratio(med["mac_get"], med["get"]),
        "limit_put_gbps": med["limit_put"], "limit_get_gbps": med["limit_get"],
        "redis_py_get_gbps": med["redis_py_get"],
        "lookup_us": med["lookup_us"], "redis_py_lookup_us": med["redis_py_lookup_us"],
        "put_ratio": _ratio(med["put"], med["limit_put"]),
        "get_ratio": _ratio(med["get"], med["limit_get"]),
        "verified": verified,
        "limit_source": limit.name if limit else None,
        "samples": rows,
    }
    if args.json:
        print_json(out)
        return 0 if verified else 1

    def fmt(v: Optional[float]) -> Optional[float]:
        return None if v is None else round(v, 3)

    table = [["ours (L3Store)", fmt(out["put_gbps"]), fmt(out["get_gbps"])]]
    if mstore is not None:
        table += [["ours + MAC (HMAC-SHA256)", fmt(out["mac_put_gbps"]), fmt(out["mac_get_gbps"])],
                  ["ratio MAC / plain", fmt(out["mac_put_ratio"]), fmt(out["mac_get_ratio"])]]
    table.append([f"limit: {out['limit_source']}", fmt(out["limit_put_gbps"]), fmt(out["limit_get_gbps"])])
    if redis_py is not None:
        table.append(["redis-py pipelines", None, fmt(out["redis_py_get_gbps"])])
    table.append(["ratio ours / limit", fmt(out["put_ratio"]), fmt(out["get_ratio"])])
    print(render_table(["path", "put GB/s", "get GB/s"], table, align="lrr",
                       title=f"{out['url']}: {n} x {obj:,} B objects, median of {args.rounds} rounds"))
    if redis_py is not None:
        print(f"\n64-key EXISTS batch: ours {out['lookup_us']:.0f} us, "
              f"redis-py pipeline {out['redis_py_lookup_us']:.0f} us (median)")
    print(f"\nverified: {'yes' if verified else 'NO'} (bytes read back identical, nothing rejected)")
    return 0 if verified else 1


def _time_store(store: L3Store, hashes: list, src: np.ndarray, dst: np.ndarray, reps: int,
                rows: dict[str, list[float]], prefix: str, url: str) -> bool:
    """One timed put and get of the whole batch (``reps`` times); True when every object
    read back identical."""
    n, obj = src.shape
    t, stored = _timed(lambda: [store.put(hashes, "page", list(src)) for _ in range(reps)][-1])
    _check_stored(stored, store, url)
    rows[prefix + "put"].append(reps * n * obj / t / GB)
    dst[:] = 0
    t, res = _timed(lambda: [store.get(hashes, "page", list(dst)) for _ in range(reps)][-1])
    rows[prefix + "get"].append(reps * n * obj / t / GB)
    return res.hits == n and bool(np.array_equal(dst, src))


def _ratio(ours: float | None, limit: float | None) -> float | None:
    """``ours / limit``, None when either was not measured (or the limit is 0)."""
    return ours / limit if ours is not None and limit else None


def _check_stored(stored: list[bool], store: L3Store, url: str) -> None:
    if all(stored):
        return
    faults = store.stats(backend=False).faults
    why = (f"cannot reach the store ({', '.join(sorted(faults))})" if faults and not any(stored)
           else f"the store refused {stored.count(False)} of {len(stored)} objects (full? maxmemory?)")
    raise ConfigError("--url", mask_url(url), why)


# -- limits -----------------------------------------------------------------------------
class _Limit:
    name = ""

    def measure(self) -> tuple[float, float]:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


def _copy_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """One ``np.copyto`` per object, as a store copies them."""
    for i in range(len(src)):
        np.copyto(dst[i], src[i])


class _Memcpy(_Limit):
    name = "numpy memcpy"

    def __init__(self, src: np.ndarray, dst: np.ndarray):
        self.src, self.dst = src, dst
        self.tmp = np.empty_like(src)

    def measure(self) -> tuple[float, float]:
        nbytes = self.src.nbytes
        t, _ = _timed(lambda: _copy_rows(self.tmp, self.src))
        t2, _ = _timed(lambda: _copy_rows(self.dst, self.tmp))
        return nbytes / t / GB, nbytes / t2 / GB


class _PlainFiles(_Limit):
    name = "plain file write/read"

    def __init__(self, root: str, src: np.ndarray, dst: np.ndarray):
        self.dir = tempfile.mkdtemp(prefix=".bench-plain-", dir=root)
        self.src, self.dst = src, dst

    def measure(self) -> tuple[float, float]:
        paths = [os.path.join(self.dir, str(i)) for i in range(len(self.src))]

        def write() -> None:
            for p, row in zip(paths, self.src):
                with open(p, "wb", buffering=0) as f:
                    f.write(memoryview(row))

        def read() -> None:
            for p, row in zip(paths, self.dst):
                with open(p, "rb", buffering=0) as f:
                    f.readinto(memoryview(row))

        t, _ = _timed(write)
        t2, _ = _timed(read)
        return self.src.nbytes / t / GB, self.src.nbytes / t2 / GB

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class _RedisBenchmark(_Limit):
    def __init__(self, base: list[str], obj: int, n: int, conns: int, pipeline: int, cleanup_node,
                 target: str, secret: Optional[str], env: Optional[dict[str, str]] = None):
        self.target = target
        self.secret = secret
        self.env = env      # REDISCLI_AUTH: the password, kept off the command line
        self.base, self.obj, self.n = base, obj, n
        self.configs = [["-c", str(conns), "-P", str(pipeline)], ["-c", "50", "-P", "1"]]
        self.name = f"redis-benchmark (best of -c {conns} -P {pipeline} and -c 50)"
        self._cleanup_node = cleanup_node

    def _run(self, extra: list[str]) -> tuple[float, float]:
        cmd = self.base + ["-t", "set,get", "-d", str(self.obj), "-n", str(self.n), "--csv", "-q"] + extra
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=self.env)
        except subprocess.TimeoutExpired:
            raise ConfigError("--url", self.target, "redis-benchmark did not finish in 300 s") from None
        rps = {}
        for line in out.stdout.splitlines():
            parts = [p.strip('"') for p in line.split(",")]
            if len(parts) >= 2 and parts[0] in ("SET", "GET"):
                rps[parts[0]] = float(parts[1])
        if set(rps) != {"SET", "GET"}:
            said = out.stderr.strip() or out.stdout.strip()
            if self.secret:  # it may echo the password back: never show it
                said = said.replace(self.secret, "***")
            raise ConfigError("--url", self.target, "redis-benchmark failed: " + said[:200])
        return rps["SET"] * self.obj / GB, rps["GET"] * self.obj / GB

    def measure(self) -> tuple[float, float]:
        results = [self._run(c) for c in self.configs]
        return max(r[0] for r in results), max(r[1] for r in results)

    def cleanup(self) -> None:
        try:
            self._cleanup_node()
        except Exception:
            pass


def _reads_auth_env(exe: str) -> bool:
    """Whether the ``redis-benchmark`` at ``exe`` reads its password from ``REDISCLI_AUTH``
    (the name is in the binary, as in redis-cli's); a read error counts as no."""
    try:
        with open(exe, "rb") as fh:
            return b"REDISCLI_AUTH" in fh.read(64 * 1024 * 1024)
    except OSError:
        return False


def _limit_runner(scheme: str, url: str, backend, obj: int, n: int, src, dst) -> Optional[_Limit]:
    if scheme == "memory":
        return _Memcpy(src, dst)
    if scheme == "file":
        return _PlainFiles(str(backend.root), src, dst)
    exe = shutil.which("redis-benchmark")
    if exe is None:
        _progress("redis-benchmark not found: no limit measured (apt-get install redis-tools)")
        return None
    if scheme.endswith("+cluster"):
        ep, opts = backend.seeds[0], backend.opts
        base = [exe, "--cluster", "-h", ep.host, "-p", str(ep.port)]

        def clean() -> None:
            backend.delete(["key:__rand_int__"])
    else:
        node = backend.node
        ep, opts = node.endpoint, node.opts
        base = [exe, "-s", ep.path] if ep.path else [exe, "-h", ep.host, "-p", str(ep.port)]
        if opts.db:
            base += ["--dbnum", str(opts.db)]

        def clean() -> None:
            node.del_raw(["key:__rand_int__"])
    env = None
    if opts.password is not None:
        # Never "-a PASSWORD": a command line is readable by every local user (ps). Only a
        # redis-benchmark that reads REDISCLI_AUTH gets the password (7.0-7.4 do not).
        if not _reads_auth_env(exe):
            _progress("redis-benchmark takes a password only on its command line (-a, visible in ps): "
                      "no limit measured for a URL with a password")
            return None
        env = {**os.environ, "REDISCLI_AUTH": opts.password}
        if opts.username:
            base += ["--user", opts.username]
    if opts.tls:
        base += ["--tls"]
        if opts.ssl_ca_certs:
            base += ["--cacert", opts.ssl_ca_certs]
        if opts.ssl_certfile:
            base += ["--cert", opts.ssl_certfile, "--key", opts.ssl_keyfile or opts.ssl_certfile]
        if opts.ssl_cert_reqs == "none":
            base += ["--insecure"]
    return _RedisBenchmark(base, obj, n, opts.connections, opts.pipeline, clean, mask_url(url), opts.password, env)


class _RedisPyBaseline:
    """Plain redis-py doing what our data path does: pipelined ``GET`` of our objects
    copied into ``dst`` (GB/s), and a 64-key ``EXISTS`` batch (microseconds), the latter
    next to the same batch through our backend."""

    LOOKUP_KEYS = 64
    LOOKUP_CALLS = 50

    def __init__(self, client, backend, keys: list[str], dst: np.ndarray):
        self.client, self.backend, self.keys, self.dst = client, backend, keys, dst
        self.lookup = [keys[i % len(keys)] if i % 2 == 0 else f"{keys[0]}:absent:{i}"
                       for i in range(self.LOOKUP_KEYS)]

    @classmethod
    def make(cls, store: L3Store, hashes: list, dst: np.ndarray) -> Optional["_RedisPyBaseline"]:
        try:
            import redis  # redis-py: installed with the ``redis`` extra
        except ImportError:
            _progress("redis-py not installed: no redis-py baseline")
            return None
        # A Redis backend (the caller checked the scheme): storage does not export its classes,
        # which need redis-py, so their connection details are read by name.
        backend: Any = store.backend
        keys = [store.key(h, "page") for h in hashes]
        client: redis.Redis | redis.cluster.RedisCluster
        if backend.kind == "redis-cluster":
            ep, o = backend.seeds[0], backend.opts
            client = redis.cluster.RedisCluster(host=ep.host, port=ep.port, username=o.username,
                                                password=o.password, ssl=o.tls)
        else:
            ep, o = backend.node.endpoint, backend.node.opts
            common = dict(db=o.db, username=o.username, password=o.password)
            client = (redis.Redis(unix_socket_path=ep.path, **common) if ep.path else
                      redis.Redis(host=ep.host, port=ep.port, ssl=o.tls, ssl_ca_certs=o.ssl_ca_certs,
                                  ssl_cert_reqs=o.ssl_cert_reqs, ssl_check_hostname=o.ssl_check_hostname,
                                  **common))
        return cls(client, backend, keys, dst)

    def get_gbps(self) -> float:
        hdr, batch, dst, keys = 64, 16, self.dst, self.keys
        t = time.perf_counter()
        for s in range(0, len(keys), batch):
            pipe = self.client.pipeline(transaction=False)
            for k in keys[s:s + batch]:
                pipe.get(k)
            for i, v in enumerate(pipe.execute()):
                dst[s + i] = np.frombuffer(v, dtype=np.uint8, offset=hdr)
        return dst.nbytes / (time.perf_counter() - t) / GB

    def lookup_us(self) -> tuple[float, float]:
        """Median microseconds of one 64-key EXISTS batch: (ours, redis-py's)."""
        def theirs() -> list:
            pipe = self.client.pipeline(transaction=False)
            for k in self.lookup:
                pipe.exists(k)
            return pipe.execute()

        def ours() -> list:
            return self.backend.exists(self.lookup)

        assert [bool(x) for x in theirs()] == ours(), "both paths must see the same keys"
        out = []
        for fn in (ours, theirs):
            times = []
            for _ in range(self.LOOKUP_CALLS):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            out.append(statistics.median(times) * 1e6)
        return out[0], out[1]
