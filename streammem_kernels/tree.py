"""Compatibility module: the cosine memory tree's names, from where they live now.

``tree.py`` used to hold the store, both searches and all their backend glue;
it is split by concern:

* :mod:`streammem_kernels.cosine_tree` -- :class:`CosineTree`, the growable store;
* :mod:`streammem_kernels.traversal` -- :func:`tree_search` (greedy / beam),
  :class:`TreePathResult`, the ``TREE_SEARCH`` Op;
* :mod:`streammem_kernels.topk` -- :func:`cosine_topk` (exact, segmented),
  :class:`TopKResult`, the ``COSINE_TOPK`` Op;
* :mod:`streammem_kernels._cosine` -- the scoring and ranking rules they share.

Their compiled backends stay in one native module, ``_cpu_tree`` (both Ops
declare ``native="tree"``).  Import from the modules above in new code.
"""
from .cosine_tree import CosineTree
from .topk import BLAS_MIN_QUERIES, COSINE_TOPK, TopKResult, cosine_topk, cosine_topk_uses_blas
from .traversal import TREE_SEARCH, TreePathResult, tree_search

__all__ = ["CosineTree", "TopKResult", "TreePathResult", "tree_search", "cosine_topk", "cosine_topk_uses_blas",
           "TREE_SEARCH", "COSINE_TOPK", "BLAS_MIN_QUERIES"]
