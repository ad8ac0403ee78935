"""The flag tables of ``docs/cli.md``, rendered from the ``streammem`` argparse parsers.

``docs/cli.md`` holds, per subcommand, a block between ``<!-- flags:NAME -->`` and ``<!-- end flags:NAME -->``
that is exactly :func:`render_flags` of that subcommand's parser; ``tests/cli/test_cli_docs.py`` fails when
they differ, so the page cannot drift from the parser.  After changing an option, rewrite the blocks with::

    python -m tests.support.cli_docs
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from streammem.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
TOP = "streammem"  # the block of the top-level parser's own options (--version)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def parsers() -> dict[str, argparse.ArgumentParser]:
    """``{"streammem": the top-level parser, "run": run's parser, ...}`` in ``streammem --help``'s order."""
    parser = build_parser()
    return {TOP: parser, **_subparsers(parser).choices}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest.upper()
        return f"`{name}`" + (" (optional)" if action.nargs in ("?", "*") else "")
    takes_value = action.nargs != 0
    choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
    metavar = action.metavar or choices or action.dest.upper()
    return ", ".join(f"`{o} {metavar}`" if takes_value else f"`{o}`" for o in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.default == []:
        return ""
    return f"`{action.default}`"


def render_flags(parser: argparse.ArgumentParser) -> str:
    """A markdown table of every argument of ``parser``: flag (with its metavar), default, help."""
    rows = ["| argument | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        rows.append(f"| {_flag(action)} | {_default(action)} | {_cell(action.help or '')} |")
    return "\n".join(rows)


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- flags:{re.escape(name)} -->)\n(.*?)\n?(<!-- end flags:{re.escape(name)} -->)", re.S)


def documented(text: str, name: str) -> str | None:
    """The flag block of ``name`` in the page ``text``, or None when the page has none."""
    match = _block(name).search(text)
    return match[2] if match else None


def rewrite(text: str) -> str:
    """``text`` with every subcommand's flag block rendered anew (a missing block is left for a person to place)."""
    for name, parser in parsers().items():
        text = _block(name).sub(lambda m, p=parser: f"{m[1]}\n{render_flags(p)}\n{m[3]}", text)
    return text


if __name__ == "__main__":
    DOC.write_text(rewrite(DOC.read_text()))
    print(f"rewrote the flag blocks of {DOC}", file=sys.stderr)
