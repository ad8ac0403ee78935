"""The models a memory calls: frame and text encoders (``encoders``), captioners (``captioners``) and
KV-cache prefix reuse for caption updates (``caption_reuse``, imported on first use: it is the one
that works with a language model's cache).

Above ``checks`` and ``config``; nothing here imports the components, the stream, the recipes or
the CLI.
"""
