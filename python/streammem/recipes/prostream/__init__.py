"""The ProStream recipe (``memory``): a bounded hierarchical memory of a dialogue stream with ad-hoc recall."""
from .memory import (
    Turn, Question, read_dialogue, write_dialogue, Distillate, Distiller, ExtractiveDistiller, ModelDistiller,
    ProStreamConfig, DialogueTree, RecalledUnit, Recall, ProStream, FlatTurnMemory, SyntheticDialogue,
    synthetic_dialogue, evaluate, recalls_answer, informative_tokens, KINDS, ProStreamStats,
)

__all__ = [
    "Turn",
    "Question",
    "read_dialogue",
    "write_dialogue",
    "Distillate",
    "Distiller",
    "ExtractiveDistiller",
    "ModelDistiller",
    "ProStreamConfig",
    "DialogueTree",
    "RecalledUnit",
    "Recall",
    "ProStream",
    "FlatTurnMemory",
    "SyntheticDialogue",
    "synthetic_dialogue",
    "evaluate",
    "recalls_answer",
    "informative_tokens",
    "KINDS",
    "ProStreamStats",
]
