"""Prometheus export of a cache's stats, into the engine's own registry (optional extra:
``pip install 'hicache[metrics]'``).

    exporter = PrometheusExporter(cache, registry=prometheus_client.REGISTRY,
                                  labels={"model_name": "deepseek-v4-flash", "rank": "0"})
    exporter.update()        # from the engine loop, e.g. once per step or per second

Every series carries the constant ``labels`` (so several ranks or models aggregate in one
Prometheus). Counters keep their ``stats()`` names under a prefix
(``hicache_loaded_pages_total``); reused tokens are one counter with a ``tier`` label;
L3 get/put latency and bandwidth are histograms by ``op``; L3 faults are counted by
``type``, rejected values by ``reason``, and the breaker's state is a gauge per ``state``.
Names and labels are listed in docs/metrics.md.

:meth:`PrometheusExporter.update` copies the current values; a scrape only reads that
copy, never the cache. The source is anything with ``stats() -> dict`` and, optionally,
``l3_stats()`` (a ``StoreStats.to_dict()``, or a list of them, e.g. one per KV cache group
of the vLLM tier) and ``ctl.stats()`` (the transfer controller's counters).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from hicache.errors import ConfigError

GAUGES = ("device_pages_used", "device_pages_total", "device_states_used", "device_states_total",
          "host_pages_used", "host_pages_total", "host_states_used", "host_states_total",
          "running_requests", "hit_rate")
HIT_TIERS = ("device", "host", "l3")
TRANSFER = ("bytes", "seconds", "ops", "failures")
BREAKER_STATES = ("closed", "half_open", "open")
# stats() entries exported another way (labelled) or not as counters
_NOT_COUNTERS = {"hit_tokens", "l3_errors", "l3_rejected", *(f"{t}_hit_tokens" for t in HIT_TIERS)}
_RESERVED_LABELS = {"tier", "op", "type", "reason", "state", "le", "quantile"}
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _check_labels(labels: Optional[Mapping[str, Any]]) -> dict[str, str]:
    out = {}
    for name, value in (labels or {}).items():
        if not isinstance(name, str) or not _LABEL_RE.match(name) or name.startswith("__"):
            raise ConfigError("metrics.labels", name, "a label name is [a-zA-Z_][a-zA-Z0-9_]*, not starting with __")
        if name in _RESERVED_LABELS:
            raise ConfigError("metrics.labels", name, f"is one of hicache's own labels {sorted(_RESERVED_LABELS)}")
        out[name] = str(value)
    return out


def merge_l3_stats(parts: list[dict]) -> dict:
    """Several stores' ``StoreStats.to_dict()`` as one: counts added, the worst breaker."""
    if len(parts) == 1:
        return parts[0]
    out: dict[str, Any] = {"counters": {}, "rejected": {}, "faults": {}, "io": {},
                           "breaker": {"state": "closed", "trips": 0, "refused": 0},
                           "backup_pending_objects": 0, "backup_pending_bytes": 0}
    for p in parts:
        for section in ("counters", "rejected", "faults"):
            for k, v in p.get(section, {}).items():
                out[section][k] = out[section].get(k, 0) + v
        b = p.get("breaker", {})
        if BREAKER_STATES.index(b.get("state", "closed")) > BREAKER_STATES.index(out["breaker"]["state"]):
            out["breaker"]["state"] = b["state"]
        out["breaker"]["trips"] += b.get("trips", 0)
        out["breaker"]["refused"] += b.get("refused", 0)
        for k in ("backup_pending_objects", "backup_pending_bytes"):
            out[k] += p.get(k, 0)
        for op, hists in p.get("io", {}).items():
            for hname, h in hists.items():
                acc = out["io"].setdefault(op, {}).setdefault(hname, {"buckets": [[le, 0] for le, _ in h["buckets"]],
                                                                      "sum": 0.0, "count": 0})
                for pair, (_, n) in zip(acc["buckets"], h["buckets"]):
                    pair[1] += n
                acc["sum"] += h["sum"]
                acc["count"] += h["count"]
    return out


