"""The cosine tree family: a growable store of normalised embeddings (:class:`CosineTree`), its
searches (:func:`tree_search`: StreamChat's greedy walk and a beam) and exact cosine top-k over
flat keys (:func:`cosine_topk`), all scored by the rules of :mod:`.scoring`.

Modules: ``store`` (the tree), ``search`` (tree search), ``topk`` (exact top-k), ``scoring`` (the
scoring and ranking rules and the size bounds every search shares); backends ``_triton``,
``_cuda``; native modules ``_cpu_tree`` / ``_cuda_tree`` (``csrc/cpu/tree.cpp``,
``csrc/cuda/tree.cu``).
"""
from .search import TreePathResult, tree_search
from .store import CosineTree
from .topk import TopKResult, cosine_topk

__all__ = ["CosineTree", "TopKResult", "TreePathResult", "cosine_topk", "tree_search"]
