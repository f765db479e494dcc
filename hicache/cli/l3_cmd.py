"""``hicache l3 stats|scan|purge``: what an L3 store holds, whether it reads back, and removal.

    hicache l3 stats --url URL [--namespace N] [--json]
    hicache l3 scan  --url URL [--namespace N] [--sample K] [--seed S] [--auth-key SRC] [--json]
    hicache l3 purge --url URL --namespace N [--yes] [--json]

They work from the keys alone (``SCAN`` on Redis, on every primary of a cluster; a
directory walk for ``file://``), so they need no config. ``scan`` exits 1 when a sampled
object fails its check. The URL is only ever printed masked.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from hicache.cli.table import render_table
from hicache.errors import ConfigError
from hicache.storage import ObjectKeys, mask_url, open_backend
from hicache.storage import MAC_UNCHECKED, check_namespace, purge, survey, verify
from hicache.units import format_bytes


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("l3", help="inspect, verify or purge an L3 store",
                       description="Operator tools for an L3 store: objects and bytes per namespace "
                                   "and layout, a checked sample, and purging one namespace.")
    ops = p.add_subparsers(dest="l3_command", metavar="OP")
    ops.required = True
    helps = {"stats": "objects, bytes and layouts per namespace",
             "scan": "read back a sample of objects and check headers and checksums",
             "purge": "delete every object of one namespace"}
    for name, help_text in helps.items():
        op = ops.add_parser(name, help=help_text, description=help_text)
        op.add_argument("--url", required=True, help="storage URL (file://, redis://, redis+cluster://, ...)")
        op.add_argument("--namespace", required=(name == "purge"),
                        help="one namespace, hc1.FINGERPRINT.SALT8" + (" (required)" if name == "purge" else ""))
        if name == "scan":
            op.add_argument("--sample", type=int, default=32, help="objects to read back (default 32)")
            op.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
            op.add_argument("--auth-key", default=None, metavar="SRC",
                            help="verify MACs too: where the deployment keys are, env:NAME or file:/path "
                                 "(the storage_auth_key setting; never the key itself)")
        if name == "purge":
            op.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        op.add_argument("--json", action="store_true", help="print one JSON object")
        op.add_argument("--quiet", action="store_true", help="no progress lines")
        op.set_defaults(func=run)


class _Counting:
    """Progress for a scan of unknown length: a line on stderr at most every 2 s."""

    def __init__(self, label: str, enabled: bool):
        self.label, self.enabled = label, enabled
        self._t0 = self._last = time.monotonic()

    def __call__(self, n: int) -> None:
        now = time.monotonic()
        if self.enabled and now - self._last >= 2.0:
            self._last = now
            print(f"{self.label}: {n:,} keys ({now - self._t0:.0f}s)", file=sys.stderr, flush=True)


def _shown(url: str) -> str:
    """The URL as it may be printed: the password masked, even in a malformed URL."""
    return mask_url(url) if "://" in url else re.sub(r"^[^@]*@", "***@", url)


def open_for_ops(url: str):
    """Open ``url`` for inspection; a ``file://`` directory must already exist."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError("--url", _shown(str(url)), "must be a storage URL such as redis://host:6379/0")
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "file":
        path = Path(rest.partition("?")[0])
        if not path.is_dir():
            raise ConfigError("--url", _shown(url), "no such directory")
    try:
        return open_backend(url)
    except ConfigError as exc:   # name the flag; the value stays masked
        raise ConfigError("--url", _shown(url), exc.reason) from None


def run(args: argparse.Namespace) -> int:
    namespace = check_namespace(args.namespace)
    backend = open_for_ops(args.url)
    shown = mask_url(args.url)
    progress = _Counting(f"l3 {args.l3_command}", not args.quiet and not args.json)
    try:
        if args.l3_command == "stats":
            return _stats(args, backend, namespace, shown, progress)
        if args.l3_command == "scan":
            return _scan(args, backend, namespace, shown, progress)
        return _purge(args, backend, namespace, shown, progress)
    finally:
        backend.close()


def _stats(args, backend, namespace, shown, progress) -> int:
    result = survey(backend, namespace, progress=progress)
    out = {"url": shown, "namespace": namespace, **result.to_dict()}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(render_table(["namespace", "fingerprint", "pages", "states", "bytes"],
                       [[n.namespace, n.fingerprint, n.pages, n.states, format_bytes(n.bytes)]
                        for n in result.namespaces],
                       align="llrrr", title=f"hicache l3 stats: {shown}"))
    print()
    print(render_table(["layout fingerprint", "namespaces", "objects", "bytes"],
                       [[d["fingerprint"], d["namespaces"], d["objects"], format_bytes(d["bytes"])]
                        for d in result.layouts()], align="lrrr"))
    print(f"\n{out['objects']:,} objects, {format_bytes(out['bytes'])}; "
          f"{result.unparsed_keys:,} other keys under the hc1. prefix")
    return 0


def _scan(args, backend, namespace, shown, progress) -> int:
    keys = ObjectKeys.load(args.auth_key, "--auth-key") if args.auth_key is not None else None
    report = verify(backend, namespace, sample=args.sample, seed=args.seed, progress=progress, keys=keys)
    out = {"url": shown, "namespace": namespace, **report.to_dict()}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(render_table(["verdict", "objects"], sorted(report.verdicts.items()),
                          title=f"hicache l3 scan: {shown}: {report.sampled} of "
                                f"{report.scanned_keys:,} objects read back"))
        for key, verdict in report.failures:
            print(f"  {verdict}: {key}")
        unchecked = report.verdicts.get(MAC_UNCHECKED, 0)
        if unchecked:
            print(f"{unchecked} authenticated objects not checked: pass --auth-key to verify their MACs")
        print("all sampled objects check out" if report.ok else "some sampled objects FAILED their check")
    return 0 if report.ok else 1


def _purge(args, backend, namespace, shown, progress) -> int:
    found = survey(backend, namespace, progress=progress)
    objects = sum(n.objects for n in found.namespaces)
    if objects and not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("--yes", False, f"purging {objects} objects needs --yes when stdin is not a terminal")
        answer = input(f"delete {objects:,} objects ({format_bytes(sum(n.bytes for n in found.namespaces))}) "
                       f"of {namespace} from {shown}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted", file=sys.stderr)
            return 1
    removed = purge(backend, namespace, progress=progress) if objects else 0
    out = {"url": shown, "namespace": namespace, "found": objects, "removed": removed}
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"hicache l3 purge: {shown}: removed {removed:,} of {objects:,} objects of {namespace}")
    return 0
