"""``ProStreamConfig``: every parameter of a ``ProStream`` memory in one frozen object."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import numpy as np

__all__ = ["ProStreamConfig"]


_ACCESS = ("context", "answer", "none")


@dataclass(frozen=True)
class ProStreamConfig:
    """Every parameter of a :class:`ProStream` memory.

    Parameters
    ----------
    drift : float in [-1, 1]
        Cut a segment where cos(turn_t, turn_{t-1}) < drift (ProStream sec. 5.1).
    max_event : int >= 1
        A segment closes when it reaches this many turns.
    session_gap : float > 0
        Seconds of silence that close the session.
    budget : int >= 1
        Token budget of the memory (``BoundedMemory``: a node costs its words + 1).
    alpha, beta, tau, low_water
        Retention utility u = alpha log(f + 1) + beta exp(-dt / tau) (tau in
        stream seconds; :meth:`ProStream.expected_utility`) and eviction
        hysteresis (after a round the memory holds at most low_water x budget).
    theta_concept : float in [-1, 1] or None
        ``BoundedMemory``'s novelty check (skip a turn this close to a stored
        one).  Off by default: in a dialogue an update ("X is now B") is close
        to what it replaces, and skipping it would keep the stale version.
    beam : (int, int)
        Sessions kept, then segments kept.  ProStream keeps 5 scenes and 10
        events each (5, 50); the default is wider because an extractive session
        summary quotes only ``session_sentences`` sentences, so a session whose
        summary does not mention the asked fact is often outside a 5-session
        beam: on ``synthetic_dialogue(10_000)`` top-1 accuracy is 0.57 with
        (5, 50), 0.73 with (20, 100) and 0.74 exhaustive (hashing encoder).
    k : int >= 1
        Turns returned per recall.
    min_similarity : float
        Turns with cosine below it are never returned.
    access : {"context", "answer", "none"}
        Which recalled turns count a use (every returned turn, the best one,
        none) -- for the eviction utility only.
    rank_utility : float >= 0
        Recall ranks turns by cos(q, v) x w with w = 1 + ``rank_utility`` x u:
        0 ranks by cosine alone, larger values let the eviction utility u
        (uses, recency) lift a turn.  Small by default: counting a recall's
        answer as a use would otherwise let a turn that was (wrongly) recalled
        once keep winning -- a feedback loop that the synthetic stream shows.
    superseded_weight : float in (0, 1]
        w is further multiplied by this for a superseded turn (every fact it
        stated has a newer value), so the newer statement ranks above it.
    key_weight : float >= 1
        w is further multiplied by this for a keyed unit whose entity the
        question names, so "What is Marlow's car?" is answered by Marlow's car
        unit rather than by a turn that merely repeats the question's words
        ("What was Marlow's car again?").  1: entity names are not used.
    cite_threshold : float
        Citation by similarity for distillers that do not cite (``Distillate.cited``
        None); citations are counted in the statistics only.
    backend : str
        Kernel backend for every op.

    ``ProStreamConfig.for_encoder("minilm" | "hashing")`` gives the thresholds
    calibrated for the built-in text encoders on :func:`synthetic_dialogue`
    (the defaults are MiniLM's).
    """

    drift: float = 0.3
    max_event: int = 24
    session_gap: float = 1800.0
    budget: int = 6000
    alpha: float = 0.6
    beta: float = 0.4
    tau: float = 3600.0
    low_water: float = 0.8
    theta_concept: float | None = None
    beam: tuple[int, int] = (20, 100)
    k: int = 5
    min_similarity: float = 0.35
    access: str = "answer"
    rank_utility: float = 0.05
    superseded_weight: float = 0.5
    key_weight: float = 2.0
    cite_threshold: float = 0.5
    backend: str = "auto"

    def __post_init__(self):
        def real(name, low=None, high=None, open_low=False, optional=False):
            value = getattr(self, name)
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            if low is not None and (value <= low if open_low else value < low):
                raise ValueError(f"{name} must be {'>' if open_low else '>='} {low}, got {value!r}")
            if high is not None and value > high:
                raise ValueError(f"{name} must be <= {high}, got {value!r}")
            object.__setattr__(self, name, float(value))

        def integer(name, low):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
            object.__setattr__(self, name, int(value))

        real("drift", -1.0, 1.0)
        integer("max_event", 1)
        real("session_gap", 0.0, open_low=True)
        integer("budget", 1)
        real("alpha")
        real("beta")
        real("tau", 0.0, open_low=True)
        real("low_water", 0.0, 1.0, open_low=True)
        real("theta_concept", -1.0, 1.0, optional=True)
        beam = self.beam
        if (not isinstance(beam, (tuple, list)) or len(beam) != 2
                or not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1 for b in beam)):
            raise ValueError(f"beam must be (sessions, segments), two ints >= 1, got {beam!r}")
        object.__setattr__(self, "beam", (int(beam[0]), int(beam[1])))
        integer("k", 1)
        real("min_similarity", -1.0, 1.0)
        if self.access not in _ACCESS:
            raise ValueError(f"access must be one of {_ACCESS}, got {self.access!r}")
        real("rank_utility", 0.0)
        real("superseded_weight", 0.0, 1.0, open_low=True)
        real("key_weight", 1.0)
        real("cite_threshold", -1.0, 1.0)
        if not isinstance(self.backend, str):
            raise ValueError(f"backend must be a string, got {self.backend!r}")

    @classmethod
    def for_encoder(cls, name: str, **changes) -> "ProStreamConfig":
        """Thresholds calibrated for a built-in text encoder ("minilm" / "all-MiniLM-L6-v2" or "hashing")."""
        if name in ("minilm", "all-MiniLM-L6-v2"):
            base = {}
        elif name == "hashing":
            base = {"drift": 0.08, "min_similarity": 0.3}
        else:
            raise ValueError(f"name must be 'minilm' or 'hashing' (calibrated encoders), got {name!r}")
        base.update(changes)
        return cls(**base)

    def replace(self, **changes) -> "ProStreamConfig":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["beam"] = list(self.beam)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ProStreamConfig":
        if not isinstance(data, dict):
            raise ValueError(f"data must be a dict from ProStreamConfig.to_dict(), got {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"data has unknown ProStreamConfig fields {unknown}")
        data = dict(data)
        if "beam" in data and isinstance(data["beam"], list):
            data["beam"] = tuple(data["beam"])
        return cls(**data)
