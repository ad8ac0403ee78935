"""``streammem backends``: which kernel backends can run here, per op, and why not."""
from __future__ import annotations

import json

from .command import Subcommand

__all__ = ["COMMAND"]


def add_arguments(parser) -> None:
    """``streammem backends`` has only the options of every subcommand (``--json``: the report as JSON)."""


def run(args) -> int:
    from streammem_kernels import backend_report

    report = backend_report()
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0


COMMAND = Subcommand("backends", help="list which kernel backends can run here, per op, and why not",
                     add_arguments=add_arguments, run=run)
