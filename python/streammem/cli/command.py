"""How a ``streammem`` subcommand declares itself: one :class:`Subcommand` per module of ``cli``."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable

__all__ = ["Subcommand", "HelpFormatter"]

HelpFormatter = argparse.RawDescriptionHelpFormatter  # keeps the descriptions' and tables' own lines


@dataclass(frozen=True)
class Subcommand:
    """One ``streammem NAME``: its one-line ``help``, the ``description`` (and ``epilog``) around its
    options, ``add_arguments(parser)`` that adds the options, and ``run(args) -> exit code``.

    ``run`` may raise ``OSError``, ``ValueError`` or ``MissingExtraError`` for bad input: ``main``
    prints it as one line and exits with code 2.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    epilog: str | None = None

    def add_to(self, subparsers) -> argparse.ArgumentParser:
        """Add this subcommand's parser to ``subparsers``; the parsed arguments carry ``handler=run``."""
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description, epilog=self.epilog,
                                       formatter_class=HelpFormatter)
        self.add_arguments(parser)
        parser.set_defaults(handler=self.run)
        return parser
