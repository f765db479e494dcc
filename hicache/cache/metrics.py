"""Prometheus export of ``HiCache.stats()`` (optional extra: ``pip install 'hicache[metrics]'``).

Counters keep their ``stats()`` names under a prefix (``hicache_hit_tokens_total``), gauges
report tier occupancy (``hicache_device_pages_used``). Names are listed in docs/metrics.md.
Call :meth:`PrometheusExporter.update` from the engine's loop (e.g. once per step or per
second); it copies the current values, so scrapes never touch the cache itself.
"""

from __future__ import annotations

from typing import Any

from hicache.errors import ConfigError

GAUGES = ("device_pages_used", "device_pages_total", "device_states_used", "device_states_total",
          "host_pages_used", "host_pages_total", "host_states_used", "host_states_total",
          "running_requests", "hit_rate")
TRANSFER = ("bytes", "seconds", "ops", "failures")


class PrometheusExporter:
    """Mirror a cache's counters into a ``prometheus_client`` registry."""

    def __init__(self, cache: Any, *, registry: Any = None, prefix: str = "hicache"):
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError("metrics", "prometheus", "needs prometheus-client: pip install 'hicache[metrics]'") from None
        self.cache = cache
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        stats = cache.stats()
        self._counters = {}
        self._gauges = {}
        for name in stats:
            if name in GAUGES:
                # "_total" is the counter suffix in Prometheus: capacities are "_capacity"
                gname = name.replace("_total", "_capacity")
                self._gauges[name] = prom.Gauge(f"{prefix}_{gname}", f"HiCache {gname.replace('_', ' ')}",
                                                registry=self.registry)
            elif name not in ("l3_errors", "l3_rejected"):
                self._counters[name] = prom.Counter(f"{prefix}_{name}", f"HiCache {name.replace('_', ' ')}",
                                                    registry=self.registry)
        for name in ("l3_errors", "l3_rejected"):
            self._counters[name] = prom.Counter(f"{prefix}_{name}", f"L3 {name[3:]} (all kinds)",
                                                registry=self.registry)
        self._transfer = {(d, k): prom.Counter(f"{prefix}_transfer_{d}_{k}", f"{d.upper()} copy {k}",
                                               registry=self.registry)
                          for d in ("d2h", "h2d") for k in TRANSFER}
        self._last: dict = {}

    def _advance(self, key, counter, value: float) -> None:
        delta = value - self._last.get(key, 0)
        if delta > 0:
            counter.inc(delta)
        self._last[key] = value

    def update(self) -> None:
        """Copy the cache's current counters and gauges into the registry."""
        stats = self.cache.stats()
        for name, gauge in self._gauges.items():
            gauge.set(stats[name])
        for name, counter in self._counters.items():
            self._advance(name, counter, stats.get(name, 0))
        tstats = self.cache.ctl.stats()
        for (d, k), counter in self._transfer.items():
            self._advance((d, k), counter, tstats[d].get(k, 0))

    def text(self) -> str:
        """The exposition text a scrape would see (handy for logs and tests)."""
        import prometheus_client as prom

        return prom.generate_latest(self.registry).decode()

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Expose the registry over HTTP on ``addr:port`` (a daemon thread)."""
        import prometheus_client as prom

        prom.start_http_server(port, addr=addr, registry=self.registry)
