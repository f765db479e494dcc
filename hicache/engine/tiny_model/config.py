"""The tiny model's configuration and the cache layout derived from it.

One compress ratio per layer, as in DeepSeek-V4's ``compress_ratios``::

    ratio 0    SWA-only: sliding window of W uncompressed tokens
    ratio 4    CSA: window + overlapping gated compressor (every 4 tokens) + lightning indexer
    ratio m    HCA: window + non-overlapping gated compressor (every m tokens), dense

:func:`layout_for` turns a config into the :class:`~hicache.layout.CacheLayout` whose
families hold exactly what a resume at a page boundary ``b`` needs (float64 rows)::

    family            kind     layers  tokens/row  row (float64 values)    rows kept at b
    swa_kv            state    all     1           head_dim                W - 1
    c4_kv             history  CSA     4           head_dim                -
    c4_indexer        history  CSA     4           index_dim               -
    c{m}_kv           history  HCA(m)  m           head_dim                -
    c4_state          state    CSA     1           2 * head_dim            4
    c4_indexer_state  state    CSA     1           2 * index_dim           4
    c{m}_state        state    HCA(m)  1           2 * head_dim            b mod m = 0

Why those state rows (the truth the exactness tests check, see ``docs/tiny_model.md``):

* ``swa_kv``: the token at ``b`` attends to ``[b - W + 1, b]``; ``W - 1`` of those rows
  precede ``b``.
* ``c4_state`` / ``c4_indexer_state``: the overlapping compressor mixes, for the entry
  covering ``[b, b + 4)``, the *overlap half* ``(kv_a, score_a)`` of the 4 tokens before
  ``b`` with the own half of its own tokens. So a boundary needs 4 rows of
  ``(kv_a, score_a)`` -- half the width engines store (they keep both halves of 8 rows,
  DOMAIN.md "engines keep 8"), because at an aligned boundary the other halves belong to
  an entry that is already complete and cached in ``c4_kv``.
* ``c{m}_state``: a non-overlapping block that starts at ``b`` needs nothing before it;
  ``page_tokens`` is a multiple of ``m`` so a page boundary keeps 0 rows (the row format,
  ``(kv, score)``, is what a mid-block boundary would keep).
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.errors import ConfigError
from hicache.units import check_int, check_number
from hicache.layout import CacheLayout, FamilySpec

CSA_RATIO = 4
FLOAT_BYTES = 8  # every cached row is float64
SWA_FAMILY = "swa_kv"
INDEXER_FAMILY = f"c{CSA_RATIO}_indexer"
INDEXER_STATE_FAMILY = f"c{CSA_RATIO}_indexer_state"


def _int(name: str, value: object, minimum: int) -> int:
    return check_int(name, value, minimum=minimum)


@dataclass(frozen=True)
class TinyV4Config:
    """Sizes of the tiny DeepSeek-V4-style stack (defaults run 2k tokens in about a second).

    ``compress_ratios`` has one entry per layer: 0 = SWA-only, 4 = CSA, any other m = HCA.
    ``page_tokens`` must be a multiple of every non-zero ratio (a page holds whole
    compressed entries); ``max_positions`` bounds the precomputed rotary table.
    """

    vocab: int = 64
    hidden: int = 32
    ffn: int = 64
    compress_ratios: tuple[int, ...] = (0, 0, 4, 8, 4, 8)
    window: int = 8
    num_heads: int = 2
    head_dim: int = 16
    rope_dim: int = 8
    q_rank: int = 16
    index_heads: int = 2
    index_dim: int = 8
    index_rope_dim: int = 4
    index_topk: int = 4
    page_tokens: int = 16
    max_positions: int = 4096
    seed: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        for name, minimum in (("vocab", 2), ("hidden", 1), ("ffn", 1), ("window", 2),
                              ("num_heads", 1), ("head_dim", 2), ("rope_dim", 0), ("q_rank", 1),
                              ("index_heads", 1), ("index_dim", 2), ("index_rope_dim", 0),
                              ("index_topk", 1), ("page_tokens", 1), ("max_positions", 1),
                              ("seed", 0)):
            _int(name, getattr(self, name), minimum)
        ratios = self.compress_ratios
        if isinstance(ratios, (str, bytes)) or not hasattr(ratios, "__iter__"):
            raise ConfigError("compress_ratios", ratios, "must be a list with one ratio per layer")
        ratios = tuple(ratios)
        object.__setattr__(self, "compress_ratios", ratios)
        if not ratios:
            raise ConfigError("compress_ratios", list(ratios), "needs at least one layer")
        for i, r in enumerate(ratios):
            _int(f"compress_ratios[{i}]", r, 0)
            if r and self.page_tokens % r:
                raise ConfigError(f"compress_ratios[{i}]", r,
                                  f"does not divide page_tokens={self.page_tokens}")
        if not any(ratios):
            raise ConfigError("compress_ratios", list(ratios),
                              "needs a compressed layer (4 = CSA or m = HCA): without one no "
                              "family spans the whole prefix")
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise ConfigError("rope_dim", self.rope_dim, f"must be even and <= head_dim={self.head_dim}")
        if self.index_rope_dim % 2 or self.index_rope_dim > self.index_dim:
            raise ConfigError("index_rope_dim", self.index_rope_dim,
                              f"must be even and <= index_dim={self.index_dim}")
        if self.max_positions < self.page_tokens:
            raise ConfigError("max_positions", self.max_positions,
                              f"must be >= page_tokens={self.page_tokens}")
        for name in ("rope_theta", "norm_eps"):
            check_number(name, getattr(self, name))

    # -- per-layer structure --------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.compress_ratios)

    def ratio(self, layer: int) -> int:
        return self.compress_ratios[layer]

    def is_csa(self, layer: int) -> bool:
        return self.compress_ratios[layer] == CSA_RATIO

    def layers_with_ratio(self, ratio: int) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.compress_ratios) if r == ratio)

    @property
    def ratios(self) -> tuple[int, ...]:
        """The distinct non-zero compress ratios, ascending."""
        return tuple(sorted({r for r in self.compress_ratios if r}))

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5


def kv_family(ratio: int) -> str:
    return f"c{ratio}_kv"


def state_family(ratio: int) -> str:
    return f"c{ratio}_state"


def layout_for(cfg: TinyV4Config) -> CacheLayout:
    """The cache layout of the tiny model: every DOMAIN.md section 1 family, float64 rows."""
    d, di, w = cfg.head_dim, cfg.index_dim, cfg.window
    history: list[FamilySpec] = []
    state = [FamilySpec(SWA_FAMILY, "state", tuple(range(cfg.num_layers)), 1, d * FLOAT_BYTES,
                        rows_kept=w - 1)]
    for r in cfg.ratios:
        layers = cfg.layers_with_ratio(r)
        history.append(FamilySpec(kv_family(r), "history", layers, r, d * FLOAT_BYTES))
        if r == CSA_RATIO:
            history.append(FamilySpec(INDEXER_FAMILY, "history", layers, r, di * FLOAT_BYTES))
            state.append(FamilySpec(state_family(r), "state", layers, 1, 2 * d * FLOAT_BYTES,
                                    rows_kept=r))
            state.append(FamilySpec(INDEXER_STATE_FAMILY, "state", layers, 1,
                                    2 * di * FLOAT_BYTES, rows_kept=r))
        else:
            state.append(FamilySpec(state_family(r), "state", layers, 1, 2 * d * FLOAT_BYTES,
                                    rows_kept=cfg.page_tokens % r))
    # Same order as the DeepSeek-V4 loader: swa_kv, history families, compressor states.
    return CacheLayout((state[0], *history, *state[1:]), cfg.page_tokens, model="tiny-v4")
