"""Entry point of `gpustack-dspark`: one argparse parser, one module per subcommand.

A subcommand module exposes `register(subparsers, common)`: it adds its parser (with
`parents=[common]` when it talks to a server) and sets `run=function(args) -> int`.
To add one, write the module and append it to SUBCOMMANDS.
Exit status: 0 ok, 1 failed operation, 2 bad input (argparse's own errors included).
"""

import argparse
import sys
from typing import List, Optional

from gpustack_dspark import __version__
from gpustack_dspark.cli import apply, bench, delete, export, label, status, sweep
from gpustack_dspark.cli.client import CLIError, connection_options

SUBCOMMANDS = [label, apply, export, delete, status, bench, sweep]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpustack-dspark", description="Operate gpustack-dspark on a GPUStack server.")
    parser.add_argument("--version", action="version", version=f"gpustack-dspark {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = connection_options()
    for module in SUBCOMMANDS:
        module.register(subparsers, common)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except CLIError as e:
        print(f"gpustack-dspark {args.command}: error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)  # 2: bad input (cli/errors.py), 1: failed operation


if __name__ == "__main__":
    sys.exit(main())
