"""How a ``streammem`` subcommand declares itself (one :class:`Subcommand` per module of ``cli``), the options
every subcommand shares, and the parser each subcommand gets.

Nothing here imports torch (nor does any ``cli`` module at import time): ``streammem`` parses and checks its
arguments first, so a mistyped flag costs a fraction of a second, not the seconds torch takes to load.
"""
from __future__ import annotations

import argparse
import difflib
import os
from dataclasses import dataclass
from typing import Callable

__all__ = ["Subcommand", "SubcommandParser", "HelpFormatter", "common_options", "check_input_file", "COMMON_FLAGS",
           "EXIT_USAGE", "EXIT_INTERRUPTED"]

HelpFormatter = argparse.RawDescriptionHelpFormatter  # keeps the descriptions' and tables' own lines

EXIT_USAGE = 2  # bad arguments or input (argparse's own code for a usage error)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C

# The options of every subcommand (dest names), declared once in common_options().
COMMON_FLAGS = ("json", "no_progress", "quiet")


def common_options() -> argparse.ArgumentParser:
    """The options every subcommand takes, as a parent parser (``argparse``'s ``parents=``).

    ``--json``: the result as JSON on stdout instead of text; ``--no-progress``: no progress bar on
    stderr; ``-q`` / ``--quiet``: nothing on stderr but errors (no progress bar, notices or warnings).
    """
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("options of every subcommand")
    group.add_argument("--json", action="store_true",
                       help="print the result as JSON on stdout instead of text (fields: the description or below)")
    group.add_argument("--no-progress", action="store_true",
                       help="no progress bar on stderr (run shows one while it decodes)")
    group.add_argument("-q", "--quiet", action="store_true",
                       help="print nothing on stderr but errors: no progress bar, notices or warnings")
    return parent


def check_input_file(path, what: str) -> None:
    """``FileNotFoundError`` unless ``path`` (the ``what`` a subcommand reads: "video", "dialogue") is a file.

    Checked with the arguments, before torch loads; what the file holds is checked by its reader.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"{what} file not found: {path}")
    if not os.path.isfile(path):
        raise ValueError(f"{what} is not a file: {path}")


class SubcommandParser(argparse.ArgumentParser):
    """A subcommand's parser: an unknown option or an extra argument is reported with this subcommand's usage
    (``streammem run --reprot`` shows ``run``'s), with the closest option it knows when one is close."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            message = f"unrecognized arguments: {' '.join(extras)}"
            options = [o for o in self._option_string_actions if o.startswith("--")]
            close = [match for extra in extras if extra.startswith("--")
                     for match in difflib.get_close_matches(extra.split("=", 1)[0], options, n=1, cutoff=0.8)]
            if close:
                message += f" (did you mean {' / '.join(dict.fromkeys(close))}?)"
            self.error(message)
        return namespace, extras


@dataclass(frozen=True)
class Subcommand:
    """One ``streammem NAME``: its one-line ``help``, the ``description`` (and ``epilog``) around its
    options, ``add_arguments(parser)`` that adds its own options, and ``run(args) -> exit code``.

    The options of every subcommand (:func:`common_options`: ``--json``, ``--no-progress``,
    ``--quiet``) are added by :meth:`add_to`, not by ``add_arguments``.  ``add_arguments`` and the
    module that holds it import nothing heavy (no torch): ``run`` imports what it needs, after
    checking the arguments it can check without it.  ``run`` may raise ``OSError``, ``ValueError``
    or ``MissingExtraError`` for bad input: ``main`` prints it as one line and exits with code 2;
    Ctrl-C (``KeyboardInterrupt``) ends it with code 130.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    epilog: str | None = None

    def add_to(self, subparsers, common: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
        """Add this subcommand's parser to ``subparsers``, with the ``common`` options (default:
        :func:`common_options`); the parsed arguments carry ``handler=run``."""
        parser = subparsers.add_parser(self.name, help=self.help, description=self.description, epilog=self.epilog,
                                       formatter_class=HelpFormatter,
                                       parents=[common if common is not None else common_options()])
        self.add_arguments(parser)
        parser.set_defaults(handler=self.run)
        return parser
