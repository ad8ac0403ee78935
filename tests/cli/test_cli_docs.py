"""docs/cli.md lists every subcommand and every flag, exactly as the argparse parsers declare them.

The flag tables are rendered from the parsers (``tests.support.cli_docs``); after changing an option,
``python -m tests.support.cli_docs`` rewrites them."""
from __future__ import annotations

import argparse

from tests.support.cli_docs import DOC, documented, parsers, render_flags, rewrite


def test_every_subcommand_has_its_flag_table_in_docs_cli():
    text = DOC.read_text()
    missing = [name for name in parsers() if documented(text, name) is None]
    assert not missing, f"docs/cli.md has no flag block for {missing}"


def test_the_flag_tables_are_the_parsers():
    text = DOC.read_text()
    stale = [name for name, parser in parsers().items() if documented(text, name) != render_flags(parser)]
    assert not stale, (f"docs/cli.md's flags of {stale} differ from the parsers: run "
                       "`python -m tests.support.cli_docs` to rewrite them")
    assert rewrite(text) == text


def test_every_option_string_is_on_the_page():
    text = DOC.read_text()
    for name, parser in parsers().items():
        block = documented(text, name)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in block, f"streammem {name} {option} is not in docs/cli.md"
