"""token_logprobs / linear_token_logprobs / divergence_point against their references,
on CPU (every backend; Triton through the interpreter) and on CUDA tensors where a GPU exists."""
import math

import numpy as np
import pytest
import torch

from tests.support.device_checks import cpu_backends
from tests.support.device_checks import DEVICES, capture_in_cuda_graph, device_backends, guard_backend
from streammem_kernels import divergence_point, linear_token_logprobs, token_logprobs
from streammem_kernels.logprobs import (
    DIVERGENCE_POINT,
    LINEAR_TOKEN_LOGPROBS,
    TOKEN_LOGPROBS,
    divergence_point_reference,
    linear_token_logprobs_reference,
    token_logprobs_reference,
)

TOKEN_BACKENDS = cpu_backends(TOKEN_LOGPROBS)
LINEAR_BACKENDS = cpu_backends(LINEAR_TOKEN_LOGPROBS)
DIV_BACKENDS = cpu_backends(DIVERGENCE_POINT)
KERNEL_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
CUDA = DEVICES[1].marks[0]  # skipped without a GPU


def device_cases(op):
    """(device, backend) pairs: every CPU backend, and every GPU backend on CUDA tensors."""
    return [("cpu", b) for b in cpu_backends(op)] + [
        pytest.param("cuda", b, marks=CUDA) for b in ("torch", "triton", "cuda") if b in op.impls]


def require(op, device, backend):
    if device == "cuda" and backend not in device_backends(op, device):
        pytest.skip(f"{op.name}: backend {backend} cannot run on this GPU")


def _small_for(backend, device, size):
    # The Triton interpreter costs ~0.5 ms per program instance: keep its grids small.
    return min(size, 12) if backend == "triton" and device == "cpu" else size


# --------------------------------------------------------------------------
# token_logprobs
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device,backend", device_cases(TOKEN_LOGPROBS))
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("rows,vocab", [(1, 1), (1, 7), (3, 423), (17, 1031), (40, 2049), (2, 4099)])
def test_token_logprobs_matches_reference(device, backend, dtype, rows, vocab):
    require(TOKEN_LOGPROBS, device, backend)
    g = torch.Generator().manual_seed(rows * 1000 + vocab)
    rows = _small_for(backend, device, rows)
    logits = (torch.randn(rows, vocab, generator=g) * 4).to(dtype)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    expected = token_logprobs_reference(logits, targets)
    got = token_logprobs(logits.to(device), targets.to(device), backend=backend)
    assert got.dtype == torch.float32 and got.shape == (rows,) and got.device.type == device
    atol, rtol = TOKEN_LOGPROBS.tolerance(backend, dtype)
    torch.testing.assert_close(got.cpu(), expected, atol=atol, rtol=rtol)
    if vocab == 1:
        assert torch.all(got == 0)


@pytest.mark.parametrize("device,backend", device_cases(TOKEN_LOGPROBS))
def test_token_logprobs_batched_and_sliced(device, backend):
    require(TOKEN_LOGPROBS, device, backend)
    g = torch.Generator().manual_seed(1)
    base = (torch.randn(2, 9, 700, generator=g) * 3).to(device)
    logits = base[:, ::2, 50:650]  # strided rows, vocabulary dim still unit-stride
    targets = torch.randint(0, 600, (2, 5), generator=g).to(device)
    expected = token_logprobs_reference(logits.cpu(), targets.cpu())
    snapshot = base.clone()
    got = token_logprobs(logits, targets, backend=backend)
    assert got.shape == (2, 5)
    atol, rtol = TOKEN_LOGPROBS.tolerance(backend, torch.float32)
    torch.testing.assert_close(got.cpu(), expected, atol=atol, rtol=rtol)
    assert torch.equal(base, snapshot)
    # a transposed view (vocabulary not unit-stride) is copied, not misread
    tview = base[0].T.contiguous().T[:, :600]
    tgt = targets[0, :1].expand(9)
    torch.testing.assert_close(token_logprobs(tview, tgt.contiguous(), backend=backend).cpu(),
                               token_logprobs_reference(tview.cpu(), tgt.cpu()), atol=atol, rtol=rtol)


