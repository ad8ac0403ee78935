"""What the Triton interpreter (``TRITON_INTERPRET=1``, CPU tensors) needs from us to run our kernels
on every supported Triton and numpy release; dispatch applies it before any interpreted launch."""
from __future__ import annotations

__all__ = ["fix_interpreter_scalar_index"]


def fix_interpreter_scalar_index() -> bool:
    """Let interpreted kernels use a scalar argument as an index (``range(window)``) under numpy >= 2.4.

    The interpreter holds a scalar argument as a 1-element array and converts it to an index
    with ``int()`` of that array (Triton 3.6), which numpy >= 2.4 refuses; this makes it take
    the single element first, as newer Triton releases do.  The result is the same number on
    every numpy.  Returns False (and changes nothing) where Triton's internals differ.
    """
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None:
        return False
    if getattr(patch_tensor, "_streammem_scalar_index", False):
        return True

    def patch_lang_tensor(tensor, scope, *args, **kwargs):
        patch_tensor(tensor, scope, *args, **kwargs)
        # Through the scope, so the launch's end restores Triton's own method as well.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_lang_tensor._streammem_scalar_index = True
    interpreter._patch_lang_tensor = patch_lang_tensor
    return True
