"""hicache as SGLang HiCache's L3 storage backend.

Launch SGLang with::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{
        "backend_name": "hicache", "module_path": "hicache.integrations.sglang",
        "class_name": "HiCacheStorageBackend", "interface_v1": 1,
        "url": "redis://127.0.0.1:6379/0"}'

:class:`HiCacheStorageBackend` lives in :mod:`hicache.integrations.sglang.backend`, which
imports SGLang; it is loaded on first use of the name, so this package (and its
SGLang-free parts: :mod:`.config`, :mod:`.pages`) imports without SGLang. Without SGLang
the name raises :class:`~hicache.errors.ConfigError` saying so. See ``docs/integrations.md``.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from hicache.errors import ConfigError

__all__ = ["HiCacheStorageBackend"]


def __getattr__(name: str) -> Any:
    if name != "HiCacheStorageBackend":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if importlib.util.find_spec("sglang") is None:
        raise ConfigError("hicache.integrations.sglang", name,
                          "SGLang is not installed in this Python environment "
                          "(pip install sglang, then launch it with --hicache-storage-backend dynamic)")
    from hicache.integrations.sglang.backend import HiCacheStorageBackend

    return HiCacheStorageBackend
