"""Build a :class:`CacheLayout` from a YAML file or a Hugging Face ``config.json``.

Row formats follow DOMAIN.md section 1 (the FP8 ``fp8_ds_mla`` layout shared by vLLM,
SGLang and TokenSpeed for DeepSeek-V4):

* KV row, fp8: ``nope`` FP8 bytes + ``rope`` BF16 values + one UE8M0 scale byte per 64
  ``nope`` values padded to 8 bytes -> 448 + 128 + 8 = 584 B for head_dim 512.
  bf16: ``2 * head_dim`` bytes.
* Indexer key row: fp8 ``index_head_dim + 4`` (132 B), fp4 ``index_head_dim / 2 + 4`` (68 B).
* Compressor state rows are fp32 ``(kv, score)`` pairs per token: the overlapping CSA
  compressor projects twice the width (current block and the next block's overlap).

What a boundary ``b`` (a multiple of ``page_tokens``) needs of each state family:

* ``swa_kv``: the window before ``b`` -- the next token attends to ``[b - W + 1, b]``,
  so ``W - 1`` rows.
* CSA state (ratio r, overlapping): the entry starting at ``b`` mixes the r tokens before
  ``b`` -> ``r`` rows.
* HCA state (ratio m, no overlap): ``b mod m`` rows, which is 0 because ``m`` divides
  ``page_tokens``; the family is listed so its pools exist for engines that checkpoint
  mid-page, and costs nothing per snapshot.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping

from hicache.units import check_bool, check_int
from hicache.errors import ConfigError
from hicache.inputs import check_shape, load_json, load_yaml, read_text
from hicache.layout.spec import MAX_LAYERS, CacheLayout, FamilySpec, _require_int, parse_layers

TOP_LEVEL_KEYS = ("model", "layout", "cache", "engine")  # engine: hicache.engine.clock
LAYOUT_KEYS = ("page_tokens", "families", "hf_config", "kv_format", "indexer_format",
               "include_mtp")
FAMILY_KEYS = ("name", "kind", "layers", "tokens_per_row", "row_bytes", "rows_kept",
               "index_source")
DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1,
}
KV_FORMATS = ("fp8", "bf16")
INDEXER_FORMATS = ("fp8", "fp4")
DEFAULT_PAGE_TOKENS = 256
CSA_RATIO = 4  # DeepSeek-V4: ratio 4 layers use the overlapping compressor + indexer


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a hicache YAML config and check its top-level keys."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError("config", str(path), "no such file")
    text = read_text(p, "config")   # its errors name the file already
    try:   # bounded: size, depth, alias expansion, integer length, text keys (hicache.inputs)
        data = load_yaml(text, "config")
    except ConfigError as exc:
        if exc.field == "config" and exc.value == "...":   # the file itself: name it
            raise ConfigError("config", str(path), exc.reason) from None
        raise ConfigError(exc.field, exc.value, exc.reason, source=exc.source or str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("config", str(path), "must be a YAML mapping with a 'layout' key")
    unknown = sorted(set(data) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(unknown[0], "...", f"unknown top-level key; expected {list(TOP_LEVEL_KEYS)}",
                          source=str(path))
    if "model" in data and not isinstance(data["model"], str):
        raise ConfigError("model", data["model"], "must be a name (text)", source=str(path))
    return data


def _check_keys(section: Mapping, allowed: tuple[str, ...], where: str, source: str | None) -> None:
    if not isinstance(section, Mapping):
        raise ConfigError(where, section, "must be a mapping", source=source)
    for key in section:
        if key not in allowed:
            raise ConfigError(f"{where}.{key}", section[key],
                              f"unknown field; expected one of {list(allowed)}", source=source)


def layout_from_yaml(path: str | os.PathLike) -> CacheLayout:
    """Load the ``layout:`` section of a config file.

    The section either lists ``families`` explicitly or embeds an ``hf_config`` mapping
    (the fields of a ``config.json``) that :func:`layout_from_hf_config` turns into one.
    """
    data = read_config_file(path)
    return layout_from_mapping(data.get("layout"), model=str(data.get("model", "")), source=str(path))


def layout_from_mapping(section: Any, *, model: str = "", source: str | None = None) -> CacheLayout:
    if section is None:
        raise ConfigError("layout", None, "missing; the config needs a 'layout' section", source=source)
    _check_keys(section, LAYOUT_KEYS, "layout", source)
    try:
        if "hf_config" in section:
            if "families" in section:
                raise ConfigError("layout.families", "...",
                                  "give either 'families' or 'hf_config', not both")
            options = {k: section[k] for k in ("page_tokens", "kv_format", "indexer_format",
                                                "include_mtp") if k in section}
            layout = layout_from_hf_config(section["hf_config"], **options)
        else:
            layout = _layout_from_families(section)
    except ConfigError as exc:
        if source and exc.source is None:
            raise ConfigError(exc.field, exc.value, exc.reason, source=source) from None
        raise
    if model:
        layout = CacheLayout(layout.families, layout.page_tokens, model=model)
    return layout


def _layout_from_families(section: Mapping) -> CacheLayout:
    families = section.get("families")
    if not isinstance(families, list) or not families:
        raise ConfigError("layout.families", families, "must be a non-empty list of families")
    for opt in ("kv_format", "indexer_format", "include_mtp"):
        if opt in section:
            raise ConfigError(f"layout.{opt}", section[opt], "only applies with 'hf_config'")
    specs = []
    for i, fam in enumerate(families):
        where = f"layout.families[{i}]"
        _check_keys(fam, FAMILY_KEYS, where, None)
        for required in ("name", "kind", "layers", "tokens_per_row", "row_bytes"):
            if required not in fam:
                raise ConfigError(f"{where}.{required}", None, "missing required field")
        specs.append(FamilySpec(
            name=fam["name"],
            kind=fam["kind"],
            layer_ids=parse_layers(fam["layers"], f"{where}.layers"),
            tokens_per_row=fam["tokens_per_row"],
            row_bytes=fam["row_bytes"],
            rows_kept=fam.get("rows_kept", 0),
            index_source=fam.get("index_source"),
        ))
    page_tokens = section.get("page_tokens", DEFAULT_PAGE_TOKENS)
    return CacheLayout(tuple(specs), page_tokens)


# -- Hugging Face configs -----------------------------------------------------------------

def load_hf_config(config: Any) -> dict:
    if isinstance(config, Mapping):
        check_shape(config, "hf_config", root="hf_config")   # a mapping from code or YAML
        return dict(config)
    p = Path(config)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ConfigError("hf_config", str(config), "no such file")
    data = load_json(read_text(p, "hf_config"), "hf_config", str(config))
    if not isinstance(data, dict):
        raise ConfigError("hf_config", str(config), "must be a JSON object")
    return data


def _field(cfg: Mapping, key: str, *, minimum: int = 1, default: Any = None,
           maximum: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ConfigError(f"hf_config.{key}", None, "missing required field")
    return _require_int(f"hf_config.{key}", value, minimum=minimum, maximum=maximum)


def _dtype_bytes(cfg: Mapping, key: str = "torch_dtype") -> int:
    dtype = cfg.get(key) or cfg.get("dtype") or "bfloat16"
    name = str(dtype).replace("torch.", "").lower()
    if name not in DTYPE_BYTES:
        raise ConfigError(f"hf_config.{key}", dtype, f"unknown dtype; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def layout_from_hf_config(config: Any, *, page_tokens: int | None = None,
                          kv_format: str = "fp8", indexer_format: str = "fp8",
                          include_mtp: bool = False) -> CacheLayout:
    """Build a layout from a Hugging Face ``config.json`` path, directory or dict.

    * DeepSeek-V4 (has ``compress_ratios``): families ``swa_kv``, ``c{r}_kv`` and, for the
      CSA ratio 4, ``c4_indexer`` plus compressor states. ``kv_format`` is ``fp8`` (584 B
      rows) or ``bf16``; ``indexer_format`` ``fp8`` or ``fp4``. ``include_mtp`` adds the
      ``num_nextn_predict_layers`` draft layers that follow the main layers.
    * MLA (has ``kv_lora_rank``): one history family ``mla_kv``.
    * MHA/GQA (Llama style): one history family ``kv``.
    """
    cfg = load_hf_config(config)
    # Checked before any arithmetic: 0 is an error, not the default, and "abc" is no number.
    page_tokens = _require_int("page_tokens", DEFAULT_PAGE_TOKENS if page_tokens is None else page_tokens,
                               minimum=1)
    check_bool("include_mtp", include_mtp)
    if "compress_ratios" in cfg:
        return _deepseek_v4(cfg, page_tokens, kv_format, indexer_format, include_mtp)
    if "kv_lora_rank" in cfg:
        return _mla(cfg, page_tokens)
    if "num_attention_heads" in cfg:
        return _mha(cfg, page_tokens)
    raise ConfigError("hf_config", sorted(cfg)[:8],
                      "not a recognised model config: expected 'compress_ratios' (DeepSeek-V4), "
                      "'kv_lora_rank' (MLA) or 'num_attention_heads' (MHA/GQA)")


def _deepseek_v4(cfg: Mapping, page_tokens: int, kv_format: str, indexer_format: str,
                 include_mtp: bool) -> CacheLayout:
    if not isinstance(kv_format, str) or kv_format not in KV_FORMATS:
        raise ConfigError("kv_format", kv_format, f"must be one of {list(KV_FORMATS)}")
    if not isinstance(indexer_format, str) or indexer_format not in INDEXER_FORMATS:
        raise ConfigError("indexer_format", indexer_format, f"must be one of {list(INDEXER_FORMATS)}")
    num_layers = _field(cfg, "num_hidden_layers", maximum=MAX_LAYERS)
    head_dim = _field(cfg, "head_dim")
    rope = _field(cfg, "qk_rope_head_dim", default=64)
    window = _field(cfg, "sliding_window")
    index_dim = _field(cfg, "index_head_dim")
    mtp = _field(cfg, "num_nextn_predict_layers", minimum=0, default=0, maximum=MAX_LAYERS) if include_mtp else 0
    ratios = cfg["compress_ratios"]
    if not isinstance(ratios, list) or len(ratios) < num_layers + mtp:
        raise ConfigError("hf_config.compress_ratios", ratios,
                          f"needs at least num_hidden_layers ({num_layers})"
                          + (f" + MTP ({mtp})" if mtp else "") + " entries")
    ratios = ratios[: num_layers + mtp]
    for i, r in enumerate(ratios):
        check_int(f"hf_config.compress_ratios[{i}]", r)
        if r and page_tokens % r:
            raise ConfigError(f"hf_config.compress_ratios[{i}]", r,
                              f"does not divide page_tokens={page_tokens}"
                              + ("; a page would hold zero compressed rows" if r > page_tokens else ""))
    if rope >= head_dim:
        raise ConfigError("hf_config.qk_rope_head_dim", rope, f"must be < head_dim={head_dim}")
    if index_dim % 2:
        raise ConfigError("hf_config.index_head_dim", index_dim, "must be even")

    nope = head_dim - rope
    if kv_format == "fp8":
        kv_row = nope + 2 * rope + _round_up(math.ceil(nope / 64), 8)
    else:
        kv_row = 2 * head_dim
    idx_row = index_dim + 4 if indexer_format == "fp8" else index_dim // 2 + 4

    all_layers = tuple(range(len(ratios)))
    fams = [FamilySpec("swa_kv", "state", all_layers, 1, kv_row, rows_kept=window - 1)]
    state_fams = []
    for r in sorted({r for r in ratios if r}):
        layers = tuple(i for i, x in enumerate(ratios) if x == r)
        fams.append(FamilySpec(f"c{r}_kv", "history", layers, r, kv_row))
        if r == CSA_RATIO:
            fams.append(FamilySpec(f"c{r}_indexer", "history", layers, r, idx_row))
            # Overlapping compressor: fp32 (kv, score) x 2 halves per token, r tokens kept.
            state_fams.append(FamilySpec(f"c{r}_state", "state", layers, 1, 2 * 2 * head_dim * 4,
                                         rows_kept=r))
            state_fams.append(FamilySpec(f"c{r}_indexer_state", "state", layers, 1,
                                         2 * 2 * index_dim * 4, rows_kept=r))
        else:
            state_fams.append(FamilySpec(f"c{r}_state", "state", layers, 1, 2 * head_dim * 4,
                                         rows_kept=page_tokens % r))
    if len(fams) == 1:
        raise ConfigError("hf_config.compress_ratios", ratios,
                          "has no compressed layer, so nothing spans the whole prefix")
    return CacheLayout(tuple(fams + state_fams), page_tokens)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _mla(cfg: Mapping, page_tokens: int) -> CacheLayout:
    layers = _field(cfg, "num_hidden_layers", maximum=MAX_LAYERS)
    rank = _field(cfg, "kv_lora_rank")
    rope = _field(cfg, "qk_rope_head_dim")
    row = (rank + rope) * _dtype_bytes(cfg)
    return CacheLayout((FamilySpec("mla_kv", "history", tuple(range(layers)), 1, row),), page_tokens)


def _mha(cfg: Mapping, page_tokens: int) -> CacheLayout:
    layers = _field(cfg, "num_hidden_layers", maximum=MAX_LAYERS)
    heads = _field(cfg, "num_attention_heads")
    kv_heads = _field(cfg, "num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise ConfigError("hf_config.num_key_value_heads", kv_heads,
                          f"must divide num_attention_heads={heads}")
    if cfg.get("head_dim") is not None:
        head_dim = _field(cfg, "head_dim")
    else:
        hidden = _field(cfg, "hidden_size")
        if hidden % heads:
            raise ConfigError("hf_config.hidden_size", hidden,
                              f"is not a multiple of num_attention_heads={heads}; give head_dim")
        head_dim = hidden // heads
    row = 2 * kv_heads * head_dim * _dtype_bytes(cfg)
    return CacheLayout((FamilySpec("kv", "history", tuple(range(layers)), 1, row),), page_tokens)
