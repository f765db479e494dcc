"""What is cached, per family, and how big it is.

A *family* is one kind of cached content over a set of layers. Two kinds exist:

* ``history``: rows that must cover the whole prefix ``[0, b)`` for a hit at boundary ``b``
  (compressed KV, indexer keys, the full KV of an MHA/MLA model). One row holds
  ``tokens_per_row`` tokens (the compress ratio; 1 = uncompressed).
* ``state``: rows needed only as a trailing window at the resume point (sliding-window KV,
  compressor state). A *snapshot* for boundary ``b`` keeps ``rows_kept`` rows per layer.

Every family takes its row index from an *anchor*: ``page`` (one id per ``page_tokens``
tokens of history) or ``state`` (one id per snapshot). A page id holds, per layer,
``page_tokens // tokens_per_row`` rows of a history family; a snapshot id holds
``rows_kept`` rows of a state family::

    page id p, family c4_kv (tokens_per_row 4, page_tokens 256):
        layer l  |row 0|row 1| ... |row 63|   <- tokens [256p', 256p'+256) of some prefix
    snapshot id s, family swa_kv (rows_kept 127):
        layer l  |tok b-127| ... |tok b-1|    <- the window before boundary b
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, Literal

from hicache.units import check_int
from hicache.errors import ConfigError

Kind = Literal["history", "state"]
IndexSource = Literal["page", "state"]

KINDS: tuple[str, ...] = ("history", "state")
INDEX_SOURCES: tuple[str, ...] = ("page", "state")
FINGERPRINT_VERSION = 1
# Layer ids are < MAX_LAYERS: 30x the deepest model served today, and small enough that a
# typo like "0-99999999" is an error rather than a hundred-million-entry tuple.
MAX_LAYERS = 4096
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _require_int(where: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    n = check_int(where, value, minimum=minimum, maximum=maximum)
    assert n is not None
    return n


@dataclass(frozen=True)
class FamilySpec:
    """One cached family: its kind, layers and row geometry.

    ``rows_kept`` is the number of rows per layer a state snapshot keeps at a boundary
    (e.g. ``sliding_window - 1`` for sliding-window KV); it must be 0 for history families.
    ``index_source`` names the anchor the family's row index comes from; by default
    history families follow the page anchor and state families the state anchor.
    """

    name: str
    kind: Kind
    layer_ids: tuple[int, ...]
    tokens_per_row: int
    row_bytes: int
    rows_kept: int = 0
    index_source: IndexSource | None = None

    def __post_init__(self) -> None:
        where = f"family {self.name!r}"
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ConfigError(f"{where}.name", self.name,
                              "must be lower-case letters, digits and '_' (e.g. c4_kv)")
        if self.kind not in KINDS:
            raise ConfigError(f"{where}.kind", self.kind, f"must be one of {list(KINDS)}")
        layers = tuple(self.layer_ids) if not isinstance(self.layer_ids, (str, bytes)) else None
        if not layers:
            raise ConfigError(f"{where}.layers", self.layer_ids, "must list at least one layer id")
        for lid in layers:
            _require_int(f"{where}.layers", lid, minimum=0, maximum=MAX_LAYERS - 1)
        if len(set(layers)) != len(layers):
            raise ConfigError(f"{where}.layers", list(layers), "layer ids must be unique")
        object.__setattr__(self, "layer_ids", layers)
        _require_int(f"{where}.tokens_per_row", self.tokens_per_row, minimum=1)
        _require_int(f"{where}.row_bytes", self.row_bytes, minimum=1)
        _require_int(f"{where}.rows_kept", self.rows_kept, minimum=0)
        if self.kind == "history" and self.rows_kept != 0:
            raise ConfigError(f"{where}.rows_kept", self.rows_kept,
                              "only state families keep rows at a boundary; history keeps all")
        source = self.index_source
        if source is None:
            source = "page" if self.kind == "history" else "state"
            object.__setattr__(self, "index_source", source)
        if source not in INDEX_SOURCES:
            raise ConfigError(f"{where}.index_source", source,
                              f"must be one of {list(INDEX_SOURCES)}")
        if self.kind == "history" and source != "page":
            raise ConfigError(f"{where}.index_source", source,
                              "a history family must be indexed by the page anchor: its rows cover "
                              "the whole prefix, one page id per page_tokens tokens")

    @property
    def num_layers(self) -> int:
        return len(self.layer_ids)

    @property
    def source(self) -> IndexSource:
        """The anchor this family's rows are indexed by (``index_source``, resolved)."""
        source = self.index_source
        assert source is not None, f"{self.name}: __post_init__ resolves index_source"
        return source

    @property
    def is_history(self) -> bool:
        return self.kind == "history"

    def history_bytes_per_token(self) -> Fraction:
        """Bytes one token of history costs across all layers (0 for state families)."""
        if not self.is_history:
            return Fraction(0)
        return Fraction(self.num_layers * self.row_bytes, self.tokens_per_row)

    def rows_per_id(self, page_tokens: int) -> int:
        """Rows per layer stored under one anchor id (a page or a snapshot)."""
        if self.is_history:
            return page_tokens // self.tokens_per_row
        return self.rows_kept

    def bytes_per_id_per_layer(self, page_tokens: int) -> int:
        return self.rows_per_id(page_tokens) * self.row_bytes

    def bytes_per_id(self, page_tokens: int) -> int:
        """Bytes of this family under one anchor id, all layers."""
        return self.num_layers * self.bytes_per_id_per_layer(page_tokens)

    def canonical(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "layers": list(self.layer_ids),
            "tokens_per_row": self.tokens_per_row,
            "row_bytes": self.row_bytes,
            "rows_kept": self.rows_kept,
            "index_source": self.index_source,
        }


