"""Helpers shared by the subcommands: config names, checked flag values, outputs, JSON."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from hicache.errors import ConfigError
from hicache.units import check_int, check_number

N = TypeVar("N", int, float)

# configs/ of a source checkout (editable installs), found relative to the package.
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def resolve_config(name: str) -> Path:
    """A path as given, or a bare name such as ``deepseek-v4-flash`` from ``configs/``."""
    p = Path(name)
    if p.is_file():
        return p
    for candidate in (CONFIG_DIR / name, CONFIG_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(c.stem for c in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []
    raise ConfigError("config", name, "no such file" + (f"; known names: {known}" if known else ""))


def positive_number(flag: str, value: float | None) -> float | None:
    """A flag that must be a finite number > 0 (``inf`` and ``nan`` are refused); None passes."""
    check_number(flag, value, optional=True)
    return value


def at_least(flag: str, value: int | None, minimum: int) -> int | None:
    """An integer flag with a lower bound; None passes."""
    return check_int(flag, value, minimum=minimum, optional=True, reason=f"must be >= {minimum}")


def parse_retention(flag: str, text: str) -> int | None:
    """``--retention``: a token count, or ``none`` (keep a snapshot at every boundary)."""
    if text.strip().lower() in ("none", "null", "all"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(flag, text, "must be a token count or 'none'") from None
    return check_int(flag, value, minimum=0, reason="must be a token count >= 0 or 'none'")


def check_output(flag: str, path: str | None) -> None:
    """Refuse an output file that cannot be written, *before* a long run produces it.

    The file is opened for appending (created if missing, then removed again), which
    catches a missing directory, a directory in its place and a read-only location.
    """
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ConfigError(flag, path, "is a directory; give a file name")
    if not p.parent.is_dir():
        raise ConfigError(flag, path, f"directory {str(p.parent)!r} does not exist")
    existed = p.exists()
    try:
        with open(p, "ab"):
            pass
    except OSError as exc:
        raise ConfigError(flag, path, f"cannot be written: {exc.strerror}") from None
    if not existed:
        os.unlink(p)


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """Print one JSON object that any JSON parser accepts (no NaN, no Infinity)."""
    print(json.dumps(json_safe(obj), indent=2, allow_nan=False))


def parse_positive_list(text: str, flag: str, cast: Callable[[str], N], example: str, *,
                        zero_ok: bool = False) -> list[N]:
    """``a,b,c`` as finite numbers > 0 (``zero_ok``: >= 0; ``cast``: int or float); a bad
    list is one ConfigError naming ``flag``, e.g. ``--host-gib``, with an ``example`` of a
    good one."""
    try:
        values = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(flag, text, f"must be comma-separated numbers like {example}") from None
    least = "finite numbers >= 0" if zero_ok else "finite numbers > 0"
    if not values or any(not (v >= 0 if zero_ok else v > 0) or not math.isfinite(v) for v in values):
        raise ConfigError(flag, text, f"must list one or more {least}")
    return values


def parse_candidates(flag: str, text: str) -> tuple[str, ...]:
    """``--candidates``: the orders ``eviction: adaptive`` chooses among, comma-separated."""
    from hicache.config import ADAPTIVE_CANDIDATES

    names = tuple(x.strip() for x in str(text).split(","))
    if not names or any(n not in ADAPTIVE_CANDIDATES for n in names) or len(set(names)) != len(names):
        raise ConfigError(flag, text, f"must list distinct names from {','.join(ADAPTIVE_CANDIDATES)}")
    return names


# ``eviction: adaptive``'s flags, one wording for every command that takes them (replay,
# sweep through replay, stress). Each command passes its own defaults and the note on them.
_ADAPTIVE_FLAGS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("--candidates", {"metavar": "P,P,..."},
     "the orders it chooses among online, by the hits of a ghost cache each"),
    ("--adaptive-window", {"type": int, "metavar": "N"},
     "lookups over which the ghosts are compared, and before which none switches"),
    ("--adaptive-record", {"type": int, "metavar": "W"},
     "windows over which a candidate must not have hit less than LRU's ghost to be taken"),
    ("--adaptive-z", {"type": float, "metavar": "Z"},
     "a switch's lead must also exceed Z standard deviations of the per-lookup hit differences behind it"),
    ("--adaptive-trial", {"type": int, "metavar": "N"},
     "try a switch for N lookups in a copy of the followed ghost first, and take it only if the copy "
     "beat staying"),
    ("--adaptive-dead-outputs", {"type": int, "metavar": "N"},
     "once N prompts went on past a decode's start without entering its output (and none entered one), "
     "the LRU floor drops such idle tails first"),
    ("--adaptive-floor", {"choices": ["on", "off"]},
     "leave a followed candidate as soon as its ghost hits less than LRU's over the window"),
)


def add_adaptive_flags(p: argparse.ArgumentParser, defaults: dict[str, Any], notes: dict[str, str]) -> None:
    """Add ``--candidates`` and the ``--adaptive-*`` flags to parser ``p``. ``defaults``: a
    flag's default by its dest (absent: None, the config's); ``notes``: the text in the
    help's parentheses by dest (absent: "default: the config's" or "default D")."""
    for flag, kwargs, text in _ADAPTIVE_FLAGS:
        dest = flag[2:].replace("-", "_")
        default = defaults.get(dest)
        note = notes.get(dest) or ("default: the config's" if default is None else f"default {default}")
        p.add_argument(flag, default=default, help=f"eviction adaptive: {text} ({note})", **kwargs)
