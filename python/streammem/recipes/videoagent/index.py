"""The frame index of VideoAgent: every frame once, in the question encoder's space, and frame positions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from streammem_kernels import CosineIndex

from ...components.memory import FrameRecord
from ...models.encoders import EncodedFrames, encode_frames, encode_texts

__all__ = ["VideoIndex", "LabelTextEmbedder", "uniform_indices", "unobserved_segments"]


def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def uniform_indices(num_frames: int, n: int) -> list[int]:
    """``n`` frame indices spread uniformly over ``num_frames``: the centre of each of n equal parts.

    ``floor((i + 0.5) * num_frames / n)`` for i < n, so the first and last
    parts are sampled as densely as the middle; every frame when
    ``n >= num_frames``.
    """
    num_frames = _check_count(num_frames, "num_frames", 1)
    n = _check_count(n, "n", 1)
    if n >= num_frames:
        return list(range(num_frames))
    return [int((2 * i + 1) * num_frames // (2 * n)) for i in range(n)]


def unobserved_segments(observed: Iterable[int], num_frames: int) -> torch.Tensor:
    """(S, 2) int64 ``[start, end)`` runs of frames not in ``observed``, in time order.

    The segments between consecutive observed frames, plus the ones before the
    first and after the last; empty runs are left out.
    """
    num_frames = _check_count(num_frames, "num_frames", 1)
    seen = sorted(set(int(i) for i in observed))
    if seen and (seen[0] < 0 or seen[-1] >= num_frames):
        raise ValueError(f"observed frames must lie in [0, {num_frames}), got {seen[0]}..{seen[-1]}")
    bounds = [-1] + seen + [num_frames]
    runs = [(a + 1, b) for a, b in zip(bounds, bounds[1:]) if b > a + 1]
    return torch.tensor(runs, dtype=torch.int64).reshape(-1, 2)


class LabelTextEmbedder:
    """Frames to the text space: the text embedding of each frame's classifier labels.

    A stand-in for a joint image-text encoder (the paper's CLIP): a frame
    labelled ``("taxicab", "minivan", "car mirror")`` is indexed as the text
    ``"taxicab, minivan, car mirror"`` through ``text_encoder``, so questions
    embedded by the same encoder retrieve it.  Identical label sets are
    embedded once.  Frames without labels embed ``empty_text``.
    """

    def __init__(self, text_encoder, *, empty_text: str = "scene"):
        if text_encoder is None or not callable(getattr(text_encoder, "encode", None)):
            raise ValueError("text_encoder must have encode(texts) -> (n, dim) tensor")
        self.text_encoder = text_encoder
        self.empty_text = str(empty_text)
        self.dim = int(text_encoder.dim)

    def text_of(self, labels: Sequence[str]) -> str:
        return ", ".join(labels) if labels else self.empty_text

    def __call__(self, encoded: EncodedFrames) -> torch.Tensor:
        texts = [self.text_of(labels) for labels in encoded.labels]
        if len(texts) != encoded.features.shape[0]:
            raise ValueError("LabelTextEmbedder needs one label tuple per frame (a frame encoder with a classifier)")
        unique = list(dict.fromkeys(texts))
        row_of = {text: row for row, text in enumerate(unique)}
        vectors = encode_texts(self.text_encoder, unique) if unique else torch.zeros(0, self.dim)
        return vectors[torch.tensor([row_of[t] for t in texts], dtype=torch.long)].contiguous()


@dataclass
class VideoIndex:
    """Every frame of a video once: times, query-space embeddings, labels, optional features and pixels.

    Attributes
    ----------
    timestamps : (T,) float64 tensor, non-decreasing seconds
    embeddings : (T, E) float32 tensor
        What retrieval ranks; in the question encoder's space.
    keys : CosineIndex
        The embeddings normalised once, id = frame position (built here): every retrieval searches it
        (``keys.search(queries, k, ranges=segments)``, equal to ``cosine_topk`` on the embeddings), so
        no question normalises the frames again.
    unit : (T, E) float32 tensor
        ``keys.keys``: the unit rows (relevance of frames already seen).
    labels : list of T tuples of str
        The frame encoder's labels (empty tuples when it has none).
    features : (T, D) float32 tensor, optional
        The frame encoder's features (captioners receive them in ``FrameRecord``).
    frames : (T, H, W, 3) uint8 array, optional
        The pixels, kept only when asked (``keep_frames=True``) for a captioner
        that looks at images.
    """

    timestamps: torch.Tensor
    embeddings: torch.Tensor
    labels: list
    features: torch.Tensor | None = None
    frames: np.ndarray | None = None

    def __post_init__(self):
        t = torch.as_tensor(self.timestamps, dtype=torch.float64).reshape(-1)
        e = torch.as_tensor(self.embeddings)
        if e.dim() != 2 or e.shape[0] < 1 or e.shape[1] < 1 or not e.is_floating_point():
            raise ValueError(f"embeddings must be a float (T, E) tensor with T, E >= 1, got "
                             f"{tuple(e.shape)} {e.dtype}")
        if t.shape[0] != e.shape[0]:
            raise ValueError(f"timestamps must hold one time per frame ({e.shape[0]}), got {t.shape[0]}")
        if not bool(torch.isfinite(t).all()) or (t.numel() > 1 and bool((t[1:] < t[:-1]).any())):
            raise ValueError("timestamps must be finite and non-decreasing")
        e = e.float().contiguous()
        if not bool(torch.isfinite(e).all()):
            raise ValueError("embeddings must be finite")
        labels = [()] * e.shape[0] if self.labels is None else [tuple(str(x) for x in lab) for lab in self.labels]
        if len(labels) != e.shape[0]:
            raise ValueError(f"labels must hold one tuple per frame ({e.shape[0]}), got {len(labels)}")
        if self.features is not None:
            f = torch.as_tensor(self.features).float()
            if f.dim() != 2 or f.shape[0] != e.shape[0]:
                raise ValueError(f"features must be (T, D) with T = {e.shape[0]}, got {tuple(f.shape)}")
            self.features = f
        if self.frames is not None:
            frames = np.asarray(self.frames)
            if frames.ndim != 4 or frames.shape[0] != e.shape[0] or frames.shape[-1] != 3 or frames.dtype != np.uint8:
                raise ValueError(f"frames must be uint8 (T, H, W, 3) with T = {e.shape[0]}, got {frames.dtype} "
                                 f"{frames.shape}")
            self.frames = frames
        self.timestamps, self.embeddings, self.labels = t, e, labels
        self.keys = CosineIndex(e.shape[1], device=e.device, capacity=e.shape[0])
        self.keys.add(e)  # ids 0..T-1: ranges over ids are ranges over frame positions
        self.unit = self.keys.keys  # relevance of frames already seen: one small product per round

    def __len__(self) -> int:
        return self.embeddings.shape[0]

    @property
    def dim(self) -> int:
        return self.embeddings.shape[1]

    def record(self, index: int) -> FrameRecord:
        """The frame as a ``FrameRecord`` (what ``Captioner``s take)."""
        feature = self.features[index] if self.features is not None else torch.zeros(0)
        return FrameRecord(int(index), float(self.timestamps[index]), feature, self.labels[index])

    # ---- builders --------------------------------------------------------
    @classmethod
    def from_embeddings(cls, timestamps, embeddings, labels=None, *, features=None, frames=None) -> "VideoIndex":
        """An index from embeddings already in the question encoder's space (e.g. CLIP image features)."""
        return cls(timestamps, embeddings, labels, features, frames)

    @classmethod
    def from_encoded(cls, timestamps, encoded: EncodedFrames, embedder: Callable[[EncodedFrames], torch.Tensor],
                     *, frames=None) -> "VideoIndex":
        """An index from a frame encoder's output and an embedder into the query space (``LabelTextEmbedder``)."""
        embeddings = embedder(encoded)
        labels = encoded.labels if encoded.labels else None
        return cls(timestamps, embeddings, labels, encoded.features, frames)

    @classmethod
    def from_labels(cls, timestamps, labels: Sequence[Sequence[str]], embedder) -> "VideoIndex":
        """An index of label-only frames (synthetic video): ``embedder`` maps them to the query space."""
        labels = [tuple(lab) for lab in labels]
        encoded = EncodedFrames(torch.zeros(len(labels), 0), labels)
        return cls(timestamps, embedder(encoded), labels)

    @classmethod
    def from_frames(cls, timestamps, frames, frame_encoder, embedder, *, batch: int = 64,
                    keep_frames: bool = False) -> "VideoIndex":
        """Encode every frame of ``(timestamps, frames)`` pairs (an iterable, e.g. a ``VideoSource``).

        ``timestamps`` may be None when ``frames`` yields ``(t, frame)`` pairs.
        Frames are encoded ``batch`` at a time, so memory holds one batch of
        pixels (plus all of them with ``keep_frames``).
        """
        batch = _check_count(batch, "batch", 1)
        pairs = frames if timestamps is None else zip(timestamps, frames)
        times: list[float] = []
        feats, labels, kept, pending = [], [], [], []

        def flush():
            if pending:
                out = encode_frames(frame_encoder, np.stack(pending))
                feats.append(out.features.float())
                labels.extend(out.labels if out.labels else [()] * len(pending))
                if keep_frames:
                    kept.extend(pending)
                pending.clear()

        for t, frame in pairs:
            times.append(float(t))
            pending.append(np.asarray(frame))
            if len(pending) == batch:
                flush()
        flush()
        if not times:
            raise ValueError("the video yielded no frames")
        encoded = EncodedFrames(torch.cat(feats), labels)
        return cls.from_encoded(times, encoded, embedder, frames=np.stack(kept) if keep_frames else None)