@pytest.mark.parametrize("backend", TOKEN_BACKENDS)
def test_token_logprobs_extreme_logits(backend):
    vocab = 301
    logits = torch.zeros(4, vocab)
    logits[0, 5] = 1e4  # dominant target: log p = 0
    logits[1, 5] = 1e4  # dominant other token: log p(target 7) = -1e4
    logits[2] = -1e4
    logits[2, :3] = 1e4  # three tied maxima: log p = -log 3
    logits[3, ::2] = -1e4
    targets = torch.tensor([5, 7, 1, 0])
    got = token_logprobs(logits, targets, backend=backend)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, token_logprobs_reference(logits, targets), atol=1e-5, rtol=1e-6)
    assert got[0] == pytest.approx(0.0, abs=1e-6)
    assert got[1] == pytest.approx(-1e4, rel=1e-6)
    assert got[2] == pytest.approx(-math.log(3), abs=1e-6)


@pytest.mark.parametrize("backend", TOKEN_BACKENDS)
def test_token_logprobs_masked_vocabulary(backend):
    logits = torch.randn(3, 200)
    logits[:, 100:] = float("-inf")  # masked entries are allowed
    logits[1, :50] = float("-inf")  # a whole first tile of -inf must not poison the sum
    targets = torch.tensor([3, 60, 150])
    got = token_logprobs(logits, targets, backend=backend)
    expected = token_logprobs_reference(logits, targets)
    torch.testing.assert_close(got[:2], expected[:2], atol=1e-5, rtol=1e-5)
    assert got[2] == float("-inf")


@pytest.mark.parametrize("backend", TOKEN_BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_token_logprobs_rejects_nan(backend, bad):
    logits = torch.randn(3, 50)
    logits[1, 17] = bad
    with pytest.raises(ValueError, match="rows \\[1\\]"):
        token_logprobs(logits, torch.tensor([0, 1, 2]), backend=backend)


def test_token_logprobs_validation():
    logits = torch.randn(4, 10)
    with pytest.raises(ValueError, match="targets must have shape"):
        token_logprobs(logits, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="token ids in \\[0, V\\)"):
        token_logprobs(logits, torch.tensor([0, 1, 10, 2]))
    with pytest.raises(ValueError, match="token ids in \\[0, V\\)"):
        token_logprobs(logits, torch.tensor([0, -1, 1, 2]))
    with pytest.raises(ValueError, match="targets must have dtype"):
        token_logprobs(logits, torch.zeros(4))
    with pytest.raises(ValueError, match="logits must have shape"):
        token_logprobs(torch.randn(10), torch.zeros((), dtype=torch.long))
    with pytest.raises(ValueError, match="logits must have dtype"):
        token_logprobs(torch.zeros(4, 10, dtype=torch.int32), torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="float32, float16, bfloat16 only"):
        token_logprobs(logits.double(), torch.zeros(4, dtype=torch.long), backend="cpp")


def test_token_logprobs_numpy_and_float64():
    logits = np.random.default_rng(0).normal(size=(5, 33))
    targets = np.arange(5)
    got = token_logprobs(logits, targets, backend="torch")
    assert got.dtype == torch.float64
    expected = logits[np.arange(5), targets] - np.log(np.exp(logits).sum(1))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)


def test_token_logprobs_opcheck():
    logits = torch.randn(6, 129)
    targets = torch.randint(0, 129, (6,))
    for backend in TOKEN_BACKENDS:
        if backend != "triton":
            torch.library.opcheck(torch.ops.streammem.token_logprobs.default, (logits, targets, backend))


# --------------------------------------------------------------------------
# linear_token_logprobs
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device,backend", device_cases(LINEAR_TOKEN_LOGPROBS))
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("rows,vocab,width,with_bias", [
    (1, 1, 8, False), (1, 5, 3, True), (7, 131, 33, False), (13, 517, 64, True), (40, 1000, 96, False),
    (70, 300, 48, True),  # two row blocks of the 64-row GPU tile (on CPU only for the non-interpreted backends)
])
def test_linear_token_logprobs_matches_reference(device, backend, dtype, rows, vocab, width, with_bias):
    require(LINEAR_TOKEN_LOGPROBS, device, backend)
    g = torch.Generator().manual_seed(rows * 7 + vocab + width)
    rows = _small_for(backend, device, rows)
    hidden = torch.randn(rows, width, generator=g).to(dtype)
    weight = (torch.randn(vocab, width, generator=g) / math.sqrt(width) * 3).to(dtype)
    bias = torch.randn(vocab, generator=g).to(dtype) if with_bias else None
    targets = torch.randint(0, vocab, (rows,), generator=g)
    expected = linear_token_logprobs_reference(hidden, weight, targets, bias)
    on = (lambda t: None if t is None else t.to(device))
    got = linear_token_logprobs(on(hidden), on(weight), on(targets), on(bias), backend=backend)
    assert got.dtype == torch.float32 and got.shape == (rows,) and got.device.type == device
    atol, rtol = LINEAR_TOKEN_LOGPROBS.tolerance(backend, dtype)
    torch.testing.assert_close(got.cpu(), expected, atol=atol, rtol=rtol)


