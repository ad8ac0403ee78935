"""The Python side of the border with the C++ kernels: one form for every native entry.

An entry of a ``_cpu_<op>`` module takes its tensors as DLPack capsules (:func:`view`; the C++
side reads them as ``TensorView``, ``csrc/cpu/tensor_view.h``), its scalars as plain ints and
floats, writes its results into tensors the caller allocated, and returns a status: 0, or the
number of the value check that failed among those the caller declares beside the call
(:class:`NativeChecks`).  The caller validates everything else before the call, so a kernel
never parses an argument a second time and every error message is written once, here in Python.

    _LOGIT_CHECKS = NativeChecks("logits must be finite, found NaN or Inf", ...)
    status = module.token_logprobs(view(rows), view(targets), view(out))
    _LOGIT_CHECKS.raise_for(status)
"""
from __future__ import annotations

from typing import Callable, Union

from torch.utils.dlpack import to_dlpack as view

__all__ = ["NativeChecks", "view"]

Message = Union[str, Callable[..., str]]


class NativeChecks:
    """The value checks a native entry makes in its own pass, in the order of its status codes.

    Each check is a message, a ``str.format`` template or a callable returning the message
    (for details worth computing only on failure, such as which rows hold NaN); ``raise_for``
    formats or calls it with the keyword arguments given.
    """

    __slots__ = ("messages",)

    def __init__(self, *messages: Message):
        self.messages = messages

    def raise_for(self, status: int, **context) -> None:
        """Raise the ``ValueError`` of check ``status`` (1-based); 0 returns."""
        if not status:
            return
        if not 1 <= status <= len(self.messages):
            raise RuntimeError(f"a native kernel returned status {status}, which no declared check has")
        message = self.messages[status - 1]
        raise ValueError(message(**context) if callable(message) else message.format(**context))