@dataclass(frozen=True)
class CacheLayout:
    """The families of one model and the page size they align to.

    ``page_tokens`` is the unit of every prefix hit and of every transfer. It must be a
    multiple of each family's ``tokens_per_row`` so a page holds a whole number of rows;
    :attr:`min_page_tokens` (the LCM of the compress ratios) is the smallest legal value.
    Engines use 256 for DeepSeek-V4 (the CSA/HCA block alignment).
    """

    families: tuple[FamilySpec, ...]
    page_tokens: int
    model: str = ""
    _by_name: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fams = tuple(self.families)
        object.__setattr__(self, "families", fams)
        if not fams:
            raise ConfigError("families", [], "a layout needs at least one family")
        for i, fam in enumerate(fams):
            if not isinstance(fam, FamilySpec):
                raise ConfigError(f"families[{i}]", fam, "must be a FamilySpec")
        _require_int("page_tokens", self.page_tokens, minimum=1)
        names = [f.name for f in fams]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError("families[].name", dup, "family names must be unique")
        if not any(f.is_history for f in fams):
            raise ConfigError("families[].kind", [f.kind for f in fams],
                              "a layout needs at least one history family")
        for fam in fams:
            where = f"family {fam.name!r}.tokens_per_row"
            if fam.tokens_per_row > self.page_tokens:
                raise ConfigError(where, fam.tokens_per_row,
                                  f"is larger than page_tokens={self.page_tokens}: a page would "
                                  "hold zero rows of this family")
            if self.page_tokens % fam.tokens_per_row:
                raise ConfigError(where, fam.tokens_per_row,
                                  f"does not divide page_tokens={self.page_tokens}")
        self._by_name.update({f.name: f for f in fams})

    # -- lookup -------------------------------------------------------------------------
    def family(self, name: str) -> FamilySpec:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError("family", name, f"unknown family; layout has {list(self._by_name)}")

    @property
    def history_families(self) -> tuple[FamilySpec, ...]:
        return tuple(f for f in self.families if f.is_history)

    @property
    def state_families(self) -> tuple[FamilySpec, ...]:
        return tuple(f for f in self.families if not f.is_history)

    @property
    def has_state(self) -> bool:
        """True when a resume point also needs a state snapshot (hybrid models)."""
        return any(f.rows_kept > 0 for f in self.state_families)

    def families_on(self, source: str) -> tuple[FamilySpec, ...]:
        """Families whose rows are indexed by the given anchor (``page`` or ``state``)."""
        return tuple(f for f in self.families if f.index_source == source)

    # -- sizes --------------------------------------------------------------------------
    @property
    def min_page_tokens(self) -> int:
        return math.lcm(*(f.tokens_per_row for f in self.families))

    @property
    def history_bytes_per_token_exact(self) -> Fraction:
        return sum((f.history_bytes_per_token() for f in self.families), Fraction(0))

    @property
    def history_bytes_per_token(self) -> float:
        return float(self.history_bytes_per_token_exact)

    @property
    def history_bytes_per_page(self) -> int:
        """Bytes of one history page: every history family, every layer."""
        return sum(f.bytes_per_id(self.page_tokens) for f in self.history_families)

    @property
    def state_bytes_per_snapshot(self) -> int:
        """Bytes of one boundary's state snapshot: every state family, every layer."""
        return sum(f.bytes_per_id(self.page_tokens) for f in self.state_families)

    def object_bytes(self, source: str) -> int:
        """Bytes under one id of an anchor: the size of one page or snapshot object."""
        return sum(f.bytes_per_id(self.page_tokens) for f in self.families_on(source))

    # -- identity -----------------------------------------------------------------------
    def canonical(self) -> dict:
        return {
            "version": FINGERPRINT_VERSION,
            "page_tokens": self.page_tokens,
            "families": [f.canonical() for f in self.families],
        }

    @property
    def fingerprint(self) -> str:
        """A stable 16-hex-digit id of the layout's geometry.

        SHA-256 over a canonical JSON form, so it is the same in every process and on
        every machine (no ``hash()``), and changes with any field that changes the bytes.
        The model name is not part of it: two loaders of one model agree.
        """
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def summary(self) -> dict:
        """The machine-readable description printed by ``hicache layout --json``."""
        fams = []
        for f in self.families:
            item = {
                "name": f.name,
                "kind": f.kind,
                "num_layers": f.num_layers,
                "tokens_per_row": f.tokens_per_row,
                "row_bytes": f.row_bytes,
                "bytes_per_token": float(f.history_bytes_per_token()) if f.is_history else None,
                "rows_kept": f.rows_kept,
                "index_source": f.index_source,
            }
            if f.is_history:
                item["bytes_per_page"] = f.bytes_per_id(self.page_tokens)
            else:
                item["bytes_per_snapshot"] = f.bytes_per_id(self.page_tokens)
            fams.append(item)
        return {
            "model": self.model,
            "page_tokens": self.page_tokens,
            "families": fams,
            "history_bytes_per_token": self.history_bytes_per_token,
            "history_bytes_per_page": self.history_bytes_per_page,
            "state_bytes_per_snapshot": self.state_bytes_per_snapshot,
            "fingerprint": self.fingerprint,
        }

    # -- loaders (implemented in hicache.layout.loaders) --------------------------------
    @classmethod
    def from_yaml(cls, path) -> "CacheLayout":
        """Load the ``layout:`` section of a YAML config file (see ``configs/``)."""
        from hicache.layout.loaders import layout_from_yaml

        return layout_from_yaml(path)

    @classmethod
    def from_hf_config(cls, config, **options) -> "CacheLayout":
        """Build the layout from a Hugging Face ``config.json`` (path or dict).

        Supports DeepSeek-V4 (``compress_ratios``), DeepSeek-V3-style MLA
        (``kv_lora_rank``) and Llama-style MHA/GQA; see
        :func:`hicache.layout.loaders.layout_from_hf_config` for the options.
        """
        from hicache.layout.loaders import layout_from_hf_config

        return layout_from_hf_config(config, **options)


