"""The cosine tree family: a growable store of normalised embeddings (:class:`CosineTree`), its
searches (:func:`tree_search`: StreamChat's greedy walk and a beam), exact cosine top-k over
flat keys (:func:`cosine_topk`) and over prepared keys (:class:`CosineIndex`, faiss-shaped), all
scored by the rules of :mod:`.reference`.

Modules: ``reference`` (the scoring rules, the size bounds and the torch references: the spec),
``topk`` and ``search`` (the public functions and their ``Op`` tables), ``index`` (the index and its
``Op``), ``store`` (the tree) with ``storage`` (its tables and snapshots) and ``persistence`` (its
file format); backends ``_triton``, ``_cuda``; native modules ``_cpu_tree`` / ``_cuda_tree``
(``csrc/cpu/tree/``, ``csrc/cuda/tree.cu``).
``docs/ops/tree.md`` is the design note.
"""
from .index import CosineIndex
from .search import TreePathResult, tree_search
from .store import CosineTree
from .topk import TopKResult, cosine_topk

__all__ = ["CosineIndex", "CosineTree", "TopKResult", "TreePathResult", "cosine_topk", "tree_search"]
