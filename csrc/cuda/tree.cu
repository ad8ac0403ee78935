// Cosine memory tree, greedy descent (StreamChat Algorithm 1) in CUDA
// (contract: streammem_kernels/tree.py, "Searches").
//
// Why CUDA here: a greedy descent is pointer chasing -- each level's candidates
// are the children of the node chosen one level up -- so a level-by-level
// Triton/torch formulation needs one launch (and padded candidate matrices)
// per level.  Here one block follows one path from the roots to a leaf in a
// single launch: the warps score the current candidates (one dot product per
// warp at a time, lanes over the features, coalesced), a block-wide argmax
// picks the next node, and the loop ends at a leaf.  Cost per query is
// O(height x fan-out x D), independent of the number of leaves.
//
// Ties go to the lowest node id: candidates (roots, then each node's children)
// are visited in ascending id order and a later candidate replaces the best
// only when strictly better.  The running best node of the path starts at
// -inf and is replaced only on a strictly larger score (first maximum).
#include "common.cuh"

STREAMMEM_CUDA_MODULE_COMMON()

namespace streammem {

constexpr int kTreeThreads = 128;
constexpr int kTreeWarps = kTreeThreads / 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Best (score, position) among candidates[0..count): ties to the lower position.
// Every thread of the block returns the same pair.
__device__ void block_best(const float* __restrict__ emb, int64_t dim, const float* __restrict__ q,
                           const int64_t* __restrict__ candidates, int64_t count, float* best_score,
                           int64_t* best_pos) {
  __shared__ float warp_score[kTreeWarps];
  __shared__ int64_t warp_pos[kTreeWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float my_score = -INFINITY;
  int64_t my_pos = -1;
  for (int64_t c = warp; c < count; c += kTreeWarps) {
    const float* row = emb + candidates[c] * dim;
    float acc = 0.0f;
    for (int64_t d = lane; d < dim; d += 32) acc += q[d] * __ldg(row + d);
    acc = warp_sum(acc);
    if (my_pos < 0 || acc > my_score) {  // positions rise within a warp: strict > keeps the lowest
      my_score = acc;
      my_pos = c;
    }
  }
  if (lane == 0) {
    warp_score[warp] = my_score;
    warp_pos[warp] = my_pos;
  }
  __syncthreads();
  float s = -INFINITY;
  int64_t p = -1;
#pragma unroll
  for (int w = 0; w < kTreeWarps; ++w) {
    const int64_t wp = warp_pos[w];
    if (wp < 0) continue;
    const float ws = warp_score[w];
    if (p < 0 || ws > s || (ws == s && wp < p)) {
      s = ws;
      p = wp;
    }
  }
  __syncthreads();  // the shared slots are reused by the next call
  *best_score = s;
  *best_pos = p;
}

// One block per output row: row = query (from_every_root = 0) or query * R + root.
__global__ void __launch_bounds__(kTreeThreads) tree_greedy_kernel(
    const float* __restrict__ emb, int64_t dim, const int64_t* __restrict__ child_ptr,
    const int64_t* __restrict__ child_idx, const int64_t* __restrict__ roots, int64_t num_roots,
    const float* __restrict__ queries, int64_t height, int from_every_root, int64_t* __restrict__ path,
    float* __restrict__ path_scores, int64_t* __restrict__ best_node, float* __restrict__ best_score) {
  const int64_t row = blockIdx.x;
  const int64_t query = from_every_root ? row / num_roots : row;
  const float* q = queries + query * dim;
  int64_t* my_path = path + row * (height + 1);
  float* my_scores = path_scores + row * (height + 1);
  for (int64_t i = threadIdx.x; i <= height; i += blockDim.x) {
    my_path[i] = -1;
    my_scores[i] = -INFINITY;
  }
  float score;
  int64_t pos;
  if (from_every_root) {
    block_best(emb, dim, q, roots + row % num_roots, 1, &score, &pos);
    pos = row % num_roots;
  } else {
    block_best(emb, dim, q, roots, num_roots, &score, &pos);
  }
  int64_t cur = roots[pos];
  float run_score = score;
  int64_t run_node = cur;
  __syncthreads();  // the padding above is written before thread 0 fills the path
  if (threadIdx.x == 0) {
    my_path[0] = cur;
    my_scores[0] = score;
  }
  for (int64_t step = 1; step <= height; ++step) {
    const int64_t lo = child_ptr[cur], hi = child_ptr[cur + 1];
    if (hi <= lo) break;  // a leaf (or a childless node): the path ends
    block_best(emb, dim, q, child_idx + lo, hi - lo, &score, &pos);
    cur = child_idx[lo + pos];
    if (threadIdx.x == 0) {
      my_path[step] = cur;
      my_scores[step] = score;
    }
    if (score > run_score) {
      run_score = score;
      run_node = cur;
    }
  }
  if (threadIdx.x == 0) {
    best_node[row] = run_node;
    best_score[row] = run_score;
  }
}

}  // namespace streammem

// embeddings (N, dim) float32 unit rows; child_ptr (N + 1,), child_idx (E,), roots (R,) int64 ascending;
// queries (Q, dim) float32 unit rows.  Outputs for rows = Q (or Q * R with from_every_root):
// path (rows, height + 1) int64, path_scores (rows, height + 1) float32, best_node (rows,), best_score (rows,).
STREAMMEM_EXPORT int streammem_tree_greedy(const float* emb, int64_t dim, const int64_t* child_ptr,
                                           const int64_t* child_idx, const int64_t* roots, int64_t num_roots,
                                           const float* queries, int64_t num_queries, int64_t height,
                                           int from_every_root, int64_t* path, float* path_scores,
                                           int64_t* best_node, float* best_score, void* stream) {
  const int64_t rows = from_every_root ? num_queries * num_roots : num_queries;
  if (rows <= 0) return 0;
  if (rows > 0x7fffffffLL) return static_cast<int>(cudaErrorInvalidConfiguration);
  streammem::tree_greedy_kernel<<<static_cast<unsigned>(rows), streammem::kTreeThreads, 0,
                                  static_cast<cudaStream_t>(stream)>>>(
      emb, dim, child_ptr, child_idx, roots, num_roots, queries, height, from_every_root, path, path_scores,
      best_node, best_score);
  return static_cast<int>(cudaGetLastError());
}
