"""``streammem``: the command line, one module per subcommand.

Each module of this package (``run``, ``backends``, ``videoagent``,
``memverse``, ``prostream``) declares its subcommand as one ``COMMAND =
Subcommand(...)`` (``cli.command``): name, help, description, the function
that adds its options and the one that runs it.  A new subcommand is a new
module and one more entry in :data:`SUBCOMMANDS`.  :func:`main` parses, runs
the subcommand's handler and turns ``OSError`` / ``ValueError`` /
``MissingExtraError`` into a one-line error and exit code 2.

The CLI is the top layer: nothing in ``streammem`` imports it (or its HTML
report, ``cli.report``).
"""
from __future__ import annotations

import argparse
import sys

from streammem_kernels.extras import MissingExtraError

from . import backends, memverse, prostream, run, videoagent
from .command import HelpFormatter, Subcommand

__all__ = ["main", "build_parser", "SUBCOMMANDS", "Subcommand"]

# In the order `streammem --help` lists them.
SUBCOMMANDS: tuple[Subcommand, ...] = (run.COMMAND, backends.COMMAND, videoagent.COMMAND, memverse.COMMAND,
                                       prostream.COMMAND)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streammem", description="Streaming video memory (StreamChat, StreamRAG, "
                                     "ProStream) on the streammem-kernels ops.", formatter_class=HelpFormatter)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add_to(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (OSError, ValueError, MissingExtraError) as exc:  # OSError: a missing video, an unwritable --report
        print(f"streammem: error: {exc}", file=sys.stderr)
        return 2
