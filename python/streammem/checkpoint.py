"""The checkpoint format of the pipeline's objects: the kernels' one (``streammem_kernels.checkpoint``).

A header, a SHA-256 of the payload, atomic replacement (a temporary in the same folder, flushed and
fsynced, renamed, the folder fsynced; temporaries of killed writers swept on the next save),
weights-only loading and field readers whose errors name the path and the field.  Re-exported
here so that every layer of ``streammem`` takes it from its bottom layer.
"""
from __future__ import annotations

from streammem_kernels.checkpoint import (StateReader, atomic_write, ensure_folder, inside, load, load_json, reader_for,
                                         save, save_json)

__all__ = ["StateReader", "atomic_write", "ensure_folder", "inside", "load", "load_json", "reader_for", "save", "save_json"]
