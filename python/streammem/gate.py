"""Selective frame stacking (StreamChat sec. 3.1.1) and the Slow / Base / Fast presets.

A frame enters the vision buffer only when its Lucas-Kanade motion score
against the previous frame exceeds the threshold t; ``score = flow_px / (1 + flow_px)``
in [0, 1).  The first frame of a stream is always kept (there is nothing to compare
it with, and memory must start somewhere).

The gate measures with the kernel's defaults: a pyramid (large motion is
measured, not saturated) and the "moving" statistic (the mean flow over the
pixels that move, so one small object on a static camera moves the gate);
``statistic="textured", levels=1`` is StreamChat's literal single-scale mean
over all textured pixels, on which its presets were t = 0.13 / 0.35 / 0.58.

Presets re-derived for the new statistic (bench/calibrate_motion_gate.py, tables
in bench/RESULTS.md, "Motion gate calibration"): t = 0.25 / 0.40 / 0.65, i.e.
0.33 / 0.67 / 1.86 px per frame at the 224 px working size.  Base keeps, with a
15 % margin, an 8 px object (at 224) moving 1.4 px/frame on a static camera
(scores 0.47-0.54; the literal statistic reads 0.04 px and kept nothing); slow
keeps objects from about a third of that speed; fast keeps StreamChat's fast
budget on the three sample clips (0.25 of their frames; StreamChat 0.17).  A
static camera (sensor noise up to 4 grey levels reads at most 0.06 px, score
0.06) keeps nothing at any preset.  On the sample clips, which move almost
everywhere, slow and base keep more than StreamChat's (0.98 and 0.74 of the
frames against 0.83 and 0.46): seeing small motion costs frames there.
"""
from __future__ import annotations

from dataclasses import dataclass

from streammem_kernels import StreamingMotionGate

__all__ = ["Preset", "PRESETS", "MotionGate"]


@dataclass(frozen=True)
class Preset:
    """StreamChat's speed presets: motion threshold t, chunk length L, group size g, centres C."""

    name: str
    threshold: float
    chunk: int
    group: int
    centres: int


PRESETS = {
    "slow": Preset("slow", 0.25, 35, 15, 5),
    "base": Preset("base", 0.40, 25, 10, 5),
    "fast": Preset("fast", 0.65, 30, 15, 5),
}


class MotionGate(StreamingMotionGate):
    """The kernels' :class:`~streammem_kernels.StreamingMotionGate` with StreamChat's speed presets.

    Same parameters, ``push``, ``state_dict`` and ``load_state_dict``; :meth:`from_preset` builds
    the gate of a preset ("slow", "base", "fast" or a :class:`Preset`).  Not thread-safe: one
    caller at a time (a gate is a sequential state machine over its stream).
    """

    @classmethod
    def from_preset(cls, preset: str | Preset, **kwargs) -> "MotionGate":
        if isinstance(preset, str) and preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {preset!r}")
        p = PRESETS[preset] if isinstance(preset, str) else preset
        return cls(p.threshold, **kwargs)
