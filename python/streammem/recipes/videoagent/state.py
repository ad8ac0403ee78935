"""A ``VideoAgent``'s state and its checkpoint file (``VideoAgent.save`` / ``VideoAgent.load``).

The state is the agent's index (every frame's time, query-space embedding, labels, optional
features and pixels), its caption cache and the loop's settings; the hooks (captioner, policy,
answerer, calibration) and the query encoder are code and models, passed again on load.  The file
is a ``streammem.checkpoint`` file (a header, a SHA-256 of the payload, atomic replacement), and
every field is checked on load, each failure one ``ValueError`` naming the path and the field:
finite embeddings and features, finite non-decreasing times, one label list per frame, uint8
pixels, caption frame ids inside the index and unique, counters and settings in range, and the
query encoder's dimension the index's.
"""
from __future__ import annotations

import numpy as np
import torch

from ...checkpoint import StateReader
from ...components.state_checks import check_format

__all__ = ["FORMAT", "VERSION", "KIND", "agent_state", "read_agent_state"]

FORMAT = "streammem.VideoAgent"
VERSION = 1
KIND = "VideoAgent"
SETTINGS = ("initial", "budget", "max_rounds", "frames_per_segment")


def agent_state(agent, captions: dict) -> dict:
    """The state of ``agent`` (its caption cache ``captions``: frame -> caption) as tensors, numbers,
    strings, lists and dicts (weights-only loadable)."""
    index = agent.index
    frames = None if index.frames is None else torch.from_numpy(np.ascontiguousarray(index.frames))
    return {
        "format": FORMAT, "version": VERSION,
        "settings": {name: getattr(agent, name) for name in SETTINGS} | {"backend": agent.backend},
        "query_dim": int(index.dim),
        "index": {"timestamps": index.timestamps.clone(), "embeddings": index.embeddings.detach().cpu().clone(),
                  "labels": [list(lab) for lab in index.labels],
                  "features": None if index.features is None else index.features.detach().cpu().clone(),
                  "frames": frames},
        "captions": {"frame": [int(i) for i in captions], "text": list(captions.values())},
        "captions_computed": int(agent.captions_computed),
    }


def read_agent_state(reader: StateReader, query_dim: int | None = None) -> dict:
    """Check a state of :func:`agent_state` (see the module docstring); returns the constructor's
    arguments (``index`` as a dict of ``VideoIndex`` fields, the settings) and the caption cache."""
    check_format(reader, "VideoAgent", FORMAT, VERSION, kind="state")
    settings = reader.sub("settings")
    out = {name: settings.int(name, low=0 if name == "max_rounds" else 1, high=1 << 31) for name in SETTINGS}
    out["backend"] = settings.str("backend")
    idx = reader.sub("index")
    emb = idx.tensor("embeddings", dtype=torch.float32, ndim=2, finite=True)
    n, dim = emb.shape
    idx.require(n >= 1 and dim >= 1, "embeddings", f"must be (T, E) with T, E >= 1, got {tuple(emb.shape)}")
    stored = reader.int("query_dim", low=1)
    reader.require(stored == dim, "query_dim", f"must be the embeddings' width {dim}, got {stored}")
    reader.require(query_dim is None or query_dim == dim, "query_dim",
                   f"is {dim}: the index was built for a {dim}-d query encoder, this one embeds {query_dim}-d vectors")
    times = idx.tensor("timestamps", dtype=torch.float64, shape=(n,), finite=True)
    idx.require(n < 2 or bool((times[1:] >= times[:-1]).all()), "timestamps", "must be non-decreasing")
    labels = idx.list("labels", length=n)
    for i, row in enumerate(labels):
        idx.require(isinstance(row, (list, tuple)) and all(isinstance(x, str) for x in row), f"labels[{i}]",
                    "must be a list of strings")
    features = idx.tensor("features", dtype=torch.float32, ndim=2, shape=(n, None), finite=True, optional=True)
    frames = idx.tensor("frames", dtype=torch.uint8, ndim=4, shape=(n, None, None, 3), optional=True)
    cap = reader.sub("captions")
    ids = cap.ints("frame", low=0, high=n - 1)
    cap.require(len(set(ids)) == len(ids), "frame", "must hold each frame once")
    texts = cap.strs("text", length=len(ids))
    reader.int("captions_computed", low=0)
    out["index"] = {"timestamps": times.clone(), "embeddings": emb.clone(), "labels": labels,
                    "features": None if features is None else features.clone(),
                    "frames": None if frames is None else frames.numpy().copy()}
    out["captions"] = dict(zip(ids, texts))
    out["captions_computed"] = int(reader.state["captions_computed"])
    return out