@pytest.mark.parametrize("device,backend", device_cases(LINEAR_TOKEN_LOGPROBS))
def test_linear_token_logprobs_batched_sliced_extreme(device, backend):
    require(LINEAR_TOKEN_LOGPROBS, device, backend)
    g = torch.Generator().manual_seed(5)
    width, vocab = 24, 300
    hidden = torch.randn(2, 11, width * 2, generator=g).to(device)[:, ::3, ::2]  # (2, 4, 24), non-contiguous
    weight = torch.randn(vocab, width, generator=g)
    weight[7] *= 1e3  # logits around +-1e4 for some rows
    weight = weight.to(device)
    targets = torch.randint(0, vocab, (2, 4), generator=g).to(device)
    targets[0, 0] = 7
    snapshot = (hidden.clone(), weight.clone())
    got = linear_token_logprobs(hidden, weight, targets, backend=backend)
    expected = linear_token_logprobs_reference(hidden.cpu(), weight.cpu(), targets.cpu())
    assert torch.isfinite(got).all() and got.shape == (2, 4)
    torch.testing.assert_close(got.cpu(), expected, atol=2e-3, rtol=1e-5)  # |logit| ~1e4: float32 ulp is 1e-3
    assert torch.equal(hidden, snapshot[0]) and torch.equal(weight, snapshot[1])


@pytest.mark.parametrize("backend", LINEAR_BACKENDS)
def test_linear_token_logprobs_rejects_nan_weight(backend):
    weight = torch.randn(50, 8)
    weight[9, 3] = float("nan")
    with pytest.raises(ValueError, match="weight must be finite"):
        linear_token_logprobs(torch.randn(2, 8), weight, torch.tensor([0, 1]), backend=backend)


def test_linear_token_logprobs_validation():
    hidden, weight = torch.randn(3, 8), torch.randn(20, 8)
    targets = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="weight must have shape \\(V, H\\)"):
        linear_token_logprobs(hidden, torch.randn(20, 9), targets)
    with pytest.raises(ValueError, match="weight must have the dtype"):
        linear_token_logprobs(hidden, weight.half(), targets)
    with pytest.raises(ValueError, match="bias must have shape"):
        linear_token_logprobs(hidden, weight, targets, torch.zeros(19))
    with pytest.raises(ValueError, match="hidden must be finite"):
        linear_token_logprobs(torch.full((3, 8), float("nan")), weight, targets)
    with pytest.raises(ValueError, match="token ids in \\[0, V\\)"):
        linear_token_logprobs(hidden, weight, torch.tensor([0, 1, 20]))


def test_linear_token_logprobs_chunking_crosses_tiles(monkeypatch):
    # Force many vocabulary chunks in the torch path (and its online rescaling).
    import streammem_kernels.logprobs.reference as lp

    monkeypatch.setattr(lp, "TORCH_CHUNK_ELEMS", 64)
    hidden, weight = torch.randn(5, 16), torch.randn(1500, 16) * 2
    targets = torch.tensor([0, 255, 256, 1023, 1499])
    torch.testing.assert_close(linear_token_logprobs(hidden, weight, targets, backend="torch"),
                               linear_token_logprobs_reference(hidden, weight, targets), atol=1e-5, rtol=1e-5)


def test_linear_token_logprobs_opcheck():
    hidden, weight, bias = torch.randn(5, 12), torch.randn(70, 12), torch.randn(70)
    targets = torch.randint(0, 70, (5,))
    for backend in LINEAR_BACKENDS:
        if backend != "triton":
            torch.library.opcheck(torch.ops.streammem.linear_token_logprobs.default,
                                  (hidden, weight, bias, targets, backend))
            torch.library.opcheck(torch.ops.streammem.linear_token_logprobs.default,
                                  (hidden, weight, None, targets, backend))


