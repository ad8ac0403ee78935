"""Frames in: decoded video files (``video``) and synthetic clips with known scene cuts (``synthetic``).

Above ``checks`` and ``config``; ``synthetic`` paints its scenes in the pixel
encoder's palette (``models.encoders.COLOUR_NAMES``) so that encoder's labels
name them.  Nothing here imports the components, the stream, the recipes or the CLI.
"""
