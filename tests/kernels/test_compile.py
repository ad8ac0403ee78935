"""torch.compile(fullgraph=True) on every public function of streammem_kernels, on the first call.

One fresh interpreter runs ``tests/support/compile_check.py`` (nothing of the package imported, loaded or
warmed before the first trace) with torch.compile's default compiler (Inductor) and reports, per
case, the graphs compiled and the comparison with the eager call; the tests here read its report.
The functions that return Python objects must refuse ``fullgraph=True`` naming what to use instead,
and run eagerly without it.
"""
from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import streammem_kernels as sk
from tests.support import compile_check
from tests.support.device_checks import DEVICES

CPU = torch.device("cpu")
CASES = sorted(compile_check.cases(CPU))
REFUSALS = sorted(compile_check.refusals(CPU))
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "compile.md"


def run_check(device: str, *extra: str) -> dict:
    """compile_check's report (case name -> line) from a fresh interpreter, on ``device``."""
    # The package this process imported, not whichever an editable install points at.
    package_root = str(Path(sk.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p))
    command = [sys.executable, "-m", "tests.support.compile_check", "--device", device, *extra]
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {line["name"]: line for line in lines if "name" in line}


@pytest.fixture(scope="module")
def report() -> dict:
    # Motion's resize is called again on another frame size: Inductor once failed to lower it with
    # the symbolic sizes of a recompile.
    return run_check("cpu", "--again", "motion_magnitude")


def test_every_public_function_is_checked():
    """Each public function of the package has a case (one graph) or a refusal (Python objects)."""
    public = {name for name in sk.__all__ if inspect.isfunction(getattr(sk, name))}
    checked = {name.split("[")[0] for name in CASES + REFUSALS}
    assert public - checked == set()
    assert not set(CASES) & set(REFUSALS)


@pytest.mark.parametrize("name", CASES)
def test_public_function_compiles_as_one_graph_on_first_call(report, name):
    line = report[name]
    assert line["error"] is None, line
    assert line["mismatch"] is None, line
    assert (line["graphs"], line["breaks"]) == (1, 0), line


def test_compiled_motion_resize_recompiles_for_another_frame_size(report):
    line = report["motion_magnitude"]
    assert line["graphs_again"] == 1 and line["error"] is None and line["mismatch"] is None, line


@pytest.mark.parametrize("name", REFUSALS)
def test_function_returning_python_objects_refuses_fullgraph_and_runs_eagerly_without(report, name):
    line = report[name]
    assert line["error"] is None, line
    assert line["refused"], line
    assert line["mismatch"] is None, line


def test_compiled_tree_search_sees_the_tree_change(report):
    line = report["tree_search[mutated]"]
    assert line["error"] is None and line["mismatch"] is None, line


def test_value_checks_in_the_graph_still_refuse_bad_values(report):
    line = report["cosine_topk[bad ranges]"]
    assert line["error"] is None, line


def test_hand_set_marks_are_the_ones_torch_sets():
    """``trace_constant`` and ``eager_only`` set Dynamo's marks by hand (torch's decorators import
    torch._dynamo, seconds at the package's import): they must stay the ones torch's decorators set."""
    from streammem_kernels.runtime.dispatch import eager_only, trace_constant

    assert vars(torch.compiler.assume_constant_result(lambda: 0)) == vars(trace_constant(lambda: 0))
    disabled = vars(torch.compiler.disable(lambda: 0, recursive=False, reason="why"))
    marker = vars(eager_only("why"))
    assert marker and all(disabled[key] == value for key, value in marker.items())


def test_eager_only_is_a_no_op_outside_torch_compile():
    from streammem_kernels.runtime.dispatch import eager_only

    assert eager_only("why")() is None


def test_every_custom_op_is_documented_with_its_schema():
    """docs/compile.md lists every ``torch.ops.streammem`` op, each with its exact schema."""
    text = DOC.read_text()
    ops = sorted(name for name in dir(torch.ops.streammem) if hasattr(getattr(torch.ops.streammem, name), "default"))
    assert ops
    for name in ops:
        overload = getattr(torch.ops.streammem, name).default
        schema = str(overload._schema).removeprefix("streammem::")
        assert schema in text, f"docs/compile.md lacks `{schema}`"
    documented = set(re.findall(r"^\| `(\w+)\(", text, flags=re.MULTILINE))
    assert documented == set(ops)


def test_trace_time_reads_reach_the_right_object_by_handle():
    """The trace reads a tree's snapshot and a graph's max degree by a string handle (torch 2.11's
    Dynamo passes such reads constants only): copies and unpickled objects get their own handle, and a
    function compiled on one tree, called with another, searches the other."""
    import copy
    import pickle

    from tests.support.compile_check import _graph, _tree

    tree, graph = _tree(CPU), _graph(CPU)
    for obj in (tree, graph):
        twins = (copy.copy(obj), copy.deepcopy(obj), pickle.loads(pickle.dumps(obj)))
        assert len({obj._handle, *(t._handle for t in twins)}) == 4
    other = _tree(CPU)
    other.add_leaves(torch.randn(5, 8, generator=torch.Generator().manual_seed(9)))
    other.grow(4)
    queries = torch.randn(3, 8, generator=torch.Generator().manual_seed(4))
    compiled = torch.compile(lambda t, q: sk.tree_search(t, q, beam=2, k=3), fullgraph=True)
    for t in (tree, other, tree):
        got, want = compiled(t, queries), sk.tree_search(t, queries, beam=2, k=3)
        assert torch.equal(got.ids, want.ids) and torch.equal(got.scores, want.scores)


@pytest.mark.parametrize("device", DEVICES[1:])
def test_every_case_compiles_and_matches_eager_on_cuda(device):
    """The whole check on CUDA tensors (compiled Triton and the CUDA backends): every case one graph
    equal to its eager call, every refusal refusing, the bad value refused (a device-side assertion)."""
    if not torch.cuda.is_available():
        raise RuntimeError("STREAMMEM_REQUIRE_GPU=1 but torch.cuda.is_available() is False")
    lines = run_check(device)
    assert set(CASES) | set(REFUSALS) <= set(lines)
    bad = [line for line in lines.values() if line["error"] is not None or line["mismatch"] is not None
           or (line.get("kind") is None and (line["graphs"], line["breaks"]) != (1, 0))
           or (line.get("kind") == "refusal" and not line["refused"])]
    assert not bad, bad
