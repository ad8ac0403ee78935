"""The one place that imports Ray."""
from __future__ import annotations

__all__ = ["require_ray", "RAY_EXTRA_HINT"]

RAY_EXTRA_HINT = "pip install 'streammem-kernels[ray]'"


def require_ray():
    """The ``ray`` module, or ImportError with a one-line message naming the extra that installs it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"streammem.distributed needs Ray for this ({exc.__class__.__name__}: {exc}); "
                          f"install the extra: {RAY_EXTRA_HINT}") from None
    return ray