# --------------------------------------------------------------------------
# The Triton launch configuration: the GPU's, also under the interpreter
# --------------------------------------------------------------------------
@pytest.fixture()
def interpreted_launches(monkeypatch):
    """Keyword arguments (constexprs and launch options) of every interpreted Triton launch."""
    from triton.runtime.interpreter import InterpretedFunction

    seen = []
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        seen.append((self.fn.__name__, {k: getattr(v, "value", v) for k, v in kwargs.items()}))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    return seen


def _linear_case(dtype, rows=5, vocab=300, width=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=g).to(dtype)
    weight = (torch.randn(vocab, width, generator=g) / math.sqrt(width) * 3).to(dtype)
    bias = torch.randn(vocab, generator=g).to(dtype)
    return hidden, weight, torch.randint(0, vocab, (rows,), generator=g), bias


@pytest.mark.skipif("triton" not in LINEAR_BACKENDS, reason="Triton interpreter unavailable")
@pytest.mark.parametrize("width", [64, 33])  # H % 16 == 0 or not: the two tile configurations per dtype
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
def test_linear_triton_runs_the_gpu_tiles_under_the_interpreter(interpreted_launches, dtype, width):
    from streammem_kernels.runtime import aot as _aot
    from streammem_kernels.logprobs._triton import linear_config

    hidden, weight, targets, bias = _linear_case(dtype, width=width)
    linear_token_logprobs(hidden, weight, targets, bias, backend="triton")
    with _aot.recording():  # what a GPU launch gets (the compile check replays these)
        linear_token_logprobs(hidden, weight, targets, bias, backend="triton")
    (name, here), (_, gpu) = interpreted_launches
    assert name == "_linear_token_logprobs_kernel"
    cfg = linear_config(dtype, width)
    assert (gpu["BLOCK_T"], gpu["BLOCK_V"], gpu["BLOCK_H"], gpu["num_warps"], gpu["num_stages"]) == tuple(cfg)
    # The only difference allowed: bfloat16 tiles are upcast under the interpreter (its bf16 dot is wrong).
    differ = {k for k in gpu if here[k] != gpu[k]}
    assert differ == ({"UPCAST", "IEEE"} if dtype == torch.bfloat16 else set())
    assert gpu["UPCAST"] is False and gpu["IEEE"] is (dtype == torch.float32)


@pytest.mark.skipif("triton" not in LINEAR_BACKENDS, reason="Triton interpreter unavailable")
@pytest.mark.parametrize("width", [64, 33])
def test_linear_triton_bf16_against_fp32_reference_of_rounded_inputs(width):
    """What this proves, and what it cannot.

    On a GPU, bfloat16 tiles go to the tensor cores as they are: products of
    bfloat16 values are exact in the float32 accumulator, so the result must
    equal the float32 reference evaluated on the bfloat16-rounded inputs, up
    to summation order.  The interpreter computes bfloat16 dots wrongly, so
    under it the kernel upcasts the tiles it loaded to float32 before the dot
    (UPCAST); every other step runs as on the GPU: the bfloat16 loads, masks
    and strides of the GPU tile shape, the bias, the online log-sum-exp and
    the split merge.  The dot instruction itself (mma / wgmma on bfloat16) is
    checked by the ahead-of-time compile of that exact specialisation
    (tests/gpu_readiness/test_triton_compile.py) and run on CUDA tensors by the device tests
    where a GPU exists.  float16 needs no upcast: the interpreter's float16 dot
    is right, so the float16 cases above run the tensor-core specialisation itself.
    """
    hidden, weight, targets, bias = _linear_case(torch.bfloat16, rows=9, vocab=517, width=width, seed=width)
    rounded = linear_token_logprobs_reference(hidden.float(), weight.float(), targets, bias.float())
    got = linear_token_logprobs(hidden, weight, targets, bias, backend="triton")
    atol, rtol = LINEAR_TOKEN_LOGPROBS.tolerance("triton", torch.bfloat16)
    torch.testing.assert_close(got, rounded, atol=atol, rtol=rtol)
    # The test can fail: the float32 inputs before rounding give a different answer.
    unrounded = linear_token_logprobs_reference(*(t.float() if t.is_floating_point() else t
                                                  for t in _linear_case(torch.float32, 9, 517, width, width)))
    assert (got - unrounded).abs().max() > 10 * atol


