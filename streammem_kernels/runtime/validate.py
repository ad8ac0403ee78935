"""Small validation and conversion helpers shared by every op.

Public functions validate here, once, and raise ``ValueError`` naming the
argument and what was expected.  Nothing here mutates the caller's tensors.

Checks of *metadata* (rank, shape, dtype, device, integer arguments) are host
checks on every device.  Checks of tensor *values* (finite, indices in range)
are host checks on CPU tensors; on CUDA tensors, and on every device while
torch.compile traces, they are enqueued as device-side assertions
(:func:`device_assert`), so no op synchronises the host with the GPU, every op
can be captured in a CUDA graph and every op compiles as one graph.  A failed
device assertion surfaces at the next synchronisation as a CUDA
"device-side assert triggered" error carrying the same message, as torch's own
CUDA index checks do (it leaves the CUDA context unusable: validate on the
host first where bad values are expected).
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np
import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# The most bytes a broadcast view (a stride of 0: ``expand``, ``np.broadcast_to``) may stand for: an op
# copies a non-contiguous input, so a view of a huge shape would reach the allocator (a typo in an
# ``expand``), stopped here with a ValueError instead.
MAX_VIEW_BYTES = 1 << 33


def _check_broadcast_view(name: str, shape, strides, itemsize: int) -> None:
    if not any(st == 0 and n > 1 for n, st in zip(shape, strides)):
        return
    size = itemsize
    for n in shape:
        size *= int(n)
    if size > MAX_VIEW_BYTES:
        raise ValueError(f"{name} is a broadcast view (a stride of 0) of shape {tuple(shape)}: {size / 2**30:.0f} GiB "
                         f"once copied, more than the {MAX_VIEW_BYTES >> 30} GiB bound; pass the data it stands for")


def as_tensor(x, name: str) -> torch.Tensor:
    """Accept a torch tensor or anything numpy can hold; never copies a tensor.

    Meta tensors (shape only, no data) are refused here, for every op: the ops
    compute values.  Tensors that require grad are accepted; no op has an
    autograd formula, so outputs never require grad (see ``_dispatch.call_op``).
    """
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta":
            raise ValueError(f"{name} must hold data (a CPU or CUDA tensor), got a meta tensor of shape "
                             f"{tuple(x.shape)}")
        _check_broadcast_view(name, x.shape, x.stride(), x.element_size())
        return x
    if isinstance(x, np.ndarray):
        _check_broadcast_view(name, x.shape, x.strides, x.itemsize)
    if isinstance(x, np.ndarray) or isinstance(x, (list, tuple)):
        arr = np.asarray(x)
        if arr.dtype == object:
            raise ValueError(f"{name} must be a numeric array, got dtype object")
        try:
            return torch.from_numpy(np.ascontiguousarray(arr))
        except TypeError:  # e.g. uint64 (Python ints >= 2^63): no torch dtype holds it
            raise ValueError(f"{name} must have a dtype torch can hold, got numpy {arr.dtype}") from None
    raise ValueError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")


def check_rank(t: torch.Tensor, name: str, ranks: Iterable[int], shape_doc: str) -> None:
    ranks = tuple(ranks)
    if t.dim() not in ranks:
        raise ValueError(f"{name} must have shape {shape_doc}, got a {t.dim()}-d tensor of shape {tuple(t.shape)}")


def check_dtype(t: torch.Tensor, name: str, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise ValueError(f"{name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")


def check_nonempty(t: torch.Tensor, name: str) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")


def resolve_device(device, name: str = "device") -> torch.device:
    """``device`` as a :class:`torch.device` with its index filled in (``'cuda'`` -> ``cuda:<current>``), so
    that it compares equal to the ``.device`` of tensors placed on it; ``ValueError`` naming ``name`` if it
    names no device."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name} must name a torch device ('cpu', 'cuda'), got {device!r}") from None
    if resolved.type == "cuda" and resolved.index is None and torch.cuda.is_available():
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def device_assert(condition: torch.Tensor, message: str) -> None:
    """Enqueue ``assert condition`` on the GPU without synchronising (``condition``: a 0-d bool CUDA tensor)."""
    torch._assert_async(condition, message)


def host_checks(t: torch.Tensor) -> bool:
    """Whether value checks on ``t`` read it on the host: CPU tensors outside torch.compile.  On CUDA, and
    in a graph torch.compile traces, they are assertions in the stream (:func:`device_assert`), so no
    function reads a value on the host while traced."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling()


def check_values(ok: torch.Tensor, message: str) -> None:
    """``ValueError(message)`` unless the 0-d bool tensor ``ok`` is true: a host check on CPU, a device
    assertion on CUDA and inside torch.compile (no synchronisation; a failure raises ``RuntimeError``
    carrying ``message``)."""
    if host_checks(ok):
        if not bool(ok):
            raise ValueError(message)
    else:
        device_assert(ok, message)


def sized_message(template: str, **sizes) -> str:
    """``template.format(**sizes)`` for a value check's message; while torch.compile traces with dynamic
    shapes, a symbolic size is written as its name (``{N}`` -> ``N``): a graph's assertion message is a
    constant, and writing the size into it would fix the graph to that size."""
    if torch.compiler.is_compiling():
        from torch.fx.experimental.symbolic_shapes import has_static_value  # loaded by the compiler already

        sizes = {name: value if has_static_value(value) else name for name, value in sizes.items()}
    return template.format(**sizes)


def check_finite(t: torch.Tensor, name: str) -> None:
    """Raise if a floating tensor holds NaN or Inf (integer tensors always pass); device-side on CUDA.

    min and max propagate NaN and expose +-Inf, so one reduction pass without a temporary decides
    (``isfinite(t).all()`` makes four passes and a boolean tensor the size of ``t``: 20x slower on CPU,
    two thirds of a torch-backend ``cosine_topk`` over 10^4 keys).
    """
    if t.is_floating_point() and t.numel():
        low, high = torch.aminmax(t)
        check_values(torch.isfinite(low) & torch.isfinite(high), f"{name} must be finite, found NaN or Inf")


def check_int(value, name: str, *, minimum: int | None = None, odd: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if odd and value % 2 == 0:
        raise ValueError(f"{name} must be odd, got {value}")
    return value


def check_float(value, name: str, *, low=None, high=None, low_open=False, high_open=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(f"{name} must be finite, got an int of {value.bit_length()} bits") from None
    if not math.isfinite(value):  # math, not numpy: torch.compile traces numpy calls as tensor ops
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and (value <= low if low_open else value < low):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value}")
    if high is not None and (value >= high if high_open else value > high):
        raise ValueError(f"{name} must be {'<' if high_open else '<='} {high}, got {value}")
    return value


def contiguous_cpu_numpy(t: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (copies only when non-contiguous)."""
    return t.detach().contiguous().numpy()


_TENSOR, _F32, _STRIDED = torch.Tensor, torch.float32, torch.strided


def cpu_fast_path(t) -> bool:
    """A plain float32 C-contiguous CPU tensor that needs no autograd: the input the native kernels
    read in place through ``data_ptr()`` (every other input goes through the general path)."""
    return (type(t) is _TENSOR and t.dtype is _F32 and t.is_cpu and not t.requires_grad and t.layout is _STRIDED
            and t.is_contiguous())
