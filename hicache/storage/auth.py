"""Authenticated L3 objects: the deployment key and the keyed MAC over header and payload.

Why. The header binds key and layout and the checksum catches corruption, but both are
computed from public data: anyone who can write to the store (another application on the
same Redis, a misconfigured neighbour) can put a well-formed object with the right header
and checksum under a real key, and every engine would load those bytes into its KV cache.
A MAC under a key only the fleet holds makes such an object a counted miss.

Opt-in, one setting (``L3Config.auth_key``, YAML ``storage_auth_key``): where the key is,
``env:NAME`` (an environment variable) or ``file:/abs/path`` -- never the key itself, so the
key is not in a URL, a config file's values, ``repr()``, ``--json`` output or an error. The
source holds one or more keys separated by white space (each at least 32 characters, e.g.
``openssl rand -hex 32``): the first signs what this process writes, every one is accepted
on reads, so a fleet rotates by putting the new key first everywhere, then dropping the old
one once the store has turned over.

MAC: HMAC-SHA256 (``hmac`` + ``hashlib``, the standard library), picked by measured cost:
on this machine's CPU (SHA extensions) it ran at 0.27 GiB/s against 0.18 GiB/s for keyed
BLAKE2b (1 MiB objects, loaded 2-core box; ``docs/storage.md`` has the ``bench storage``
figures). An authenticated object's header is 96 bytes: the 64-byte header with format
version 2 and header length 96, then the 32-byte MAC of those 64 bytes and the payload.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Sequence

from hicache.errors import ConfigError

MAC_BYTES = 32
MIN_KEY_CHARS = 32
_MAX_SOURCE_BYTES = 64 << 10   # a key file is a few lines; refuse to read a large file
FIELD = "storage_auth_key"


def check_source(source: object, field: str = FIELD) -> str:
    """``env:NAME`` or ``file:/abs/path``, checked without reading it."""
    if not isinstance(source, str) or not (
            (source.startswith("env:") and len(source) > 4) or source.startswith("file:/")):
        # Show at most a short scheme-like prefix: the value may be a key pasted by mistake.
        head = source.partition(":")[0] if isinstance(source, str) and ":" in source else ""
        shown = f"{head}:..." if head.isalnum() and len(head) <= 8 else "..."
        raise ConfigError(field, shown, "must name where the key is: env:VARIABLE or file:/absolute/path "
                          "(never the key itself)")
    return source


class ObjectKeys:
    """The accepted MAC keys; the first signs writes. Never shown: ``repr()`` says how many."""

    __slots__ = ("_keys", "_by_id", "source")

    def __init__(self, keys: Sequence[bytes], source: str = ""):
        if not keys:
            raise ConfigError(FIELD, source or "...", "holds no key")
        self._keys = tuple(bytes(k) for k in keys)
        self._by_id = {key_id(k): k for k in reversed(self._keys)}
        self.source = source

    @classmethod
    def load(cls, source: str, field: str = FIELD) -> "ObjectKeys":
        """Read the keys from ``env:NAME`` or ``file:/path`` (errors name the source, not a key)."""
        check_source(source, field)
        if source.startswith("env:"):
            text = os.environ.get(source[4:])
            if text is None:
                raise ConfigError(field, source, "the environment variable is not set")
        else:
            path = source[5:]
            try:
                with open(path, "rb") as f:
                    raw = f.read(_MAX_SOURCE_BYTES + 1)
            except OSError as exc:
                raise ConfigError(field, source, f"cannot read the key file: {exc.strerror}") from None
            if len(raw) > _MAX_SOURCE_BYTES:
                raise ConfigError(field, source, f"a key file is at most {_MAX_SOURCE_BYTES} bytes")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise ConfigError(field, source, "the key file is not text") from None
        keys = text.split()
        if not keys:
            raise ConfigError(field, source, "holds no key")
        for i, k in enumerate(keys):
            if len(k) < MIN_KEY_CHARS:
                raise ConfigError(field, source, f"key {i + 1} is shorter than {MIN_KEY_CHARS} characters")
        return cls([k.encode() for k in keys], source)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"ObjectKeys({len(self._keys)} key(s) from {self.source or 'code'})"

    __str__ = __repr__

    def __reduce__(self) -> tuple:   # never pickled into a worker or a log with the keys
        raise TypeError("ObjectKeys are not picklable")

    @property
    def write_id(self) -> int:
        """The id of the key that signs writes (stored in the header's reserved field)."""
        return key_id(self._keys[0])

    def sign(self, head: bytes | memoryview, payload: Sequence[memoryview]) -> bytes:
        """The MAC of ``head`` (the first 64 header bytes, ``write_id`` in them) and the
        payload, under the first key."""
        return _mac(self._keys[0], head, payload)

    def verify(self, kid: int, head: bytes | memoryview, payload: Sequence[memoryview],
               mac: bytes | memoryview) -> bool:
        """True when the accepted key with id ``kid`` made ``mac`` (constant-time compare).
        The id picks the key, so a value costs one MAC whatever the number of keys, and a
        value naming no accepted key costs none."""
        key = self._by_id.get(kid)
        if key is None or len(mac) != MAC_BYTES:
            return False
        return hmac.compare_digest(_mac(key, head, payload), bytes(mac))


def key_id(key: bytes) -> int:
    """32 bits naming a key (not secret: a hash of it, which reveals nothing usable)."""
    return int.from_bytes(hashlib.sha256(b"hicache-l3-key-id\0" + key).digest()[:4], "little")


def _mac(key: bytes, head: bytes | memoryview, payload: Sequence[memoryview]) -> bytes:
    h = hmac.new(key, head, hashlib.sha256)
    for piece in payload:
        h.update(piece)
    return h.digest()
