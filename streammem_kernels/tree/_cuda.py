"""CUDA backend of greedy tree search (kernel: csrc/cuda/tree.cu; contract: search.py).

One block per query (per (query, root) with ``from_every_root``) walks the
whole path in one launch; outputs are allocated here on the tree's device and
the launch goes on torch's current stream (no host synchronisation).
"""
from __future__ import annotations

import torch

from ..runtime import cuda as native_cuda
from ..runtime.cuda import I32, I64, P
from ..runtime.dispatch import load_native

# The launchers of csrc/cuda/tree.cu: {function: (restype, argtypes)} (tests/gpu_readiness/test_cuda_compile.py checks that
# a build exports exactly these).
PROTOTYPES = {
    "streammem_tree_greedy": (I32, (P, I64, P, P, P, I64, P, I64, I64, I32, P, P, P, P, P)),
}


def greedy_cuda(embeddings, child_ptr, child_idx, roots, queries, height: int, from_every_root: bool):
    """(path, path_scores, best_node, best_score) as ``tree_search(beam=1)`` returns them."""
    mod, why = load_native("cuda", "tree")
    if mod is None:
        raise RuntimeError(why)
    dev = queries.device
    num_q, dim = queries.shape
    num_r = roots.shape[0]
    rows = num_q * num_r if from_every_root else num_q
    path = torch.empty((rows, height + 1), dtype=torch.int64, device=dev)
    path_scores = torch.empty((rows, height + 1), dtype=torch.float32, device=dev)
    best_node = torch.empty((rows,), dtype=torch.int64, device=dev)
    best_score = torch.empty((rows,), dtype=torch.float32, device=dev)
    embeddings, queries = embeddings.contiguous(), queries.contiguous()
    child_ptr, child_idx, roots = child_ptr.contiguous(), child_idx.contiguous(), roots.contiguous()
    if child_idx.numel() == 0:  # a forest of leaves: the kernel never reads it, but needs a valid pointer
        child_idx = torch.zeros(1, dtype=torch.int64, device=dev)
    with torch.cuda.device(dev):
        mod.call("streammem_tree_greedy", embeddings.data_ptr(), dim, child_ptr.data_ptr(), child_idx.data_ptr(),
                 roots.data_ptr(), num_r, queries.data_ptr(), num_q, height, int(from_every_root), path.data_ptr(),
                 path_scores.data_ptr(), best_node.data_ptr(), best_score.data_ptr(), native_cuda.stream_handle(dev))
    if from_every_root:
        shape = (num_q, num_r)
        return path.view(*shape, -1), path_scores.view(*shape, -1), best_node.view(shape), best_score.view(shape)
    return path, path_scores, best_node, best_score