class PrometheusExporter:
    """Mirror a cache's stats into a ``prometheus_client`` registry (see module doc)."""

    def __init__(self, cache: Any, *, registry: Any = None, prefix: str = "hicache",
                 labels: Optional[Mapping[str, Any]] = None):
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError("metrics", "prometheus", "needs prometheus-client: pip install 'hicache[metrics]'") from None
        if not isinstance(prefix, str) or not _LABEL_RE.match(prefix):
            raise ConfigError("metrics.prefix", prefix, "must be [a-zA-Z_][a-zA-Z0-9_]*")
        self.cache = cache
        self.prefix = prefix
        self.labels = _check_labels(labels)
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        self._snapshot: dict[str, Any] = {}
        self.update()
        try:
            self.registry.register(self)
        except ValueError as exc:   # the same names already in this registry
            raise ConfigError("metrics.registry", prefix, f"already holds these series ({exc}); "
                                                          "use one exporter per registry, or another prefix") from None

    # -- snapshot -----------------------------------------------------------------------
    def update(self) -> None:
        """Copy the cache's current counters, gauges and L3 histograms (scrapes read this copy)."""
        snap: dict[str, Any] = {"stats": dict(self.cache.stats())}
        l3 = self.cache.l3_stats() if hasattr(self.cache, "l3_stats") else None
        if isinstance(l3, list):
            l3 = merge_l3_stats(l3) if l3 else None
        snap["l3"] = l3 or None
        ctl = getattr(self.cache, "ctl", None)
        snap["transfer"] = ctl.stats() if ctl is not None and hasattr(ctl, "stats") else None
        self._snapshot = snap

    # -- prometheus_client collector protocol -------------------------------------------
    def describe(self) -> Iterator[Any]:
        return self.collect()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        p, names = self.prefix, list(self.labels)
        values = list(self.labels.values())
        snap = self._snapshot
        stats = snap["stats"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return CounterMetricFamily(f"{p}_{name}", doc, labels=names + list(extra))

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return GaugeMetricFamily(f"{p}_{name}", doc, labels=names + list(extra))

        if all(f"{t}_hit_tokens" in stats for t in HIT_TIERS):
            hits = counter("hit_tokens", "Prompt tokens reused, by the tier they came from", ("tier",))
            for t in HIT_TIERS:
                hits.add_metric(values + [t], stats[f"{t}_hit_tokens"])
            yield hits
        for name, v in stats.items():
            if name in _NOT_COUNTERS or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if name in GAUGES:
                # "_total" is the counter suffix in Prometheus: capacities are "_capacity"
                g = gauge(name.replace("_total", "_capacity"), f"HiCache {name.replace('_', ' ')}")
            else:
                g = counter(name, f"HiCache {name.replace('_', ' ')}")
            g.add_metric(values, v)
            yield g
        t = snap["transfer"]
        if t:
            for d in ("d2h", "h2d"):
                for k in TRANSFER:
                    c = counter(f"transfer_{d}_{k}", f"{d.upper()} copy {k}")
                    c.add_metric(values, t.get(d, {}).get(k, 0))
                    yield c
        l3 = snap["l3"]
        if l3:
            yield from self._collect_l3(l3, counter, gauge, HistogramMetricFamily, values)

    def _collect_l3(self, l3: dict, counter, gauge, Histogram, values: list[str]) -> Iterator[Any]:
        faults = counter("l3_faults", "L3 transport and server faults, by type", ("type",))
        for kind, n in sorted(l3.get("faults", {}).items()):
            if "." not in kind:       # "get.timeout" repeats "timeout" per operation
                faults.add_metric(values + [kind], n)
        yield faults
        rejected = counter("l3_rejected", "L3 values rejected by the object check, by reason", ("reason",))
        for reason, n in sorted(l3.get("rejected", {}).items()):
            rejected.add_metric(values + [reason], n)
        yield rejected
        breaker = l3.get("breaker", {})
        state = gauge("l3_breaker_state", "1 for the L3 circuit breaker's current state", ("state",))
        for s in BREAKER_STATES:
            state.add_metric(values + [s], 1.0 if breaker.get("state") == s else 0.0)
        yield state
        trips = counter("l3_breaker_trips", "Times the L3 circuit breaker opened")
        trips.add_metric(values, breaker.get("trips", 0))
        yield trips
        for key in ("backup_pending_objects", "backup_pending_bytes"):
            g = gauge(f"l3_{key}", f"L3 {key.replace('_', ' ')} in the backup queue")
            g.add_metric(values, l3.get(key, 0))
            yield g
        docs = {"latency_seconds": ("l3_latency_seconds", "Seconds an L3 get or put spent in backend calls"),
                "bandwidth_bytes_per_second": ("l3_bandwidth_bytes_per_second",
                                               "Payload bytes per second of an L3 get or put that moved data")}
        for hname, (mname, doc) in docs.items():
            fam = Histogram(f"{self.prefix}_{mname}", doc, labels=list(self.labels) + ["op"])
            for op, hists in sorted(l3.get("io", {}).items()):
                h = hists[hname]
                buckets = [("+Inf" if le == "+Inf" else repr(float(le)), n) for le, n in h["buckets"]]
                fam.add_metric(values + [op], buckets, sum_value=h["sum"])
            yield fam

    # -- output -------------------------------------------------------------------------
    def text(self) -> str:
        """The exposition text a scrape of the registry would see (logs, tests, files)."""
        import prometheus_client as prom

        return prom.generate_latest(self.registry).decode()

    def write(self, path: "str | Path") -> None:
        """Write :meth:`text` to ``path`` (a textfile-collector drop, or ``replay --metrics-out``)."""
        Path(path).write_text(self.text())

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose the registry over HTTP on ``addr:port`` (a daemon thread; :meth:`close` stops it)."""
        import prometheus_client as prom

        # (server, thread) from prometheus-client >= 0.20, None before: kept as an object
        self._server: object = prom.start_http_server(port, addr=addr, registry=self.registry)

    def close(self) -> None:
        """Stop the HTTP server :meth:`serve` started (prometheus-client >= 0.20 returns it)."""
        server = getattr(self, "_server", None)
        self._server = None  # closed: nothing to stop again
        if isinstance(server, tuple) and hasattr(server[0], "shutdown"):
            server[0].shutdown()
            server[0].server_close()
