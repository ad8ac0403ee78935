"""The MemVerse recipe (``memory``, ``synthetic``): a short-term window and a long-term multimodal knowledge graph."""
from .memory import (
    MemVerse, MemVerseConfig, MemVerseContext, MemoryChunk, Extraction, ExtractionContext, Extractor,
    CooccurrenceExtractor, LongTermGraph, GraphHits, GraphEvictionReport, extend_csr, compact_csr, name_key,
    interleave,
)
from .synthetic import (
    PlantedItem, PlantedQuestion, PlantedFactMemory, GroundTruthExtractor, hit_rates,
)

__all__ = [
    "MemVerse",
    "MemVerseConfig",
    "MemVerseContext",
    "MemoryChunk",
    "Extraction",
    "ExtractionContext",
    "Extractor",
    "CooccurrenceExtractor",
    "LongTermGraph",
    "GraphHits",
    "GraphEvictionReport",
    "extend_csr",
    "compact_csr",
    "name_key",
    "interleave",
    "PlantedItem",
    "PlantedQuestion",
    "PlantedFactMemory",
    "GroundTruthExtractor",
    "hit_rates",
]
