"""Helpers shared by the subcommands."""

from __future__ import annotations

from pathlib import Path

from hicache.errors import ConfigError

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
