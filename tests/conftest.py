"""Shared test configuration.

CPU fallback test mode: ``make test`` sets ``TRITON_INTERPRET=1`` so every Triton
kernel runs through the interpreter on CPU tensors, and
``STREAMMEM_REQUIRE_CPP=1`` so a broken C++ build fails the suite instead of
being skipped.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    from tests.support import interpreter_speedup

    interpreter_speedup.install()  # tl.sum & co. re-patch triton.language on every call otherwise


def pytest_configure(config):
    config.addinivalue_line("markers", "host_sync: a GPU code path checked free of host synchronisation "
                                       "(run on CPU tensors through the Triton interpreter)")


def pytest_collection_modifyitems(config, items):
    """Mark ``gpu`` every case whose ``device`` parameter is CUDA, next to the tests marked by hand.

    ``-m gpu`` is how bench/gpu.sh selects the GPU correctness tests (wherever a test file
    lives): each op's cuda-device cases against the reference and the CUDA-graph captures.
    """
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and _is_cuda(callspec.params.get("device")):
            item.add_marker(pytest.mark.gpu)


def _is_cuda(value) -> bool:
    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


@pytest.fixture(autouse=True)
def _no_backend_override(monkeypatch):
    # Tests choose backends explicitly; a user's STREAMMEM_BACKEND must not leak in.
    monkeypatch.delenv("STREAMMEM_BACKEND", raising=False)


@pytest.fixture()
def one_intra_op_thread():
    """Tiny model batches next to busy threads on two cores: a 2-thread intra-op
    pool mostly waits at barriers (MiniLM on one caption: 50 ms with 1 thread,
    over 1 s with 2 on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def minilm():
    from streammem import MiniLMTextEncoder

    return MiniLMTextEncoder()
