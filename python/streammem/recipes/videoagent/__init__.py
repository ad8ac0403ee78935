"""The VideoAgent recipe (``agent``): long-video question answering by iterative frame retrieval."""
from .agent import (
    VideoIndex, LabelTextEmbedder, FrameCaptioner, CaptionerAdapter, AgentState, Assessment,
    AnswerabilityPolicy, RetrievalConfidencePolicy, Answer, Answerer, CaptionVoteAnswerer, RoundLog,
    AgentResult, VideoAgent, uniform_indices, unobserved_segments, PlantedQuestion, PlantedEventVideo, evaluate,
    STRATEGIES,
)

__all__ = [
    "VideoIndex",
    "LabelTextEmbedder",
    "FrameCaptioner",
    "CaptionerAdapter",
    "AgentState",
    "Assessment",
    "AnswerabilityPolicy",
    "RetrievalConfidencePolicy",
    "Answer",
    "Answerer",
    "CaptionVoteAnswerer",
    "RoundLog",
    "AgentResult",
    "VideoAgent",
    "uniform_indices",
    "unobserved_segments",
    "PlantedQuestion",
    "PlantedEventVideo",
    "evaluate",
    "STRATEGIES",
]