# --------------------------------------------------------------------------
# The GPU path is device-resident: no host synchronisation, CUDA-graph capture
# --------------------------------------------------------------------------
@pytest.mark.host_sync
def test_triton_backends_never_synchronise(monkeypatch):
    if "triton" not in TOKEN_BACKENDS:
        pytest.skip("Triton interpreter unavailable")
    guard_backend(monkeypatch, TOKEN_LOGPROBS, "triton")
    guard_backend(monkeypatch, LINEAR_TOKEN_LOGPROBS, "triton")
    logits = torch.randn(2, 3, 2100)
    targets = torch.randint(0, 2100, (2, 3))
    torch.testing.assert_close(token_logprobs(logits, targets, backend="triton"),
                               token_logprobs_reference(logits, targets), atol=1e-5, rtol=1e-5)
    hidden, weight, tgt, bias = _linear_case(torch.float32)
    torch.testing.assert_close(linear_token_logprobs(hidden, weight, tgt, bias, backend="triton"),
                               linear_token_logprobs_reference(hidden, weight, tgt, bias), atol=3e-5, rtol=1e-5)


@pytest.mark.host_sync
def test_divergence_point_gpu_backend_never_synchronises(monkeypatch):
    # divergence_point runs its torch backend on CUDA tensors: that is the code to keep sync-free.
    guard_backend(monkeypatch, DIVERGENCE_POINT, "torch")
    lp = -torch.rand(3, 40, dtype=torch.float64) * 2
    lp[1, 30] = -9.0
    got = divergence_point(lp, delta=4, lengths=torch.tensor([40, 35, 0]), backend="torch")
    assert got.tolist() == divergence_point_reference(lp, 4, 0.85, 1.0, torch.tensor([40, 35, 0])).tolist()


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_logprob_ops_capture_in_cuda_graph(backend):
    require(TOKEN_LOGPROBS, "cuda", backend)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5000, generator=g).cuda()
    targets = torch.randint(0, 5000, (4,), generator=g).cuda()
    hidden, weight, tgt, bias = (t.cuda() for t in _linear_case(torch.bfloat16, rows=70, vocab=3000, width=64))
    for fn in (lambda: token_logprobs(logits, targets, backend=backend),
               lambda: linear_token_logprobs(hidden, weight, tgt, bias, backend=backend)):
        eager, replayed = capture_in_cuda_graph(fn)
        torch.testing.assert_close(replayed, eager, atol=0, rtol=0)


@pytest.mark.gpu
@CUDA
def test_divergence_point_captures_in_cuda_graph():
    lp = (-torch.rand(3, 40, dtype=torch.float64) * 2).cuda()
    lengths = torch.tensor([40, 35, 0]).cuda()
    eager, replayed = capture_in_cuda_graph(lambda: divergence_point(lp, delta=4, lengths=lengths, backend="torch"))
    assert torch.equal(eager, replayed)
    assert eager.tolist() == divergence_point_reference(lp.cpu(), 4, 0.85, 1.0, lengths.cpu()).tolist()


# --------------------------------------------------------------------------
# divergence_point
# --------------------------------------------------------------------------
def plain_divergence_point(lp, delta, alpha, beta):
    """The issue's convention written as plainly as possible."""
    L = len(lp)
    for j in range(delta + 1, L):
        mu = sum(lp[j - delta:j]) / delta
        if mu - lp[j] > max(alpha * abs(mu), beta):
            return j
    return L


