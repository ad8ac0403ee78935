"""Argument validators shared by every layer of ``streammem``.

Each returns the value in its canonical type or raises ``ValueError`` naming
the caller's argument and what it expects, NaN and infinity included.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["is_real", "check_int", "check_real"]


def is_real(value) -> bool:
    """True for a real number; numpy scalars included, bool (and numpy.bool_) excluded: a flag is no number."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_int(value, name: str, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in [minimum, maximum]; ValueError naming ``name`` otherwise."""
    expected = f"an int >= {minimum}" if maximum is None else f"an int in [{minimum}, {maximum}]"
    if not is_real(value) or not math.isfinite(value) or int(value) != value:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_real(value, name: str, low: float | None = None, high: float | None = None, *,
               open_low: bool = False) -> float:
    """``value`` as a finite float within the bounds; ValueError naming ``name`` otherwise."""
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    value = float(value)
    if low is not None and (value <= low if open_low else value < low):
        raise ValueError(f"{name} must be {'>' if open_low else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value!r}")
    return value
