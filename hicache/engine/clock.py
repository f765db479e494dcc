"""The reference engine's virtual clock: what a step, a copy and an L3 fetch would cost on
the modelled server, so queueing, prefetch and time to first token behave as they would
there, while the copies and L3 I/O themselves still run for real (and are checked).

The model (defaults are a DeepSeek-V4-Flash-class server; set them per config in an
``engine:`` section or per flag on ``hicache replay``)::

    step    = prefill_tokens / prefill_tokens_per_s       chunked prefill of the batch
            + decode_iterations * decode_step_s           one iteration per output token
            + h2d_bytes / h2d_gbps                        loads (host -> device) of the step
            + d2h_bytes / d2h_gbps   (write_back only)    evictions copy before reuse
    fetch   = 2 * l3_rtt_s + bytes / l3_gbps              lookup round trip, then the read

Write-through backups (device -> host) and L3 puts run beside the compute and cost the
clock nothing. A fetch for a layout with state reads the snapshot first and is usable
only whole (history without its state cannot be resumed); otherwise leading pages are
usable as they land.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping

from hicache.errors import ConfigError
from hicache.units import check_number

GB = 1e9


@dataclass(frozen=True)
class ClockConfig:
    """Costs of the modelled server (see the module doc).

    ``prefill_tokens_per_s``: prompt tokens the batch computes per second;
    ``decode_step_s``: one decode iteration of the running batch (one token per request);
    ``h2d_gbps`` / ``d2h_gbps``: host <-> device copy bandwidth (GB/s, 10^9 bytes);
    ``l3_gbps``: L3 read bandwidth into host memory; ``l3_rtt_s``: one L3 round trip.
    """

    prefill_tokens_per_s: float = 20_000.0
    decode_step_s: float = 0.025
    h2d_gbps: float = 25.0
    d2h_gbps: float = 25.0
    l3_gbps: float = 2.5
    l3_rtt_s: float = 0.0005

    def __post_init__(self) -> None:
        for f in fields(self):
            rtt = f.name == "l3_rtt_s"  # a round trip may be free; a rate may not
            check_number(f.name, getattr(self, f.name), positive=not rtt, minimum=0 if rtt else None)

    # -- costs --------------------------------------------------------------------------
    def step_s(self, prefill_tokens: int, decode_iterations: int, h2d_bytes: int = 0,
               blocking_d2h_bytes: int = 0) -> float:
        """Seconds one engine step takes."""
        return (prefill_tokens / self.prefill_tokens_per_s + decode_iterations * self.decode_step_s
                + h2d_bytes / (self.h2d_gbps * GB) + blocking_d2h_bytes / (self.d2h_gbps * GB))

    def fetch_s(self, nbytes: int) -> float:
        """Seconds from issuing an L3 prefetch until ``nbytes`` have landed in host memory."""
        return 2 * self.l3_rtt_s + nbytes / (self.l3_gbps * GB)

    def landed_pages(self, elapsed_s: float, pages: int, page_bytes: int, state_bytes: int) -> int:
        """Of a fetch of ``pages`` pages (plus a ``state_bytes`` snapshot, read first, when
        > 0), how many are usable ``elapsed_s`` after it was issued."""
        if pages <= 0 or elapsed_s <= 0:
            return 0
        elapsed_s += 1e-9  # admitted exactly when the clock said it lands: it has landed
        if state_bytes:
            return pages if elapsed_s >= self.fetch_s(state_bytes + pages * page_bytes) else 0
        arrived = (elapsed_s - 2 * self.l3_rtt_s) * self.l3_gbps * GB
        return max(0, min(pages, int(arrived // page_bytes)))


CLOCK_KEYS = tuple(f.name for f in fields(ClockConfig))


def clock_from_mapping(section: Mapping | None, *, source: str | None = None, **overrides: Any) -> ClockConfig:
    """The ``engine:`` section of a config file plus flag overrides (None = not given)."""
    values = dict(section or {})
    if not isinstance(section or {}, Mapping):
        raise ConfigError("engine", section, "must be a mapping", source=source)
    for key in values:
        if key not in CLOCK_KEYS:
            raise ConfigError(f"engine.{key}", values[key], f"unknown field; expected one of {list(CLOCK_KEYS)}",
                              source=source)
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return ClockConfig(**values)
    except ConfigError as exc:
        raise ConfigError(f"engine.{exc.field}", exc.value, exc.reason, source=source) from None
