"""``MemoryConfig``: every parameter of a ``StreamMemory`` in one frozen object, with presets.

One object replaces the loose keywords and ``*_kwargs`` dicts the pipeline used
to take, so a memory can be described, compared, saved next to a checkpoint
(``to_dict`` / ``from_dict``, JSON-friendly) and rebuilt in another process.

>>> cfg = MemoryConfig.from_preset("base", budget=2000)           # StreamChat Base + a token budget
>>> cfg = cfg.replace(segmenter=SegmenterConfig(drift=0.6))         # ProStream drift segmentation
>>> MemoryConfig.from_dict(cfg.to_dict()) == cfg
True

The presets are StreamChat's Slow / Base / Fast (motion threshold t, chunk L,
group g, centres C: ``PRESETS``) with every other parameter at its default.
Scheduling parameters (queue sizes, frames per gate call, threads) are not
memory parameters and stay with ``StreamPipeline``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .checks import check_int, check_real

__all__ = ["MemoryConfig", "SegmenterConfig", "BoundedConfig", "ShortTermConfig", "InjectorConfig", "Preset",
           "PRESETS", "STREAMCHAT_THRESHOLDS"]


@dataclass(frozen=True)
class Preset:
    """StreamChat's speed presets: motion threshold t, chunk length L, group size g, centres C."""

    name: str
    threshold: float
    chunk: int
    group: int
    centres: int


# StreamChat's thresholds t (0.13 / 0.35 / 0.58) were set on its own single-scale reading (what
# statistic="streamchat" computes, STREAMCHAT_THRESHOLDS below); these are re-derived for the gate's
# default pyramid and "moving" statistic
# (bench/calibrate_motion_gate.py prints the calibration tables):
# t = 0.25 / 0.40 / 0.65, i.e. 0.33 / 0.67 / 1.86 px per frame at the 224 px working size.  Base
# keeps, with a 15 % margin, an 8 px object (at 224) moving 1.4 px/frame on a static camera (scores
# 0.47-0.54; the literal statistic reads 0.04 px and kept nothing); slow keeps objects from about a
# third of that speed; fast keeps StreamChat's fast budget on the three sample clips (0.25 of their
# frames; StreamChat 0.17).  A static camera (sensor noise up to 4 grey levels reads at most 0.06 px,
# score 0.06) keeps nothing at any preset.  On the sample clips, which move almost everywhere, slow
# and base keep more than StreamChat's (0.98 and 0.74 of the frames against 0.83 and 0.46): seeing
# small motion costs frames there.
PRESETS = {
    "slow": Preset("slow", 0.25, 35, 15, 5),
    "base": Preset("base", 0.40, 25, 10, 5),
    "fast": Preset("fast", 0.65, 30, 15, 5),
}
# StreamChat's own thresholds of the presets, on its own reading: the gate's statistic="streamchat"
# (motion_magnitude) computes that reading, so these apply unchanged there (MotionGate.from_preset
# takes them when the gate is built with that statistic).
STREAMCHAT_THRESHOLDS = {"slow": 0.13, "base": 0.35, "fast": 0.58}


# Upper bounds that stop a typo from allocating (or looping) without end; each is far
# above any published setting (StreamChat: motion size 224, window 8, 10 k-means iterations).
MAX_MOTION_SIZE = 8192
MAX_SEGMENTER_WINDOW = 4096
MAX_KMEANS_ITERS = 10_000
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class ShortTermConfig:
    """StreamChat Eq. 2: keep S of the newest N frames with probability ∝ exp(-age / tau)."""

    candidates: int = 20
    keep: int = 5
    tau: float = 5.0

    def __post_init__(self):
        object.__setattr__(self, "candidates", check_int(self.candidates, "short_term.candidates", 1))
        object.__setattr__(self, "keep", check_int(self.keep, "short_term.keep", 1))
        object.__setattr__(self, "tau", check_real(self.tau, "short_term.tau", 0.0, open_low=True))


