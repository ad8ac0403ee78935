"""pytest plugin loaded by bench/run.py (``-p bench._progress``): progress events of a suite.

run.py captures a suite's output to summarise it, so without these a long suite
is silent for minutes.  One line per event (``collected N``, ``start NODEID``,
``finish NODEID``) goes to the pipe whose descriptor run.py passes in
``STREAMMEM_PROGRESS_FD``, apart from pytest's own output and its capture, so
the lines arrive while a case runs; run.py turns them into ``[bench]`` progress
lines and heartbeats.  Without the variable the plugin does nothing.
"""
from __future__ import annotations

import os

_fd = os.environ.get("STREAMMEM_PROGRESS_FD")
_out = os.fdopen(int(_fd), "w", buffering=1) if _fd else None


def _emit(*fields) -> None:
    if _out is not None:
        _out.write(" ".join(map(str, fields)) + "\n")
        _out.flush()


def pytest_collection_finish(session) -> None:
    _emit("collected", len(session.items))


def pytest_runtest_logstart(nodeid, location) -> None:
    _emit("start", nodeid)


def pytest_runtest_logfinish(nodeid, location) -> None:
    _emit("finish", nodeid)
