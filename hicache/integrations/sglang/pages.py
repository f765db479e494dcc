"""SGLang host-pool pages as L3 objects: keys, namespaces and scatter/gather views.

No SGLang import: these helpers only read what SGLang's host pools expose
(``get_data_page``, ``get_dummy_flat_data_page``, ``set_from_flat_data_page``, ``layout``,
``page_size``, ``dtype``) and so are tested with plain tensors.

Why pages move as lists of pieces: a page of SGLang's ``page_first`` MHA host pool is two
regions (K rows and V rows, ``kv_buffer[0]`` and ``kv_buffer[1]``); ``layer_first`` is one
region per layer and K/V. :func:`byte_pieces` cuts the page's strided view into its
contiguous regions, in the order of the pool's own flat page, so the stored object is
byte for byte what ``get_data_page(flat=True)`` would produce, and L3 reads land straight
in the pool without a staging page.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from hicache.storage import L3Store
from hicache.storage.objects import ObjectKind

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
# Pool attributes that change a page's bytes without changing its size.
_GEOMETRY_ATTRS = ("layer_num", "head_num", "head_dim", "v_head_dim", "kv_lora_rank",
                   "qk_rope_head_dim", "kv_cache_dim", "item_bytes", "storage_format_tag")


def key_hash(key: str) -> bytes:
    """An SGLang page key as the page hash our object keys and headers carry.

    SGLang keys are chained SHA-256 hex digests; those are used as they are. Anything else
    (tests use short names) is hashed, so every key maps to a fixed-size digest.
    """
    if _HEX64.match(key):
        return bytes.fromhex(key)
    return hashlib.sha256(key.encode()).digest()


def byte_pieces(page: torch.Tensor) -> list[torch.Tensor]:
    """The contiguous regions of a (possibly strided) tensor view, as flat uint8 views.

    Split along the leading dimension until each part is contiguous; the concatenation of
    the pieces is ``page.flatten()``'s bytes, and writing a piece writes ``page``.
    """
    if page.is_contiguous():
        return [page.reshape(-1).view(torch.uint8)] if page.numel() else []
    assert page.dim() > 1, "a non-contiguous 1-D page has no contiguous regions"
    out: list[torch.Tensor] = []
    for i in range(page.shape[0]):
        out.extend(byte_pieces(page[i]))
    return out


def tensor_bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view (no copy)."""
    assert t.is_contiguous(), "expected a contiguous tensor"
    return t.reshape(-1).view(torch.uint8)


def pool_fingerprint(descriptor: Mapping[str, Any]) -> str:
    """16 hex digits naming one pool's page format (the namespace's layout part)."""
    blob = json.dumps(descriptor, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class PoolSlot:
    """One registered SGLang host pool and the L3 namespace its pages live in.

    ``replicated``: every TP rank holds the same bytes (MLA, DeepSeek-V4's compressed
    caches), so the namespace leaves the TP rank out and only the storage writer writes.
    """

    name: str
    pool: Any
    page_size: int
    page_bytes: int
    replicated: bool
    store: L3Store
    logical: bool = False              # an anchor without bytes (DeepSeek-V4's KV): nothing stored
    zero_copy: Optional[bool] = None  # decided on first use (see pieces)

    def host_rows(self, host_indices: torch.Tensor, n: int) -> Optional[list[int]]:
        """The first host index of each of ``n`` pages, or None when the count is off."""
        if host_indices is None or host_indices.numel() != n * self.page_size:
            return None
        return host_indices.reshape(-1)[::self.page_size].tolist()[:n]

    def pieces(self, index: int) -> Optional[list[torch.Tensor]]:
        """Views of page ``index`` inside the pool, or None when the pool only hands copies.

        Whether ``get_data_page(flat=False)`` returns the pool's own memory is asked once
        per pool: two calls for the same page must give the same address while the first
        result is alive (a pool that concatenates, like Mamba's, allocates twice).
        """
        page = self.pool.get_data_page(index, flat=False)
        if self.zero_copy is None:
            again = self.pool.get_data_page(index, flat=False)
            self.zero_copy = (page.device.type == "cpu" and page.data_ptr() == again.data_ptr()
                              and page.numel() * page.element_size() == self.page_bytes)
        if not self.zero_copy:
            return None
        pieces = byte_pieces(page)
        assert sum(p.numel() for p in pieces) == self.page_bytes, "page view changed size"
        return pieces

    def staging_page(self) -> torch.Tensor:
        return self.pool.get_dummy_flat_data_page()

    def flat_page(self, index: int) -> torch.Tensor:
        return self.pool.get_data_page(index, flat=True).contiguous()


def pool_descriptor(name: str, pool: Any, page_bytes: int, *, model: str, ranks: Mapping[str, Any],
                    replicated: bool) -> dict:
    """Everything that decides a pool's page bytes and which rank's shard they are."""
    desc: dict[str, Any] = {
        "format": "sglang-hicache/1", "model": model, "pool": str(name),
        "layout": getattr(pool, "layout", None), "page_size": int(getattr(pool, "page_size", 1) or 1),
        "page_bytes": page_bytes, "dtype": str(getattr(pool, "dtype", None)),
        "class": type(pool).__name__,
    }
    for attr in _GEOMETRY_ATTRS:
        v = getattr(pool, attr, None)
        if isinstance(v, (int, str)):
            desc[attr] = v
    desc.update({k: v for k, v in ranks.items() if not (replicated and k == "tp")})
    return desc


def kind_of(hit_policy: Any) -> ObjectKind:
    """``TRAILING_PAGES`` pools (SWA windows, Mamba states) are state objects; the rest
    (``ALL_PAGES``, ``BLOCK_GROUPS``: history every prefix page needs) page objects."""
    return ObjectKind.STATE if str(getattr(hit_policy, "value", hit_policy)) == "trailing_pages" \
        else ObjectKind.PAGE
