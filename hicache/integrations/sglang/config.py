"""The extra-config JSON of SGLang's ``dynamic`` storage backend, parsed into one frozen config.

SGLang passes ``--hicache-storage-backend-extra-config`` to the backend as a dict; it also
carries SGLang's own keys (the three that select the class, ``interface_v1``, the prefetch
knobs it pops itself). This module knows which keys are ours, which are SGLang's (kept,
not used), and refuses anything else with one line naming the key: a typo in a launch
flag must not silently run with defaults. No SGLang import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from hicache.errors import ConfigError
from hicache.storage import L3Config
from hicache.units import check_bool

# Read by SGLang itself (backend selection, controller options); accepted and ignored here.
SGLANG_KEYS = frozenset({
    "backend_name", "module_path", "class_name", "interface_v1", "prefetch_threshold",
    "prefetch_timeout_base", "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys",
    "tp_lcm_size",
})
# Handed to hicache.storage.open_backend (it checks which ones the URL's scheme takes).
BACKEND_OPTIONS = frozenset({
    "connect_timeout", "timeout", "connections", "pipeline", "db", "username", "password",
    "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "capacity", "fsync",
})
# Fields of L3Config (batching, read retries, circuit breaker).
STORE_OPTIONS = frozenset({
    "lookup_batch", "read_batch", "read_retries", "breaker_threshold", "breaker_cooldown_s",
    "breaker_max_cooldown_s",
})
OWN_KEYS = frozenset({"url", "salt", "skip_existing"})


@dataclass(frozen=True)
class SGLangL3Config:
    """What :class:`~hicache.integrations.sglang.HiCacheStorageBackend` is built from.

    * ``url``: any hicache storage URL (``memory://NAME``, ``file:///dir``, ``redis://``,
      ``rediss://``, ``unix://``, ``redis+cluster://``);
    * ``salt``: mixed into every namespace (two deployments sharing one store but not
      their pages pick different salts);
    * ``backend_options``: timeouts, connections, TLS files... for ``open_backend``;
    * ``store``: the :class:`~hicache.storage.L3Config` (breaker, retries, batching);
    * ``skip_existing``: ask the store before writing and skip pages it already holds;
    * ``interface_v1``: SGLang uses the zero-copy v1 methods (its own flag, echoed here).
    """

    url: str
    salt: str = ""
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    store: L3Config = L3Config()
    skip_existing: bool = True
    interface_v1: bool = False

    @classmethod
    def from_extra_config(cls, extra: "Mapping[str, Any] | None") -> "SGLangL3Config":
        """Parse SGLang's extra-config dict; :class:`ConfigError` names a bad or unknown key."""
        extra = dict(extra or {})
        unknown = sorted(set(extra) - SGLANG_KEYS - BACKEND_OPTIONS - STORE_OPTIONS - OWN_KEYS)
        if unknown:
            # the value is not echoed: a misspelt "pasword" must not print the secret
            raise ConfigError(f"extra_config.{unknown[0]}", "...",
                              "unknown key for hicache's SGLang backend; expected one of "
                              f"{sorted(OWN_KEYS | BACKEND_OPTIONS | STORE_OPTIONS)} "
                              "(or SGLang's own keys)")
        url = extra.get("url")
        if not isinstance(url, str) or "://" not in url:
            shown = "(not a URL)" if isinstance(url, str) else url  # may hold a password: never echoed
            raise ConfigError("extra_config.url", shown,
                              "required: a hicache storage URL such as redis://host:6379/0 or file:///dir")
        salt = extra.get("salt", "")
        if not isinstance(salt, str):
            raise ConfigError("extra_config.salt", salt, "must be a string")
        skip = extra.get("skip_existing", True)
        check_bool("extra_config.skip_existing", skip)
        v1 = extra.get("interface_v1", 0)
        if v1 not in (0, 1, True, False):
            raise ConfigError("extra_config.interface_v1", v1, "must be 0 or 1")
        store_kw = {k: extra[k] for k in STORE_OPTIONS if k in extra}
        try:
            store = L3Config(**store_kw)
        except ConfigError as exc:
            raise ConfigError(f"extra_config.{exc.field}", exc.value, exc.reason) from None
        options = {k: extra[k] for k in BACKEND_OPTIONS if k in extra}
        return cls(url=url, salt=salt, backend_options=options, store=store, skip_existing=skip,
                   interface_v1=bool(v1))
