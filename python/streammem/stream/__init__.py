"""The stream: every memory of one stream behind ``push`` / ``ask`` (``memory.StreamMemory``; what it
returns in ``context``, what an answer rests on in ``basis``, its default calibration in ``calibration``),
the three-thread scheduler over it (``pipeline.StreamPipeline``) and questions at stream times
(``questions``).

Above the components and the models; nothing here imports the recipes, the CLI or ``distributed``.
"""
