"""``MemVerseConfig``: every parameter of a ``MemVerse`` memory in one frozen object."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ...checks import check_int, check_real
from ...config import PRESETS, SegmenterConfig

__all__ = ["MemVerseConfig", "RANKINGS", "MODES"]


RANKINGS = ("round-robin", "score")
MODES = ("graph", "hybrid", "flat")
FACT_ORDERS = ("rank", "lightrag")
SCAN_COPIES = ("int8", "float16", "none")


@dataclass(frozen=True)
class MemVerseConfig:
    """Every parameter of a :class:`MemVerse` memory.

    Parameters
    ----------
    window : int
        Short-term memory: the newest chunks of the session handed to every question.
    consolidate_every : int
        Chunks that left the window are consolidated into the graph in batches
        of this many (a question or ``end_session`` consolidates the rest first,
        so no chunk is ever out of reach).
    seeds : int
        k of the cosine top-k over node embeddings.
    hops : int
        Neighbourhood depth around the seeds.
    max_fanout, max_frontier : int or None
        Caps of the expansion (entries followed per node; nodes per hop).
    capacity : int
        Nodes listed per question (>= ``seeds``).
    min_score : float or None
        Seeds with a lower cosine are dropped.
    chunks : int
        Long-term chunks returned per question (K).
    chunks_per_node : int or None
        Chunks one node contributes at most (its newest).
    ranking : {"round-robin", "score"}
        Order of the neighbourhood's nodes: by score, with the seeds taking
        turns ("round-robin"), or by score alone (see the module docstring).
    mode : {"graph", "hybrid", "flat"}
        Long-term chunks of :meth:`MemVerse.ask`: the graph's, the flat
        baseline's, or both interleaved (flat first, duplicates skipped).
    resolve_possessives : bool
        Graph and hybrid modes: a question's ``"X's R"`` is first resolved
        through X's relation R to the entity it names, and the question asked
        about that entity (``hops.resolve_possessives``; the relation's chunks
        lead the graph's; the hybrid's flat half is asked the rewritten
        question too).  The flat mode never resolves.
    facts : int
        Relations reported per question.
    facts_order : {"rank", "lightrag"}
        Which relations and in what order: the best-ranked relations of the
        neighbourhood ("rank"), or LightRAG's local-query listing -- every
        relation touching the seeds, by the sum of its endpoints' degrees, then
        its weight (``LongTermGraph.seed_relations``).
    budget : int or None
        Word budget of the long-term memory (None: unbounded).
    alpha, beta, tau, low_water
        Utility rule and hysteresis of the budget: ``BoundedMemory``'s alpha,
        beta and low_water; tau (seconds of stream time) 600 rather than its 60,
        as a multi-session memory spans hours.
    preset : str
        Motion-gate threshold of video input (StreamChat preset name).
    motion_threshold : float or None
        Overrides the preset's threshold (0 keeps every frame).
    motion_size : int or None
        Working resolution of the motion gate.
    segmenter : SegmenterConfig
        Video events (one chunk per event).
    labels_per_chunk : int
        A video chunk's labels: its frames' most frequent labels.
    backend : str
        Kernel backend of every op.
    scan_copy : {"int8", "float16", "none"}
        The copy of the graph's node and chunk embeddings its cosine scans read first
        (``LongTermGraph``'s ``scan_copy``): answers are the same, bit for bit, whichever; "int8" reads
        a quarter of the float32 bytes for +25 % of the embeddings' memory, "none" keeps no copy.
    """

    window: int = 8
    consolidate_every: int = 4
    seeds: int = 4
    hops: int = 2
    max_fanout: int | None = 64
    max_frontier: int | None = None
    capacity: int = 512
    min_score: float | None = None
    chunks: int = 8
    chunks_per_node: int | None = 2
    ranking: str = "round-robin"
    mode: str = "graph"
    resolve_possessives: bool = True
    facts: int = 8
    facts_order: str = "rank"
    budget: int | None = None
    alpha: float = 0.6
    beta: float = 0.4
    tau: float = 600.0
    low_water: float = 0.8
    preset: str = "base"
    motion_threshold: float | None = None
    motion_size: int | None = 224
    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    labels_per_chunk: int = 5
    backend: str = "auto"
    scan_copy: str = "int8"

    def __post_init__(self):
        for name, low in (("window", 1), ("consolidate_every", 1), ("seeds", 1), ("hops", 0), ("capacity", 1),
                          ("chunks", 1), ("facts", 0), ("labels_per_chunk", 1)):
            object.__setattr__(self, name, check_int(getattr(self, name), name, low))
        for name in ("max_fanout", "max_frontier", "chunks_per_node", "budget", "motion_size"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(getattr(self, name), name, 1))
        if self.capacity < self.seeds:
            raise ValueError(f"capacity must be >= seeds ({self.seeds}), got {self.capacity}")
        if self.min_score is not None:
            object.__setattr__(self, "min_score", check_real(self.min_score, "min_score", -1.0, 1.0))
        object.__setattr__(self, "alpha", check_real(self.alpha, "alpha"))
        object.__setattr__(self, "beta", check_real(self.beta, "beta"))
        object.__setattr__(self, "tau", check_real(self.tau, "tau", 0.0, open_low=True))
        object.__setattr__(self, "low_water", check_real(self.low_water, "low_water", 0.0, 1.0, open_low=True))
        if not isinstance(self.resolve_possessives, bool):
            raise ValueError(f"resolve_possessives must be a bool, got {self.resolve_possessives!r}")
        if self.ranking not in RANKINGS:
            raise ValueError(f"ranking must be one of {RANKINGS}, got {self.ranking!r}")
        if self.facts_order not in FACT_ORDERS:
            raise ValueError(f"facts_order must be one of {FACT_ORDERS}, got {self.facts_order!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.preset not in PRESETS:
            raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}")
        if self.motion_threshold is not None:
            object.__setattr__(self, "motion_threshold",
                               check_real(self.motion_threshold, "motion_threshold", 0.0, 1.0))
        if isinstance(self.segmenter, dict):
            object.__setattr__(self, "segmenter", SegmenterConfig(**self.segmenter))
        if not isinstance(self.segmenter, SegmenterConfig):
            raise ValueError(f"segmenter must be a SegmenterConfig, got {self.segmenter!r}")
        if not isinstance(self.backend, str):
            raise ValueError(f"backend must be a string, got {self.backend!r}")
        if self.scan_copy not in SCAN_COPIES:
            raise ValueError(f"scan_copy must be one of {SCAN_COPIES}, got {self.scan_copy!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "MemVerseConfig":
        if not isinstance(data, dict):
            raise ValueError(f"data must be a dict from MemVerseConfig.to_dict(), got {type(data).__name__}")
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"data has unknown MemVerseConfig fields {unknown}")
        return cls(**data)
