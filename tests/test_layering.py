"""The import rule of docs/architecture.md, as a test: every module's imports are parsed
(function-local ones too) and each edge between parts of hicache is checked.

Two rules:

* **Layers.** A part may import only the parts listed for it in ``ALLOWED`` (plus
  ``errors``, ``units`` and ``inputs``, which every part may use).
* **Interfaces.** Across parts, a module imports a package, never a module inside it
  (``from hicache.storage import mask_url``, not ``from hicache.storage.url import ...``),
  and only names that package exports in ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "hicache"
BASE = {"hicache.errors", "hicache.units", "hicache.inputs"}
BELOW_CACHE = {"hicache.layout", "hicache.pools", "hicache.tree", "hicache.transfer", "hicache.storage",
               "hicache.config"}
ENGINE_PARTS = {"hicache.engine", "hicache.engine.workloads", "hicache.engine.tiny_model"}

# part -> the parts it may import (besides itself and BASE)
ALLOWED: dict[str, set[str]] = {
    "hicache.errors": set(),
    "hicache.units": {"hicache.errors"},
    "hicache.inputs": {"hicache.errors"},
    "hicache.layout": set(),
    "hicache.pools": {"hicache.layout"},
    "hicache.tree": {"hicache.layout"},
    "hicache.transfer": {"hicache.pools", "hicache.layout"},
    "hicache.storage": {"hicache.layout"},
    "hicache.config": {"hicache.layout", "hicache.pools", "hicache.tree", "hicache.transfer", "hicache.storage"},
    "hicache.cache": BELOW_CACHE,
    "hicache.engine.workloads": set(),
    "hicache.engine.tiny_model": {"hicache.layout", "hicache.pools"},
    "hicache.engine": BELOW_CACHE | {"hicache.cache", "hicache.engine.workloads", "hicache.engine.tiny_model"},
    "hicache.engine.tiny_serving": BELOW_CACHE | {"hicache.cache"} | ENGINE_PARTS,
    "hicache.integrations": BELOW_CACHE | {"hicache.cache"},
    "hicache.integrations.sglang": BELOW_CACHE | {"hicache.cache", "hicache.integrations"},
    "hicache.integrations.vllm": BELOW_CACHE | {"hicache.cache", "hicache.integrations"},
    "hicache.cli": BELOW_CACHE | {"hicache.cache", "hicache.integrations"} | ENGINE_PARTS
    | {"hicache.engine.tiny_serving"},
    "hicache": BELOW_CACHE | {"hicache.cache"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


PACKAGES = {_module_name(p.parent / "__init__.py") for p in ROOT.rglob("__init__.py")}


def part_of(module: str) -> str:
    """The package a module belongs to (the longest package prefix), or the module itself
    for the top-level modules ``errors``, ``units`` and ``config``."""
    if module in PACKAGES:
        return module if module != "hicache" else "hicache"
    parts = module.split(".")
    for k in range(len(parts) - 1, 0, -1):
        prefix = ".".join(parts[:k])
        if prefix in PACKAGES:
            return module if prefix == "hicache" else prefix
    return module


def imports() -> list[tuple[str, str, int, list[str]]]:
    """(importing module, imported module, line, names) for every import of hicache."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "hicache":
                names = [a.name for a in node.names]
                subs = [n for n in names if f"{node.module}.{n}" in PACKAGES]  # from X import subpackage
                out += [(mod, f"{node.module}.{n}", node.lineno, []) for n in subs]
                out.append((mod, node.module, node.lineno, [n for n in names if n not in subs]))
            elif isinstance(node, ast.Import):
                out += [(mod, a.name, node.lineno, []) for a in node.names if a.name.split(".")[0] == "hicache"]
    return out


EDGES = imports()


def test_every_part_has_a_rule():
    parts = {part_of(m) for m, *_ in EDGES} | {part_of(t) for _, t, *_ in EDGES}
    assert parts <= set(ALLOWED), f"parts without a rule: {sorted(parts - set(ALLOWED))}"


def test_layers_import_only_what_the_rule_allows():
    bad = []
    for mod, target, line, _ in EDGES:
        src, dst = part_of(mod), part_of(target)
        if src == dst or dst in BASE or (src == "hicache" and target == "hicache"):
            continue
        if dst not in ALLOWED[src]:
            bad.append(f"{mod}:{line} imports {target} ({src} -> {dst} is not allowed)")
    assert not bad, "\n".join(bad)


def test_other_parts_are_reached_through_their_interface():
    bad = []
    for mod, target, line, names in EDGES:
        src, dst = part_of(mod), part_of(target)
        if src == dst or dst in BASE or dst == "hicache.config":
            continue
        if target != dst:
            bad.append(f"{mod}:{line} imports {target}: import {dst} instead")
            continue
        exported = set(getattr(importlib.import_module(target), "__all__", ()))
        missing = [n for n in names if n not in exported]
        if missing:
            bad.append(f"{mod}:{line} imports {missing} from {target}, which does not export them")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("edge", ["hicache.engine.workloads.__main__ -> hicache.cli"])
def test_the_rule_catches_a_forbidden_edge(edge):
    src, dst = edge.split(" -> ")
    assert dst not in ALLOWED[part_of(src)]