@dataclass(frozen=True)
class SegmenterConfig:
    """``StreamingSegmenter`` parameters of the event knowledge base (StreamRAG; drift: ProStream).

    ``window`` is at most 4096 frames (the segmenter holds a window of features).  ``flash`` is the
    kernel's flash rule, off (0) by default here: the segmenter sees the motion gate's kept frames, where
    a still shot between two cuts is a single kept frame, which the rule would take for a transient and
    so lose both cuts.  Turn it on (at most ``(window - 1) // 2``) to drop glitches when every frame is kept.
    """

    window: int = 8
    tau: float = 0.7
    min_depth: float = 0.2
    max_event: int | None = 250
    drift: float | None = None
    flash: int = 0

    def __post_init__(self):
        object.__setattr__(self, "window", check_int(self.window, "segmenter.window", 2,
                                                                 MAX_SEGMENTER_WINDOW))
        object.__setattr__(self, "tau", check_real(self.tau, "segmenter.tau", 0.0))
        object.__setattr__(self, "min_depth", check_real(self.min_depth, "segmenter.min_depth", 0.0))
        if self.max_event is not None:
            object.__setattr__(self, "max_event", check_int(self.max_event, "segmenter.max_event", 1))
        if self.drift is not None:
            object.__setattr__(self, "drift", check_real(self.drift, "segmenter.drift", -1.0, 1.0))
        object.__setattr__(self, "flash", check_int(self.flash, "segmenter.flash", 0, (self.window - 1) // 2))


@dataclass(frozen=True)
class BoundedConfig:
    """``BoundedMemory`` parameters (ProStream sec. 5.3): a token budget and the utility constants.

    ``alpha`` and ``beta`` are finite weights >= 0; ``tokens_per_centre`` an int >= 1.
    """

    budget: int
    alpha: float = 0.6
    beta: float = 0.4
    tau: float = 60.0
    theta_sim: float = 0.85
    theta_concept: float | None = 0.95
    tokens_per_centre: int = 1
    low_water: float = 0.8

    def __post_init__(self):
        object.__setattr__(self, "budget", check_int(self.budget, "bounded.budget", 1))
        object.__setattr__(self, "alpha", check_real(self.alpha, "bounded.alpha", 0.0))
        object.__setattr__(self, "beta", check_real(self.beta, "bounded.beta", 0.0))
        object.__setattr__(self, "tau", check_real(self.tau, "bounded.tau", 0.0, open_low=True))
        object.__setattr__(self, "theta_sim", check_real(self.theta_sim, "bounded.theta_sim", -1.0, 1.0))
        if self.theta_concept is not None:
            object.__setattr__(self, "theta_concept",
                               check_real(self.theta_concept, "bounded.theta_concept", -1.0, 1.0))
        object.__setattr__(self, "tokens_per_centre", check_int(self.tokens_per_centre, "bounded.tokens_per_centre", 1))
        object.__setattr__(self, "low_water", check_real(self.low_water, "bounded.low_water", 0.0, 1.0,
                                                          open_low=True))

    def kwargs(self) -> dict:
        """Keyword arguments of ``BoundedMemory`` (everything but the budget)."""
        out = dataclasses.asdict(self)
        del out["budget"]
        return out


@dataclass(frozen=True)
class InjectorConfig:
    """StreamRAG sec. 3.4 knowledge injection: S_c = gamma S_t + (1 - gamma)(1 - S_r), thresholds."""

    gamma: float = 0.5
    theta1: float = 0.6
    theta2: float = 0.4

    def __post_init__(self):
        object.__setattr__(self, "gamma", check_real(self.gamma, "injector.gamma", 0.0, 1.0))
        object.__setattr__(self, "theta1", check_real(self.theta1, "injector.theta1"))
        object.__setattr__(self, "theta2", check_real(self.theta2, "injector.theta2"))
        if self.theta2 > self.theta1:
            raise ValueError(f"injector.theta2 must be <= injector.theta1, got {self.theta2!r} > {self.theta1!r}")


_NESTED = {"short_term": ShortTermConfig, "segmenter": SegmenterConfig, "bounded": BoundedConfig,
           "injector": InjectorConfig, "preset": Preset}


@dataclass(frozen=True)
class MemoryConfig:
    """Everything that decides what a ``StreamMemory`` remembers and retrieves.

    Parameters
    ----------
    preset : Preset or {"slow", "base", "fast"}
        StreamChat's (t, L, g, C): motion threshold, frames per leaf, nodes per
        parent, k-means centres per node (a name becomes its ``PRESETS`` entry).
    motion_size : int in [8, 8192] or None
        Working resolution (long side) of the motion gate; None keeps the input size.
    motion_window : int or None
        Lucas-Kanade window (odd >= 3) or None for the paper's global solve.
    motion_reference : {"previous", "last_kept"}
    motion_statistic : {"moving", "textured"}
        The gate's statistic (``MotionGate``): "moving" (default) or StreamChat's "textured".
    motion_levels : int or "auto"
        Pyramid levels of the gate's Lucas-Kanade (1: single scale).
    short_term : ShortTermConfig
    kmeans_iters : int in [1, 10000]
        Iterations of every ``batched_kmeans`` call.
    segmenter : SegmenterConfig
    bounded : BoundedConfig or None
        None: the long-term memory grows without bound.
    injector : InjectorConfig
    dialogue_k : int
        Dialogue entries retrieved per question.
    seed : int in [0, 2**63 - 1]
        Seeds the short-term sampler and k-means, so a run is reproducible.
    backend : {"auto", "torch", "cpp", "triton", "cuda"}
        Kernel backend for every op.

    Every field is validated on construction (also by ``replace`` and
    ``from_dict``): a wrong value raises ``ValueError`` naming the field and
    what it expects, NaN and infinity included.
    """

    preset: Preset = PRESETS["base"]
    motion_size: int | None = 224
    motion_window: int | None = 5
    motion_reference: str = "previous"
    motion_statistic: str = "moving"
    motion_levels: int | str = "auto"
    short_term: ShortTermConfig = field(default_factory=ShortTermConfig)
    kmeans_iters: int = 10
    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    bounded: BoundedConfig | None = None
    injector: InjectorConfig = field(default_factory=InjectorConfig)
    dialogue_k: int = 3
    seed: int = 0
    backend: str = "auto"

    def __post_init__(self):
        if isinstance(self.preset, str) and self.preset in PRESETS:
            object.__setattr__(self, "preset", PRESETS[self.preset])
        if not isinstance(self.preset, Preset):
            raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {self.preset!r}")
        p = self.preset
        check_real(p.threshold, "preset.threshold", 0.0, 1.0)
        for name, value, low in (("chunk", p.chunk, 1), ("group", p.group, 2), ("centres", p.centres, 1)):
            check_int(value, f"preset.{name}", low)
        if self.motion_size is not None:
            object.__setattr__(self, "motion_size", check_int(self.motion_size, "motion_size", 8,
                                                                            MAX_MOTION_SIZE))
        if self.motion_window is not None:
            w = check_int(self.motion_window, "motion_window", 3)
            if w % 2 == 0:
                raise ValueError(f"motion_window must be odd, got {w}")
            object.__setattr__(self, "motion_window", w)
        if self.motion_reference not in ("previous", "last_kept"):
            raise ValueError(f"motion_reference must be 'previous' or 'last_kept', got {self.motion_reference!r}")
        if self.motion_statistic not in ("moving", "textured"):
            raise ValueError(f"motion_statistic must be 'moving' or 'textured', got {self.motion_statistic!r}")
        if self.motion_levels != "auto":
            object.__setattr__(self, "motion_levels", check_int(self.motion_levels, "motion_levels", 1))
        for name, cls in (("short_term", ShortTermConfig), ("segmenter", SegmenterConfig),
                          ("injector", InjectorConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        if self.bounded is not None and not isinstance(self.bounded, BoundedConfig):
            raise ValueError(f"bounded must be a BoundedConfig or None, got {self.bounded!r}")
        object.__setattr__(self, "kmeans_iters", check_int(self.kmeans_iters, "kmeans_iters", 1,
                                                                          MAX_KMEANS_ITERS))
        object.__setattr__(self, "dialogue_k", check_int(self.dialogue_k, "dialogue_k", 1))
        object.__setattr__(self, "seed", check_int(self.seed, "seed", 0, MAX_SEED))
        from streammem_kernels import BACKENDS

        if not isinstance(self.backend, str) or self.backend not in ("auto",) + BACKENDS:
            raise ValueError(f"backend must be one of {('auto',) + BACKENDS}, got {self.backend!r}")

    # ---- construction ------------------------------------------------------
    @classmethod
    def from_preset(cls, name: str | Preset = "base", *, budget: int | None = None, **changes) -> "MemoryConfig":
        """A preset ("slow", "base", "fast" or a ``Preset``) with changes.

        ``budget=N`` is short for ``bounded=BoundedConfig(N)``; any other
        keyword is a field of ``MemoryConfig``.
        """
        if isinstance(name, str):
            if name not in PRESETS:
                raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {name!r}")
            name = PRESETS[name]
        if budget is not None:
            if "bounded" in changes:
                raise ValueError("give either budget or bounded, not both")
            changes["bounded"] = BoundedConfig(budget)
        return cls(preset=name, **changes)

    def replace(self, **changes) -> "MemoryConfig":
        """A copy with some fields changed (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    # ---- serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        """Plain dict of numbers, strings, None and nested dicts (JSON-friendly)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MemoryConfig":
        """Inverse of ``to_dict``; unknown keys raise ValueError (a config from a newer version)."""
        if not isinstance(data, dict):
            raise ValueError(f"data must be a dict from MemoryConfig.to_dict(), got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"data has unknown MemoryConfig fields {unknown}")
        kwargs = {}
        for key, value in data.items():
            if key in _NESTED and isinstance(value, dict):
                fields = {f.name for f in dataclasses.fields(_NESTED[key])}
                if set(value) - fields:
                    raise ValueError(f"data[{key!r}] has unknown {_NESTED[key].__name__} fields "
                                     f"{sorted(set(value) - fields)}")
                value = _NESTED[key](**value)
            kwargs[key] = value
        return cls(**kwargs)
