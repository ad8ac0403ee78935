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

Every name above is imported on first use, so ``import streammem`` is cheap:
it imports neither torch nor transformers (``update_caption``, the KV-cache
prefix reuse in ``streammem.models.caption_reuse``, pulls in transformers when
used), and the ``streammem`` command parses its arguments before torch loads.
The package needs only torch and numpy; components that need an extra (OpenCV,
faiss, the offline models) raise ``MissingExtraError`` naming it when used
without it.
"""
import importlib

# Where each public name lives; a name is imported on first use (module __getattr__), so that
# `import streammem` -- and the command line's argument parsing -- does not import torch.
_HOMES = {
    "streammem_kernels.extras": ("MissingExtraError",),
    ".config": ("PRESETS", "STREAMCHAT_THRESHOLDS", "BoundedConfig", "InjectorConfig", "MemoryConfig", "Preset",
                "SegmenterConfig", "ShortTermConfig"),
    ".models.captioners": ("LanguageModelCaptioner",),
    ".models.encoders": ("EfficientNetLiteEncoder", "EncodedFrames", "FrameEncoder", "HashingTextEncoder",
                         "MiniLMTextEncoder", "PixelEncoder", "TextEncoder", "encoder_from_spec", "encoder_spec",
                         "load_frame_encoder", "load_text_encoder"),
    ".models.caption_reuse": ("update_caption",),
    ".io.synthetic": ("SyntheticVideo",),
    ".io.video": ("VideoSource", "sample_video_path"),
    ".components.answers": ("NOT_IN_MEMORY_ANSWER", "Calibration", "Outcome", "extractive_answer"),
    ".components.bounded": ("BoundedMemory",),
    ".components.gate": ("MotionGate",),
    ".components.knowledge": ("DialogueMemory", "EventSegmenter", "InstantaneityScorer", "KnowledgeBase",
                              "KnowledgeInjector"),
    ".components.memory": ("Captioner", "FrameRecord", "LabelCaptioner", "LongTermMemory", "MemoryNode",
                           "ShortTermMemory"),
    ".components.timeref": ("TimeReference", "parse_time_reference"),
    ".stream.context": ("Context", "PushResult"),
    ".stream.memory": ("StreamMemory",),
    ".stream.pipeline": ("PipelineStopped", "StreamPipeline"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

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
    "STREAMCHAT_THRESHOLDS",
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


def __getattr__(name):
    module = _HOME.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    if name == "distributed":
        return importlib.import_module(".distributed", __name__)
    if name == "__version__":  # one version for both packages, written in streammem_kernels/_version.py
        from streammem_kernels import __version__

        return __version__
    raise AttributeError(f"module 'streammem' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
