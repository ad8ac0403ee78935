"""streammem: the streaming memory pipeline built on streammem_kernels.

Components compose the kernels into the systems of StreamChat, StreamRAG and
ProStream; each is usable alone:

* ``VideoSource`` (OpenCV decoding), ``MotionGate`` and the Slow/Base/Fast ``PRESETS``;
* ``FrameEncoder`` / ``TextEncoder`` protocols with real offline defaults
  (EfficientNet-lite0, all-MiniLM-L6-v2) and tiny fallbacks;
* ``ShortTermMemory``, ``LongTermMemory`` (k-means-compressed, captioned
  ``CosineTree``), ``EventSegmenter`` + ``KnowledgeBase``, ``KnowledgeInjector``,
  ``DialogueMemory``, ``BoundedMemory``;
* ``StreamMemory``: all of a stream's memories behind ``push`` / ``ask``,
  synchronous, picklable and checkpointable (``state_dict``, ``save`` / ``load``),
  configured by one ``MemoryConfig`` (presets);
* ``StreamPipeline``: the three-thread scheduler over one ``StreamMemory``;
* ``extractive_answer``: the model-free answer to a context (stands in for a
  language model); every answer's ``Outcome`` (answered or not in memory) and
  calibrated confidence (``Calibration``), and the time references questions
  may use (``parse_time_reference``; ``docs/answers.md``);
* ``streammem.recipes``: the seed systems VideoAgent, ProStream and MemVerse;
* ``streammem.distributed`` (optional extra ``[ray]``): archive indexing,
  sharded live streams with checkpoints, a router.

The package is in layers, each importing only the ones below it: ``checks``,
``config`` and ``checkpoint`` at the bottom; ``models`` and ``io``;
``components``; ``stream``; ``recipes`` and ``distributed``; the command line
``cli`` on top (see ``README.md`` in this folder).

``update_caption`` (KV-cache prefix reuse) lives in ``streammem.models.caption_reuse``
and is imported on first access, so ``import streammem`` stays cheap and does
not pull in transformers.  ``import streammem`` needs only torch and numpy;
components that need an extra (OpenCV, faiss, the offline models) raise
``MissingExtraError`` naming it when used without it.
"""
from streammem_kernels.extras import MissingExtraError

from .config import PRESETS, BoundedConfig, InjectorConfig, MemoryConfig, Preset, SegmenterConfig, ShortTermConfig
from .models.captioners import LanguageModelCaptioner
from .models.encoders import (
    EfficientNetLiteEncoder, EncodedFrames, FrameEncoder, HashingTextEncoder, MiniLMTextEncoder, PixelEncoder,
    TextEncoder, encoder_from_spec, encoder_spec, load_frame_encoder, load_text_encoder,
)
from .io.synthetic import SyntheticVideo
from .io.video import VideoSource, sample_video_path
from .components.answers import NOT_IN_MEMORY_ANSWER, Calibration, Outcome, extractive_answer
from .components.bounded import BoundedMemory
from .components.gate import MotionGate
from .components.knowledge import DialogueMemory, EventSegmenter, InstantaneityScorer, KnowledgeBase, KnowledgeInjector
from .components.memory import Captioner, FrameRecord, LabelCaptioner, LongTermMemory, MemoryNode, ShortTermMemory
from .components.timeref import TimeReference, parse_time_reference
from .stream.memory import Context, PushResult, StreamMemory
from .stream.pipeline import PipelineStopped, StreamPipeline

__all__ = [
    "BoundedConfig",
    "BoundedMemory",
    "Calibration",
    "Captioner",
    "Context",
    "DialogueMemory",
    "EfficientNetLiteEncoder",
    "EncodedFrames",
    "EventSegmenter",
    "FrameEncoder",
    "FrameRecord",
    "HashingTextEncoder",
    "InjectorConfig",
    "InstantaneityScorer",
    "KnowledgeBase",
    "KnowledgeInjector",
    "LabelCaptioner",
    "LanguageModelCaptioner",
    "LongTermMemory",
    "MemoryConfig",
    "MemoryNode",
    "MiniLMTextEncoder",
    "MissingExtraError",
    "MotionGate",
    "NOT_IN_MEMORY_ANSWER",
    "Outcome",
    "PRESETS",
    "PipelineStopped",
    "PixelEncoder",
    "Preset",
    "PushResult",
    "SegmenterConfig",
    "ShortTermConfig",
    "ShortTermMemory",
    "StreamMemory",
    "StreamPipeline",
    "SyntheticVideo",
    "TextEncoder",
    "TimeReference",
    "VideoSource",
    "encoder_from_spec",
    "extractive_answer",
    "encoder_spec",
    "load_frame_encoder",
    "load_text_encoder",
    "parse_time_reference",
    "sample_video_path",
    "update_caption",
]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "update_caption":
        from .models.caption_reuse import update_caption

        return update_caption
    if name == "distributed":
        import importlib

        return importlib.import_module(".distributed", __name__)
    raise AttributeError(f"module 'streammem' has no attribute {name!r}")
