"""The ``hicache`` command line: one subcommand per job, each with ``--json``."""

from __future__ import annotations

import argparse
import sys

from hicache.errors import HiCacheError


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit status 2, like every
    other bad input (argparse's default adds the whole usage text)."""

    def __init__(self, *args, **kwargs):
        # No abbreviated flags: ``--requests 200`` silently meant ``--requests-out 200`` and
        # wrote a request dump named 200 (twice into the repository's root). Every parser
        # built below, subcommands included, is of this class.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from hicache.cli import bench_cmd, fleet_cmd, l3_cmd, layout_cmd, ref_cmd, replay_cmd, stress_cmd, sweep_cmd

    parser = OneLineParser(
        prog="hicache", description="Hierarchical KV cache for hybrid-attention serving engines.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (replay_cmd, sweep_cmd, fleet_cmd, ref_cmd, layout_cmd, stress_cmd, bench_cmd, l3_cmd):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except HiCacheError as exc:
        print(f"hicache {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hicache {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
