"""``hicache layout CONFIG [--hf-config PATH] [--json]``: what a model caches, and its size."""

from __future__ import annotations

import argparse

from hicache.cli.common import print_json, resolve_config
from hicache.cli.table import render_table
from hicache.errors import ConfigError
from hicache.layout import CacheLayout, format_layers
from hicache.layout.loaders import layout_from_mapping, load_hf_config, read_config_file
from hicache.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("layout", help="print the cache layout of a model config",
                       description="Print each cached family of a model (kind, layers, row size, "
                                   "bytes per token and per page) and the totals.")
    p.add_argument("config", nargs="?", help="config YAML (a path, or a name from configs/ "
                   "such as deepseek-v4-flash); optional with --hf-config")
    p.add_argument("--hf-config", metavar="PATH",
                   help="build the layout from a Hugging Face config.json instead")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def load_layout(args: argparse.Namespace) -> CacheLayout:
    section: dict = {}
    model = ""
    if args.config:
        path = resolve_config(args.config)
        data = read_config_file(path)
        model = str(data.get("model", ""))
        section = dict(data.get("layout") or {})
        if not args.hf_config:
            return layout_from_mapping(data.get("layout"), model=model, source=str(path))
    if not args.hf_config:
        raise ConfigError("config", None, "give a CONFIG file or --hf-config PATH")
    options = {k: section[k] for k in ("page_tokens", "kv_format", "indexer_format", "include_mtp")
               if k in section}
    hf = load_hf_config(args.hf_config)
    return layout_from_mapping({"hf_config": hf, **options}, model=model, source=args.hf_config)


def run(args: argparse.Namespace) -> int:
    layout = load_layout(args)
    summary = layout.summary()
    if args.json:
        print_json(summary)
        return 0
    rows = []
    for fam, item in zip(layout.families, summary["families"]):
        per_id = item.get("bytes_per_page", item.get("bytes_per_snapshot"))
        rows.append([fam.name, fam.kind, f"{fam.num_layers} ({format_layers(fam.layer_ids)})",
                     fam.tokens_per_row, fam.row_bytes, fam.rows_kept if not fam.is_history else None,
                     item["bytes_per_token"], per_id])
    name = layout.model or "layout"
    print(render_table(
        ["family", "kind", "layers", "tokens/row", "bytes/row", "rows kept", "bytes/token",
         "bytes/page or snapshot"],
        rows, align="lllrrrrr",
        title=f"{name}: page_tokens={layout.page_tokens}  fingerprint={layout.fingerprint}"))
    print()
    per_token = f"{summary['history_bytes_per_token']:,.4f}".rstrip("0").rstrip(".")
    print(f"history bytes per token    {per_token}")
    print(f"history bytes per page     {summary['history_bytes_per_page']:,} "
          f"({format_bytes(summary['history_bytes_per_page'])})")
    print(f"state bytes per snapshot   {summary['state_bytes_per_snapshot']:,} "
          f"({format_bytes(summary['state_bytes_per_snapshot'])})")
    return 0
