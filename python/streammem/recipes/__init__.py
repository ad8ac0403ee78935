"""The seed systems, one package per system, composed from the components and the stream.

Each recipe keeps its memory (or agent), its synthetic data and its evaluation
in separate modules; its package's ``__init__`` names its public API.  A
recipe imports the layers below it (components, models, io, stream, config,
checks) by public names, and never another recipe or the CLI.

* ``videoagent``: VideoAgent, long-video question answering by iterative frame retrieval;
* ``prostream``: ProStream, a bounded hierarchical memory of a dialogue stream with ad-hoc recall;
* ``memverse``: MemVerse, a short-term window and a long-term multimodal knowledge graph.
"""
