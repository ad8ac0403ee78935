"""Optional dependencies (the extras of pyproject.toml), imported at the point of use with a message naming the extra.

The kernels need only torch and numpy.  Video decoding, the pipeline's models
and its dialogue index come from the extras declared in pyproject.toml; a
missing one raises :class:`MissingExtraError` (an ``ImportError``, so existing
``except ImportError`` fallbacks keep working) whose one-line message says what
to ``pip install`` instead of a bare ``No module named 'cv2'``.
"""
from __future__ import annotations

import sys

__all__ = ["MissingExtraError", "require"]

DISTRIBUTION = "streammem-kernels"


class MissingExtraError(ImportError):
    """An optional dependency is not installed (or fails to import); the message names the extra."""


def require(module: str, *, package: str, extra: str, purpose: str):
    """Import and return ``module``, or raise :class:`MissingExtraError`.

    Parameters
    ----------
    module : str
        Import name (``"cv2"``).
    package : str
        The PyPI distribution that provides it (``"opencv-python-headless"``).
    extra : str
        The extra of streammem-kernels that pulls it in (``"video"``).
    purpose : str
        What needs it, as the user would recognise it (``"VideoSource"``).
    """
    try:
        __import__(module)  # like an import statement (honours a patched builtins.__import__)
        return sys.modules[module]
    except ImportError as exc:
        # A present but broken install (a missing system library, say) keeps its own reason.
        missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == module.split(".")[0]
        why = "which is not installed" if missing else f"which fails to import ({exc})"
        raise MissingExtraError(
            f"{purpose} needs {package}, {why}: pip install '{DISTRIBUTION}[{extra}]' (or pip install {package})",
            name=module,
        ) from exc
