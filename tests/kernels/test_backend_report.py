"""Visible backends: the one-time warning when ``auto`` falls back to the torch
reference because a native module is missing, and ``backend_report()``."""
import json
import re
import sys
import warnings

import pytest
import torch

import streammem_kernels as sk
from tests.support.device_checks import cpu_backends
from streammem_kernels import backends as _backends
from streammem_kernels.runtime import dispatch as _dispatch
from streammem_kernels.runtime.dispatch import BackendFallbackWarning, Op, load_native
from streammem_kernels.motion import LK_FLOW

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _fresh_warning_state():
    _dispatch._FALLBACK_WARNED.clear()
    yield
    _dispatch._FALLBACK_WARNED.clear()


@pytest.fixture()
def no_cpp_motion(monkeypatch):
    """The C++ motion module as a user without a compiler has it: not importable."""
    monkeypatch.setitem(sys.modules, "streammem_kernels._cpu_motion", None)
    load_native.cache_clear()
    yield
    monkeypatch.undo()
    load_native.cache_clear()


def _fallback_warnings(record):
    return [w for w in record if issubclass(w.category, BackendFallbackWarning)]


def test_auto_falls_back_with_one_warning_per_op_and_device(no_cpp_motion):
    frames = torch.rand(4, 20, 24, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")  # our own once-per-op bookkeeping must hold even then
        first = sk.motion_magnitude(frames)
        second = sk.motion_magnitude(frames)
        sk.select_frames(frames, threshold=0.1)
    caught = _fallback_warnings(record)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "motion on cpu tensors runs on the torch reference" in message
    assert "streammem_kernels._cpu_motion" in message and "STREAMMEM_BACKEND=torch" in message
    # the fallback is the reference itself, bit for bit
    ref = sk.motion_magnitude(frames, backend="torch")
    for a, b, c in zip(first, second, ref):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_no_warning_when_the_reference_is_chosen_on_purpose(no_cpp_motion, monkeypatch):
    frames = torch.rand(3, 12, 12)
    torch_only = Op("motion", {"torch": lambda x: x})  # the reference is the only candidate
    dtype_limited = Op("kmeans", {"torch": lambda x: x, "cpp": lambda x: x},  # built module, unsupported input
                       extra_reasons={"cpp": lambda device, **_: ["float64 is not supported"]})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        sk.motion_magnitude(frames, backend="torch")
        monkeypatch.setenv("STREAMMEM_BACKEND", "torch")
        sk.motion_magnitude(frames)
        monkeypatch.delenv("STREAMMEM_BACKEND")
        assert torch_only.select("auto", CPU) == "torch"
        if load_native("cpu", "kmeans")[0] is not None:
            assert dtype_limited.select("auto", CPU) == "torch"
    assert _fallback_warnings(record) == []


def test_report_agrees_with_dispatch():
    report = sk.backend_report()
    assert list(report.functions) == list(_backends.op_families())
    assert "motion_magnitude" in report.functions["motion"] and "tree_search" in report.functions["tree"]
    for op in _backends.op_families():
        assert "torch" in report.available(op, "cpu")
        for table in _backends._op_tables(op):
            assert report.auto(op, "cpu") == table.select("auto", CPU)
            assert set(table.available(CPU)) & {"torch", "cpp"} <= set(report.available(op, "cpu"))
    assert report.available("motion", "cpu") == cpu_backends(LK_FLOW)
    # statuses name only backends an op has on a device that can take them
    assert all(s.backend in _backends.DEVICE_BACKENDS[s.device] for s in report.statuses)
    assert not any(s.op == "kmeans" and s.backend == "cuda" for s in report.statuses)
    # every unavailable backend says why; available ones carry no reason
    assert all(bool(s.reasons) != s.available for s in report.statuses)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report on a machine without a GPU")
def test_report_without_gpu_says_so_for_every_cuda_backend():
    report = sk.backend_report()
    cuda_rows = [s for s in report.statuses if s.device == "cuda"]
    assert cuda_rows and all(not s.available and "no CUDA device is available" in s.reasons for s in cuda_rows)
    assert report.auto("motion", "cuda") is None
    motion_cuda = next(s for s in cuda_rows if s.op == "motion" and s.backend == "cuda")
    if load_native("cuda", "motion")[0] is None:
        assert any("_cuda_motion" in r for r in motion_cuda.reasons)


def test_report_shows_a_missing_module_and_the_override(no_cpp_motion, monkeypatch):
    report = sk.backend_report()
    cpp = next(s for s in report.statuses if (s.op, s.device, s.backend) == ("motion", "cpu", "cpp"))
    assert not cpp.available and any("streammem_kernels._cpu_motion" in r for r in cpp.reasons)
    assert report.auto("motion", "cpu") == "torch"
    text = str(report)
    assert re.search(r"motion \(MotionResult, motion_magnitude, select_frames[^)]*\)", text)
    assert "cpu   auto -> torch" in text and "cpp   : native module streammem_kernels._cpu_motion" in text
    monkeypatch.setenv("STREAMMEM_BACKEND", "cpp")  # dispatch would raise: report no auto choice
    overridden = sk.backend_report()
    assert overridden.auto("motion", "cpu") is None and overridden.environment["STREAMMEM_BACKEND"] == "cpp"
    monkeypatch.setenv("STREAMMEM_BACKEND", "torch")
    assert all(sk.backend_report().auto(op, "cpu") == "torch" for op in _backends.op_families())


def test_report_to_dict_is_json_and_complete():
    report = sk.backend_report()
    doc = json.loads(json.dumps(report.to_dict()))
    assert set(doc["environment"]) >= {"torch", "cuda", "TRITON_INTERPRET", "STREAMMEM_BACKEND"}
    motion_cpu = doc["ops"]["motion"]["devices"]["cpu"]
    assert motion_cpu["auto"] == report.auto("motion", "cpu")
    assert [b for b, v in motion_cpu["backends"].items() if v["available"]] == report.available("motion", "cpu")


def test_cli_backends_command(capsys):
    from streammem.cli import main

    assert main(["backends", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == sk.backend_report().to_dict()
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("streammem-kernels ") and f"auto -> {sk.backend_report().auto('kmeans')}" in out
