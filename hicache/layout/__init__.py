"""Layer 0: what is cached and how big it is. Imports nothing else of hicache but errors."""

from hicache.layout.spec import CacheLayout, FamilySpec, format_layers, parse_layers
from hicache.layout.loaders import (layout_from_hf_config, layout_from_mapping, layout_from_yaml, load_hf_config,
                                    read_config_file)

__all__ = [
    "CacheLayout",
    "FamilySpec",
    "format_layers",
    "parse_layers",
    "layout_from_hf_config",
    "layout_from_mapping",
    "load_hf_config",
    "layout_from_yaml",
    "read_config_file",
]
