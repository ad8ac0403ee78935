"""Backend selection: auto order, the STREAMMEM_BACKEND override, and errors
that say why a backend cannot run."""
import pytest
import torch

from tests.support.device_checks import cpu_backends
from streammem_kernels import motion_magnitude
from streammem_kernels.runtime.dispatch import BackendFallbackWarning, Op, common_reasons
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
    with pytest.warns(BackendFallbackWarning, match="_cpu_no_such_op"):
        assert op.select("auto", torch.device("cpu")) == "torch"  # auto falls back to the reference, and says so
    assert op.reasons("triton", torch.device("cpu")) == ["op 'no_such_op' has no triton backend"]


def test_wrapper_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, streammem_kernels; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_eager_calls_skip_the_custom_op_dispatcher():
    """Outside torch.compile every public op runs its backend directly: the custom-op
    dispatcher's first call imports torch._dynamo, 2-3 s of first-call latency."""
    import subprocess
    import sys

    code = """
import sys, torch
import streammem_kernels as sk
from streammem_kernels import CosineTree
g = torch.Generator().manual_seed(0)
sk.motion_magnitude(torch.rand(3, 12, 12, generator=g))
sk.batched_kmeans(torch.randn(2, 20, 4, generator=g), 3)
sk.cosine_topk(torch.randn(2, 4, generator=g), torch.randn(9, 4, generator=g), 3)
tree = CosineTree(4)
tree.add_leaves(torch.randn(12, 4, generator=g))
tree.grow(3)
sk.tree_search(tree, torch.randn(2, 4, generator=g))
sk.tree_search(tree, torch.randn(2, 4, generator=g), beam=2, k=2)
sk.token_logprobs(torch.randn(3, 7, generator=g), torch.tensor([0, 1, 6]))
sk.linear_token_logprobs(torch.randn(3, 5, generator=g), torch.randn(7, 5, generator=g), torch.tensor([0, 1, 6]))
sk.divergence_point(torch.randn(2, 6, generator=g).clamp_max(0))
sk.depth_scores(torch.rand(9, generator=g))
sk.adjacent_cosine(torch.randn(6, 4, generator=g))
print(sorted(m for m in ("torch._dynamo", "triton") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_forgetting_imports_also_forgets_the_ops_loaded_modules():
    """load_native.cache_clear() (what tests call after hiding a native module) drops every Op's
    resolutions and its loaded C++ module, so the latency paths ask again too."""
    from streammem_kernels.runtime.dispatch import load_native
    from streammem_kernels.logprobs import TOKEN_LOGPROBS

    module = TOKEN_LOGPROBS.cpp_module("auto")
    TOKEN_LOGPROBS.select("auto", torch.device("cpu"))
    load_native.cache_clear()
    assert TOKEN_LOGPROBS._cpp is None and not TOKEN_LOGPROBS._selected
    assert TOKEN_LOGPROBS.cpp_module("auto") is module  # a module object is imported once per process


def test_resolve_device_fills_in_the_current_cuda_index(monkeypatch):
    """A tree made with device='cuda' must accept queries on cuda:0: torch.device('cuda') != 'cuda:0'."""
    from streammem_kernels.runtime.validate import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device must name a torch device"):
        resolve_device("gpu0")
