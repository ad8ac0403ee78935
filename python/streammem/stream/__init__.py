"""The stream: every memory of one stream behind ``push`` / ``ask`` (``memory.StreamMemory``), the
three-thread scheduler over it (``pipeline.StreamPipeline``) and questions at stream times
(``questions``).

Above the components and the models; nothing here imports the recipes, the CLI or ``distributed``.
"""