HAND_MADE = [
    # name, lp, delta, alpha, beta, expected o
    ("drop at first eligible j", [-0.5] * 4 + [-5.0] + [-0.5] * 3, 3, 0.85, 1.0, 4),
    ("drop before eligibility ignored", [-0.5, -0.5, -9.0, -0.5, -0.5, -0.5, -0.5], 2, 0.85, 1.0, 7),
    ("drop too small for beta", [-0.1] * 6 + [-0.9] + [-0.1] * 3, 3, 0.5, 1.0, 10),
    ("drop too small for alpha", [-4.0] * 6 + [-6.0] + [-4.0] * 3, 3, 0.85, 1.0, 10),
    ("same drop passes a smaller alpha", [-4.0] * 6 + [-6.0] + [-4.0] * 3, 3, 0.4, 1.0, 6),
    ("no drop", [-1.0] * 30, 20, 0.85, 1.0, 30),
    ("short caption L = delta + 1", [-0.1] * 20 + [-50.0], 20, 0.85, 1.0, 21),
    ("L = delta + 2, drop at the last token", [-0.1] * 21 + [-50.0], 20, 0.85, 1.0, 21),
    ("empty caption", [], 20, 0.85, 1.0, 0),
    ("single token", [-3.0], 1, 0.85, 1.0, 1),
    ("first of two drops", [-0.2] * 5 + [-4.0, -0.2, -0.2, -6.0], 2, 0.85, 1.0, 5),
]


@pytest.mark.parametrize("backend", DIV_BACKENDS)
@pytest.mark.parametrize("name,lp,delta,alpha,beta,expected", HAND_MADE, ids=[h[0] for h in HAND_MADE])
def test_divergence_point_hand_made(backend, name, lp, delta, alpha, beta, expected):
    assert plain_divergence_point(lp, delta, alpha, beta) == expected
    got = divergence_point(torch.tensor(lp, dtype=torch.float32), delta=delta, alpha=alpha, beta=beta,
                           backend=backend)
    assert got.dim() == 0 and got.dtype == torch.int64
    assert int(got) == expected


@pytest.mark.parametrize("backend", DIV_BACKENDS)
def test_divergence_point_random_batched_with_lengths(backend):
    rng = np.random.default_rng(3)
    for trial in range(20):
        batch, max_len = rng.integers(1, 6), rng.integers(0, 60)
        delta = int(rng.integers(1, 8))
        alpha, beta = float(rng.uniform(0.05, 0.95)), float(rng.uniform(0.05, 2.0))
        lp = -np.abs(rng.standard_t(2, size=(batch, max_len)))
        lengths = rng.integers(0, max_len + 1, size=batch)
        got = divergence_point(torch.from_numpy(lp), delta=delta, alpha=alpha, beta=beta,
                               lengths=torch.from_numpy(lengths), backend=backend)
        expected = [plain_divergence_point(list(lp[b, :lengths[b]]), delta, alpha, beta) for b in range(batch)]
        assert got.tolist() == expected, (trial, delta, alpha, beta)
        ref = divergence_point_reference(torch.from_numpy(lp), delta, alpha, beta, torch.from_numpy(lengths))
        assert ref.tolist() == expected


def test_divergence_point_ignores_padding_past_length():
    lp = torch.tensor([[-0.1] * 6 + [float("nan")] * 4])
    assert divergence_point(lp, delta=2, lengths=torch.tensor([6])).tolist() == [6]


@pytest.mark.parametrize("kwargs,match", [
    ({"delta": 0}, "delta must be >= 1"),
    ({"alpha": 0.0}, "alpha must be >"),
    ({"alpha": 1.0}, "alpha must be <"),
    ({"beta": 0.0}, "beta must be >"),
    ({"beta": -1.0}, "beta must be >"),
])
def test_divergence_point_rejects_bad_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        divergence_point(torch.zeros(10), **kwargs)


def test_divergence_point_rejects_bad_input():
    with pytest.raises(ValueError, match="logprobs .*must be finite"):
        divergence_point(torch.tensor([-1.0, float("nan"), -1.0]))
    with pytest.raises(ValueError, match="lengths must lie in"):
        divergence_point(torch.zeros(2, 5), lengths=torch.tensor([3, 6]))
    with pytest.raises(ValueError, match="lengths must have shape"):
        divergence_point(torch.zeros(2, 5), lengths=torch.tensor([3]))
    with pytest.raises(ValueError, match="only accepted with batched"):
        divergence_point(torch.zeros(5), lengths=torch.tensor([3]))
    with pytest.raises(ValueError, match="logprobs must have shape"):
        divergence_point(torch.zeros(2, 3, 4))


def test_divergence_point_opcheck():
    lp = -torch.rand(3, 30, dtype=torch.float64) * 3
    lengths = torch.tensor([30, 12, 0])
    for backend in DIV_BACKENDS:
        torch.library.opcheck(torch.ops.streammem.divergence_point.default, (lp, lengths, 4, 0.5, 0.5, backend))


