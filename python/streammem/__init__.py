"""streammem: the streaming memory pipeline built on streammem_kernels.

Components compose the kernels into the systems of StreamChat, StreamRAG and
ProStream; each is usable alone.  ``update_caption`` (KV-cache prefix reuse)
lives in ``streammem.caption_reuse`` and is imported on first access, so
``import streammem`` stays cheap and does not pull in transformers.
"""
from .gate import PRESETS, MotionGate, Preset
from .video import VideoSource, sample_video_path

__all__ = [
    "PRESETS",
    "MotionGate",
    "Preset",
    "VideoSource",
    "sample_video_path",
    "update_caption",
]
__version__ = "0.1.0"


def __getattr__(name):
    if name == "update_caption":
        from .caption_reuse import update_caption

        return update_caption
    raise AttributeError(f"module 'streammem' has no attribute {name!r}")
