"""What an L3 store holds, whether its objects check out, and removing one namespace.

For operators (``hicache l3 stats|scan|purge``), never on the serving path. Everything
works from the keys alone, through the backend's ``scan`` (``SCAN`` on Redis, on every
primary of a cluster; a directory walk for ``file://``), so it needs no layout or config:

* a key ``hc1.{fingerprint}.{salt8}:{p|s}:{hash}`` names its namespace, its layout
  fingerprint, its kind and its page hash (:func:`hicache.storage.objects.parse_key`);
* a value's header repeats all of it (namespace digest, fingerprint, kind, key digest,
  payload length and checksum), so a sampled object can be checked exactly as a read in
  the cache would check it, without knowing the salt.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from hicache.errors import ConfigError
from hicache.storage.backend import StorageBackend
from hicache.storage.auth import ObjectKeys
from hicache.storage.objects import (AUTH_VERSION, HEADER, HEADER_BYTES, KEY_PREFIX, MAGIC, KeyInfo, ObjectCodec, ObjectKind,
                                     parse_key)

_NAMESPACE_RE = re.compile(r"^hc1\.[A-Za-z0-9_-]{1,64}\.[0-9a-f]{8}$")
OK = "ok"
MISSING = "missing"       # listed by the scan, gone before it was read (evicted, purged)
NOT_A_VALUE = "not_a_value"   # a Redis key of another type under our prefix
UNPARSED = "unparsed_key"     # under our prefix but not a key this format writes
MAC_UNCHECKED = "mac_not_checked"   # an authenticated object read without the key: not judged

Progress = Callable[[int], None]


def check_namespace(namespace: Optional[str]) -> Optional[str]:
    """``namespace`` if it looks like ``hc1.FINGERPRINT.SALT8``; ConfigError otherwise."""
    if namespace is not None and not _NAMESPACE_RE.match(namespace):
        raise ConfigError("--namespace", namespace, "must look like hc1.FINGERPRINT.SALT8 "
                                                    "(see `hicache l3 stats` for the ones stored)")
    return namespace


def _prefix(namespace: Optional[str]) -> str:
    return f"{namespace}:" if namespace else f"{KEY_PREFIX}."


def _scan(backend: StorageBackend, namespace: Optional[str], batch: int,
          progress: Optional[Progress]) -> Iterator[tuple[str, Optional[int]]]:
    seen = 0
    for chunk in backend.scan(_prefix(namespace), batch):
        yield from chunk
        seen += len(chunk)
        if progress is not None:
            progress(seen)


# -- stats ------------------------------------------------------------------------------
@dataclass
class NamespaceSummary:
    """Objects of one namespace (one layout fingerprint + salt)."""

    namespace: str
    fingerprint: str
    salt8: str
    pages: int = 0
    states: int = 0
    bytes: int = 0

    @property
    def objects(self) -> int:
        return self.pages + self.states

    def to_dict(self) -> dict:
        return {"namespace": self.namespace, "fingerprint": self.fingerprint, "salt8": self.salt8,
                "objects": self.objects, "pages": self.pages, "states": self.states, "bytes": self.bytes}


@dataclass(frozen=True)
class Survey:
    """What :func:`survey` found: per namespace, and keys under our prefix it could not place."""

    namespaces: list[NamespaceSummary]
    unparsed_keys: int
    scanned_keys: int

    def layouts(self) -> list[dict]:
        """Totals per layout fingerprint (one layout may be stored under several salts)."""
        by_fp: dict[str, dict] = {}
        for ns in self.namespaces:
            d = by_fp.setdefault(ns.fingerprint, {"fingerprint": ns.fingerprint, "namespaces": 0,
                                                  "objects": 0, "bytes": 0})
            d["namespaces"] += 1
            d["objects"] += ns.objects
            d["bytes"] += ns.bytes
        return sorted(by_fp.values(), key=lambda d: d["fingerprint"])

    def to_dict(self) -> dict:
        return {"namespaces": [n.to_dict() for n in self.namespaces], "layouts": self.layouts(),
                "objects": sum(n.objects for n in self.namespaces),
                "bytes": sum(n.bytes for n in self.namespaces),
                "unparsed_keys": self.unparsed_keys, "scanned_keys": self.scanned_keys}


def survey(backend: StorageBackend, namespace: Optional[str] = None, *, batch: int = 1000,
           progress: Optional[Progress] = None) -> Survey:
    """Count objects and bytes per namespace (all of ours, or just ``namespace``).

    ``bytes`` are stored value lengths (header included). Objects written or evicted while
    the scan runs may or may not be counted.
    """
    check_namespace(namespace)
    found: dict[str, NamespaceSummary] = {}
    unparsed = scanned = 0
    for key, length in _scan(backend, namespace, batch, progress):
        scanned += 1
        info = parse_key(key)
        if info is None:
            unparsed += 1
            continue
        ns = found.get(info.namespace)
        if ns is None:
            ns = found[info.namespace] = NamespaceSummary(info.namespace, info.fingerprint, info.salt8)
        if info.kind is ObjectKind.PAGE:
            ns.pages += 1
        else:
            ns.states += 1
        ns.bytes += length or 0
    return Survey(sorted(found.values(), key=lambda n: n.namespace), unparsed, scanned)


# -- scan (verify a sample) -------------------------------------------------------------
@dataclass(frozen=True)
class VerifyReport:
    """A sample of objects read back and checked: verdict counts and the failing keys."""

    scanned_keys: int
    sampled: int
    verdicts: dict[str, int]
    failures: list[tuple[str, str]] = field(default_factory=list)   # (key, verdict), first 20

    @property
    def ok(self) -> bool:
        return all(v in (OK, MISSING, MAC_UNCHECKED) for v in self.verdicts)

    def to_dict(self) -> dict:
        return {"scanned_keys": self.scanned_keys, "sampled": self.sampled, "verdicts": dict(self.verdicts),
                "failures": [{"key": k, "verdict": v} for k, v in self.failures], "ok": self.ok}


def check_object(info: KeyInfo, value: memoryview, codec: ObjectCodec) -> str:
    """The verdict on one stored value: ``ok`` or a :class:`~hicache.storage.objects.Reject`
    reason, exactly as a read into the cache would judge it."""
    n = value.nbytes
    hb = codec.header_bytes
    announced = HEADER.unpack_from(value)[9] if n >= HEADER_BYTES and bytes(value[:4]) == MAGIC else 0
    reason, token = codec.check_header(value[:hb], info.hash_hex, info.kind, n, announced)
    if reason is not None:
        return reason.value
    bad = codec.check_payload([value[hb:]], token, value[:hb])
    return OK if bad is None else bad.value


def verify(backend: StorageBackend, namespace: Optional[str] = None, *, sample: int = 32, seed: int = 0,
           batch: int = 1000, progress: Optional[Progress] = None, keys: Optional[ObjectKeys] = None
           ) -> VerifyReport:
    """Read back a uniform sample of ``sample`` objects (reservoir sampling over one scan)
    and check each header and payload checksum; with ``keys``, the MAC too (an object
    without one, or made with no accepted key, is ``unauthenticated``)."""
    if sample < 1:
        raise ConfigError("--sample", sample, "must be >= 1")
    check_namespace(namespace)
    rng = random.Random(seed)
    picked: list[tuple[str, Optional[int]]] = []
    scanned = 0
    for item in _scan(backend, namespace, batch, progress):
        scanned += 1
        if len(picked) < sample:
            picked.append(item)
        else:
            j = rng.randrange(scanned)
            if j < sample:
                picked[j] = item
    verdicts: Counter[str] = Counter()
    failures: list[tuple[str, str]] = []
    codecs: dict[str, ObjectCodec] = {}
    for key, length in sorted(picked):
        info = parse_key(key)
        if info is None:
            verdict = UNPARSED
        elif length is None:
            verdict = NOT_A_VALUE
        else:
            buf = bytearray(length)
            got = backend.get_into([key], [buf])[0]
            if got is None:
                verdict = MISSING
            else:
                codec = codecs.get(info.namespace) or codecs.setdefault(
                    info.namespace, ObjectCodec.for_namespace(info.namespace, keys))
                # A value rewritten with another length since the scan: judge what is there.
                view = memoryview(buf)[:got] if got <= length else memoryview(_reread(backend, key, got))
                verdict = MAC_UNCHECKED if keys is None and _authenticated(view) else check_object(info, view, codec)
        verdicts[verdict] += 1
        if verdict not in (OK, MISSING) and len(failures) < 20:
            failures.append((key, verdict))
    return VerifyReport(scanned, len(picked), dict(sorted(verdicts.items())), failures)


def _authenticated(value: memoryview) -> bool:
    """An object in the authenticated format (its checks need the deployment key)."""
    return value.nbytes >= HEADER_BYTES and bytes(value[:4]) == MAGIC and HEADER.unpack_from(value)[1] == AUTH_VERSION


def _reread(backend: StorageBackend, key: str, length: int) -> bytearray:
    buf = bytearray(length)
    got = backend.get_into([key], [buf])[0]
    return buf[:got] if got is not None and got <= length else buf


# -- purge ------------------------------------------------------------------------------
def purge(backend: StorageBackend, namespace: str, *, batch: int = 1000,
          progress: Optional[Progress] = None) -> int:
    """Delete every object of ``namespace``; returns how many keys were removed."""
    if not namespace:
        raise ConfigError("--namespace", namespace, "purge needs one namespace")
    check_namespace(namespace)
    removed = 0
    for chunk in backend.scan(_prefix(namespace), batch):
        keys = [k for k, _ in chunk]
        if keys:
            removed += backend.delete(keys)
        if progress is not None:
            progress(removed)
    return removed
