"""Make the Triton interpreter patch triton.language once per function per launch, not per call.

Under ``TRITON_INTERPRET=1`` every call of a ``@triton.jit`` device function
from inside a kernel -- ``tl.sum``, ``tl.max`` and ``tl.cdiv`` are such
functions -- runs ``interpreter._patch_lang``, which walks the members of
``triton.language`` with ``inspect.getmembers`` (milliseconds each), and the
patches a device call makes are never undone.  Within one launch the second
and later patches for the same function therefore change nothing; this skips
them.  Test-only (the suite and the compile check's recording run kernels
interpreted); it changes no result, only interpreter time.  When Triton's
internals differ, ``install()`` changes nothing and returns False.
"""
from __future__ import annotations

import contextvars

_SEEN = contextvars.ContextVar("streammem_interpreter_patched_fns", default=None)


def install() -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    grid_call = getattr(getattr(interpreter, "GridExecutor", None), "__call__", None)
    if patch_lang is None or grid_call is None:
        return False
    if getattr(patch_lang, "_streammem_once", False):
        return True

    def patch_once(fn):
        seen = _SEEN.get()
        if seen is None:  # outside a launch: Triton's behaviour
            return patch_lang(fn)
        if fn in seen:
            return None  # only device calls repeat; their scope is never restored anyway
        seen.add(fn)
        return patch_lang(fn)  # the launch's own patch comes first and keeps its scope

    def launch(self, *args, **kwargs):
        token = _SEEN.set(set())
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _SEEN.reset(token)

    patch_once._streammem_once = True
    interpreter._patch_lang = patch_once
    interpreter.GridExecutor.__call__ = launch
    return True
