"""``streammem``: the command line, one module per subcommand.

Each module of this package (``run``, ``backends``, ``videoagent``,
``memverse``, ``prostream``) declares its subcommand as one ``COMMAND =
Subcommand(...)`` (``cli.command``): name, help, description, the function
that adds its options and the one that runs it.  A new subcommand is a new
module and one more entry in :data:`SUBCOMMANDS`.

:func:`main` behaves like a Unix tool:

* it parses and checks the arguments before torch is imported (no module of
  this package imports torch at import time), so a mistake costs a fraction
  of a second; a bad option prints the subcommand's own usage and exits 2;
* ``--version`` prints the installed version; ``--json``, ``--no-progress``
  and ``--quiet`` are options of every subcommand (``command.common_options``);
* ``OSError`` / ``ValueError`` / ``MissingExtraError`` from a subcommand
  become one line on stderr and exit code 2;
* Ctrl-C (SIGINT) stops it with exit code 130 and one line, no traceback
  (``run`` first prints what it did so far, and writes its ``--report``).

The CLI is the top layer: nothing in ``streammem`` imports it (or its HTML
report, ``cli.report``).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import warnings

from . import backends, memverse, prostream, run, videoagent
from .command import EXIT_INTERRUPTED, EXIT_USAGE, HelpFormatter, Subcommand, SubcommandParser, common_options

__all__ = ["main", "console_main", "build_parser", "package_version", "SUBCOMMANDS", "Subcommand", "EXIT_USAGE",
           "EXIT_INTERRUPTED"]

# In the order `streammem --help` lists them.
SUBCOMMANDS: tuple[Subcommand, ...] = (run.COMMAND, backends.COMMAND, videoagent.COMMAND, memverse.COMMAND,
                                       prostream.COMMAND)


def package_version() -> str:
    """The installed distribution's version (``streammem-kernels``), else ``streammem.__version__``."""
    from importlib import metadata

    try:
        return metadata.version("streammem-kernels")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from .. import __version__

        return __version__


class _VersionAction(argparse.Action):
    """``--version``: print ``streammem VERSION`` on stdout and exit 0 (the version is looked up only then)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"streammem {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streammem", description="Streaming video memory (StreamChat, StreamRAG, "
                                     "ProStream) on the streammem-kernels ops.", formatter_class=HelpFormatter)
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                       parser_class=SubcommandParser)
    common = common_options()
    for command in SUBCOMMANDS:
        command.add_to(subparsers, common)
    return parser


@contextlib.contextmanager
def _quiet(enabled: bool):
    """With --quiet: Python's stderr (notices, warnings, progress bars) goes nowhere while the subcommand runs."""
    if not enabled:
        yield
        return
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _missing_extra(exc: ImportError) -> bool:
    # MissingExtraError is looked up only once something raised: importing it imports the kernels (torch).
    extras = sys.modules.get("streammem_kernels.extras")
    return extras is not None and isinstance(exc, extras.MissingExtraError)


def main(argv: list[str] | None = None) -> int:
    """Run ``streammem`` with ``argv`` (default: the process's); returns the exit status.

    0 on success; 2 (:data:`EXIT_USAGE`) for bad arguments (argparse exits itself, printing the
    subcommand's usage) and for bad input (one line); 130 (:data:`EXIT_INTERRUPTED`) after Ctrl-C.
    """
    args = build_parser().parse_args(argv)
    if args.quiet:
        args.no_progress = True
    try:
        with _quiet(args.quiet):
            return args.handler(args)
    except KeyboardInterrupt:
        print("streammem: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (OSError, ValueError) as exc:  # OSError: a missing video, an unwritable --report
        print(f"streammem: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:
        if not _missing_extra(exc):
            raise
        print(f"streammem: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def console_main() -> None:
    """The ``streammem`` executable (and ``python -m streammem.cli``): :func:`main`, then exit with its status.

    After Ctrl-C the process ends as soon as the output is flushed, without the interpreter's
    teardown: unloading torch takes one to two seconds on a busy machine, and the user asked to stop.
    """
    code = main()
    if code == EXIT_INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
                pass
        os._exit(code)
    sys.exit(code)
