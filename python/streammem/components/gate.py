"""Selective frame stacking (StreamChat sec. 3.1.1): the kernels' streaming motion gate with the presets.

A frame enters the vision buffer only when its Lucas-Kanade motion score
against the previous frame exceeds the threshold t; ``score = flow_px / (1 + flow_px)``
in [0, 1).  The first frame of a stream is always kept (there is nothing to compare
it with, and memory must start somewhere).  The thresholds of the Slow / Base /
Fast presets, and how they were derived, are in ``config.PRESETS``; with ``statistic="streamchat"``
(StreamChat's own reading) a preset's threshold is StreamChat's own, ``config.STREAMCHAT_THRESHOLDS``.
"""
from __future__ import annotations

from streammem_kernels import StreamingMotionGate

from ..config import PRESETS, STREAMCHAT_THRESHOLDS, Preset

__all__ = ["MotionGate"]


class MotionGate(StreamingMotionGate):
    """The kernels' :class:`~streammem_kernels.StreamingMotionGate` with StreamChat's speed presets.

    Same parameters, ``push``, ``state_dict`` and ``load_state_dict``; :meth:`from_preset` builds
    the gate of a preset ("slow", "base", "fast" or a :class:`Preset`).  Not thread-safe: one
    caller at a time (a gate is a sequential state machine over its stream).

    A named preset built with ``statistic="streamchat"`` takes StreamChat's own threshold of that
    preset (0.13 / 0.35 / 0.58, ``STREAMCHAT_THRESHOLDS``): the statistic reads on StreamChat's scale,
    where the presets' re-derived thresholds (set for the "moving" statistic) do not apply.  A
    :class:`Preset` object keeps its own threshold.
    """

    @classmethod
    def from_preset(cls, preset: str | Preset, **kwargs) -> "MotionGate":
        if isinstance(preset, str) and preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {preset!r}")
        p = PRESETS[preset] if isinstance(preset, str) else preset
        if isinstance(preset, str) and kwargs.get("statistic") == "streamchat":
            return cls(STREAMCHAT_THRESHOLDS[preset], **kwargs)
        return cls(p.threshold, **kwargs)