# --------------------------------------------------------------------------
# Per-call latency paths: plain C-contiguous CPU tensors go to one native call that also
# does the value checks; the result and every error must be those of the general path.
# --------------------------------------------------------------------------
@pytest.fixture()
def general_path_only(monkeypatch):
    """Run a call once through the fast path (which must not reach call_op) and once through the
    general path (STREAMMEM_BACKEND=cpp: the fast paths only serve ``auto`` without an override)."""
    import streammem_kernels.logprobs as lp_mod

    def both(fn):
        def no_general(*args):
            raise AssertionError("the fast path fell through to call_op")

        outcomes = []
        for general in (False, True):
            with monkeypatch.context() as m:
                if general:
                    m.setenv("STREAMMEM_BACKEND", "cpp")
                else:
                    m.setattr(lp_mod, "call_op", no_general)
                try:
                    outcomes.append(fn())
                except ValueError as exc:
                    outcomes.append(("ValueError", str(exc)))
        return outcomes

    return both


needs_cpp = pytest.mark.skipif("cpp" not in TOKEN_BACKENDS, reason="C++ extension not built")


@needs_cpp
@pytest.mark.parametrize("dtype", KERNEL_DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (16, 2048), (3, 5, 97)])
def test_token_logprobs_fast_path_is_the_general_path(general_path_only, dtype, shape):
    g = torch.Generator().manual_seed(11)
    logits = (torch.randn(shape, generator=g) * 4).to(dtype)
    targets = torch.randint(0, shape[-1], shape[:-1], generator=g)
    before = logits.clone()
    fast, general = general_path_only(lambda: token_logprobs(logits, targets))
    assert fast.shape == general.shape == shape[:-1] and fast.dtype == general.dtype == torch.float32
    assert torch.equal(fast, general)  # bit for bit
    assert torch.equal(logits, before)
    bad_targets = targets.clone().reshape(-1)
    bad_targets[-1] = shape[-1]
    bad_targets = bad_targets.reshape(shape[:-1])
    fast, general = general_path_only(lambda: token_logprobs(logits, bad_targets))
    assert fast == general and fast[0] == "ValueError" and "got values in" in fast[1]
    poisoned = logits.clone().reshape(-1, shape[-1])
    poisoned[:, 0] = float("nan")
    poisoned = poisoned.reshape(shape)
    fast, general = general_path_only(lambda: token_logprobs(poisoned, targets))
    assert fast == general and fast[0] == "ValueError" and "must be finite: rows [0" in fast[1]


@needs_cpp
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_divergence_point_fast_path_is_the_general_path(general_path_only, dtype):
    rng = np.random.default_rng(8)
    for trial in range(30):
        batch, max_len = int(rng.integers(1, 5)), int(rng.integers(1, 70))
        lp = torch.from_numpy(-np.abs(rng.standard_t(2, size=(batch, max_len)))).to(dtype)
        lengths = torch.from_numpy(rng.integers(0, max_len + 1, size=batch))
        kwargs = dict(delta=int(rng.integers(1, 90)), alpha=float(rng.uniform(0.05, 0.95)),
                      beta=float(rng.uniform(0.05, 2.0)))
        for args in ((lp[0],), (lp,)):
            fast, general = general_path_only(lambda: divergence_point(*args, **kwargs))
            assert fast.shape == general.shape and fast.dtype == general.dtype == torch.int64
            assert torch.equal(fast, general), (trial, kwargs)
        fast, general = general_path_only(lambda: divergence_point(lp, lengths=lengths, **kwargs))
        assert torch.equal(fast, general), (trial, kwargs)
    # Errors: same messages; padding past a length may hold NaN.
    lp = torch.full((2, 8), -0.5, dtype=dtype)
    lp[1, 6] = float("nan")
    assert [o.tolist() for o in general_path_only(lambda: divergence_point(lp, lengths=torch.tensor([8, 6])))] == [
        [8, 6]] * 2
    for call in (lambda: divergence_point(lp), lambda: divergence_point(lp, lengths=torch.tensor([8, 9])),
                 lambda: divergence_point(lp[1])):
        fast, general = general_path_only(call)
        assert fast == general and fast[0] == "ValueError"