def parse_layers(value: object, where: str) -> tuple[int, ...]:
    """Parse a layer list: ``[0, 1, 5]`` or a string like ``"0-42"``, ``"2-42/2, 43"``.

    Ids are bounded by :data:`MAX_LAYERS` before a range is expanded."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (_require_int(where, value, minimum=0, maximum=MAX_LAYERS - 1),)
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_LAYERS:
            raise ConfigError(where, f"[{len(value)} ids]", f"at most {MAX_LAYERS} layers")
        return tuple(_require_int(where, v, minimum=0, maximum=MAX_LAYERS - 1) for v in value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(where, value, "must be a list of layer ids or a range like '2-42/2'")
    out: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?", part)
        if not m:
            raise ConfigError(where, value, f"cannot parse {part.strip()!r}; use 'a', 'a-b' or 'a-b/step'")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise ConfigError(where, value, f"empty or backwards range {part.strip()!r}")
        if hi >= MAX_LAYERS:
            raise ConfigError(where, value, f"layer id {hi} is too large: ids are 0..{MAX_LAYERS - 1}")
        out.extend(range(lo, hi + 1, step))
        if len(out) > MAX_LAYERS:  # only possible with repeated ids
            raise ConfigError(where, value, "layer ids must be unique")
    return tuple(out)


def format_layers(layer_ids: Iterable[int]) -> str:
    """Compact form of a layer list for tables: ``2-42/2`` rather than 21 numbers."""
    ids = list(layer_ids)
    if len(ids) <= 2:
        return ",".join(map(str, ids))
    step = ids[1] - ids[0]
    if step > 0 and all(b - a == step for a, b in zip(ids, ids[1:])):
        return f"{ids[0]}-{ids[-1]}" + (f"/{step}" if step > 1 else "")
    return ",".join(map(str, ids))
