"""hicache in vLLM, two ways.

* :class:`~hicache.integrations.vllm.connector.HiCacheConnector`, a ``KVConnectorBase_V1``:
  the whole of hicache (radix tree, host pool, L3) behind vLLM's paged KV, loaded with
  ``kv_connector="HiCacheConnector"``, ``kv_connector_module_path=CONNECTOR_MODULE``
  (:mod:`~.bridge` is its scheduler protocol, :mod:`~.blocks` the worker's copies,
  :mod:`~.config` its ``kv_connector_extra_config``).
* hicache's L3 store as a secondary tier of vLLM's ``OffloadingConnector``:

vLLM's ``TieringOffloadingSpec`` keeps a CPU primary tier and cascades every stored chunk
to its secondary tiers; a lookup that misses the primary tier asks them and promotes a hit
back. :class:`~hicache.integrations.vllm.tier.HiCacheSecondaryTier` is such a tier over
any hicache storage URL (``memory://``, ``file://``, ``redis://``, ``rediss://``,
``unix://``, ``redis+cluster://``), with hicache's checked objects, breaker and metrics.
vLLM loads it by name, no fork or registration needed::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 10737418240,
        "secondary_tiers": [{"type": "HiCacheSecondaryTier",
                             "module_path": "hicache.integrations.vllm.tier",
                             "url": "redis://cache-host:6379/0"}]}}'

This package imports vLLM only in :mod:`~hicache.integrations.vllm.tier` and
:mod:`~hicache.integrations.vllm.connector`, the modules vLLM loads; the rest is plain
hicache. See ``docs/integrations.md``.
"""

CONNECTOR_MODULE = "hicache.integrations.vllm.connector"
CONNECTOR_NAME = "HiCacheConnector"

TIER_MODULE = "hicache.integrations.vllm.tier"
TIER_TYPE = "HiCacheSecondaryTier"


def tier_config(url: str, **options) -> dict:
    """One ``secondary_tiers`` entry for ``kv_connector_extra_config`` (options: ``salt``,
    ``threads``, ``l3`` -- a dict of :class:`hicache.storage.L3Config` fields)."""
    return {"type": TIER_TYPE, "module_path": TIER_MODULE, "url": url, **options}
