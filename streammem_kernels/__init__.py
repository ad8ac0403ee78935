"""streammem-kernels: fast kernels for streaming video and dialogue memory.

One public function per op, torch tensors in and out (numpy accepted), with
``backend="auto" | "torch" | "cpp" | "triton" | "cuda"``; ``backend_report()``
says which can run here and why not.  See each op module's docstring for its
shape contract.  Importing the package is cheap: native
modules and Triton load lazily on first use.  OpenMP threads wait passively
unless torch was imported first or the environment chooses
(:mod:`.runtime.threads`, imported before anything loads torch).
"""
from .runtime import threads as _threads  # noqa: F401  (first: libgomp reads the wait policy as torch loads)
from .backends import BackendReport, backend_report
from .boundaries import Event, SegmentStep, adjacent_cosine, depth_scores, detect_boundaries, event_ends
from .boundaries.streaming import StreamingSegmenter
from .graph import (CSRGraph, GraphRetrieval, Neighbourhood, SourceChunks, graph_retrieve, khop_neighbourhood,
                    neighbourhood_chunks)
from .kmeans import KMeansResult, batched_kmeans, kmeans_frames
from .kmeans.estimator import KMeans, NotFittedError
from .logprobs import divergence_point, linear_token_logprobs, token_logprobs
from .motion import MotionResult, motion_magnitude, select_frames, select_frames_mask
from .motion.streaming import StreamingMotionGate
from .runtime.dispatch import BACKENDS, BackendFallbackWarning
from .tree import CosineIndex, CosineTree, TopKResult, TreePathResult, cosine_topk, tree_search

__all__ = [
    "BACKENDS",
    "BackendFallbackWarning",
    "BackendReport",
    "backend_report",
    "Event",
    "SegmentStep",
    "StreamingSegmenter",
    "adjacent_cosine",
    "depth_scores",
    "detect_boundaries",
    "event_ends",
    "KMeans",
    "KMeansResult",
    "NotFittedError",
    "batched_kmeans",
    "kmeans_frames",
    "MotionResult",
    "motion_magnitude",
    "select_frames",
    "select_frames_mask",
    "StreamingMotionGate",
    "CosineIndex",
    "CosineTree",
    "TopKResult",
    "TreePathResult",
    "cosine_topk",
    "tree_search",
    "CSRGraph",
    "GraphRetrieval",
    "Neighbourhood",
    "SourceChunks",
    "graph_retrieve",
    "khop_neighbourhood",
    "neighbourhood_chunks",
    "token_logprobs",
    "linear_token_logprobs",
    "divergence_point",
]
from ._version import __version__  # noqa: E402  (the one place the version is written)
