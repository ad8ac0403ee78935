"""Backend selection: auto order, the STREAMMEM_BACKEND override, and errors
that say why a backend cannot run."""
import pytest
import torch

from conftest import cpu_backends
from streammem_kernels import motion_magnitude
from streammem_kernels._dispatch import Op, common_reasons
from streammem_kernels.motion import LK_FLOW

FRAMES = torch.rand(3, 12, 12)


def test_auto_picks_cpp_on_cpu_when_built():
    expected = "cpp" if "cpp" in cpu_backends(LK_FLOW) else "torch"
    assert LK_FLOW.select("auto", torch.device("cpu")) == expected


def test_env_override_applies_to_auto_only(monkeypatch):
    monkeypatch.setenv("STREAMMEM_BACKEND", "torch")
    assert LK_FLOW.select("auto", torch.device("cpu")) == "torch"
    if "cpp" in cpu_backends(LK_FLOW):
        assert LK_FLOW.select("cpp", torch.device("cpu")) == "cpp"  # explicit argument wins


def test_env_override_that_cannot_run_says_why(monkeypatch):
    monkeypatch.setenv("STREAMMEM_BACKEND", "cuda")
    with pytest.raises(RuntimeError, match="STREAMMEM_BACKEND='cuda'.*CUDA tensors"):
        motion_magnitude(FRAMES)
    monkeypatch.setenv("STREAMMEM_BACKEND", "fastest")
    with pytest.raises(ValueError, match="STREAMMEM_BACKEND"):
        motion_magnitude(FRAMES)


def test_unavailable_backend_lists_reasons():
    with pytest.raises(RuntimeError, match="cuda.*cannot run.*CUDA tensors, got device cpu"):
        motion_magnitude(FRAMES, backend="cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        motion_magnitude(FRAMES, backend="gpu")


def test_triton_reason_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reasons = common_reasons("triton", "motion", torch.device("cpu"))
    assert any("TRITON_INTERPRET=1" in r for r in reasons)


def test_missing_native_module_is_reported():
    op = Op("no_such_op", {"torch": lambda x: x, "cpp": lambda x: x})
    reasons = op.reasons("cpp", torch.device("cpu"))
    assert any("_cpu_no_such_op" in r and "make build" in r for r in reasons)
    assert op.select("auto", torch.device("cpu")) == "torch"  # auto falls back to the reference
    assert op.reasons("triton", torch.device("cpu")) == ["op 'no_such_op' has no triton backend"]


def test_wrapper_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, streammem_kernels; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
