// Lucas-Kanade motion magnitude, CUDA kernels (contract: streammem_kernels/motion.py).
//
// Stage 1 (lk_products): one thread per gradient pixel writes the five
// structure products (P, 5, H-2, W-2).  Stage 2 (lk_window): one thread per
// output pixel sums its w x w window (served from L1/L2), solves the 2x2
// system, and each block reduces (|flow|, count, u, v) to one partial; the
// caller sums partials in float64 in a fixed order, so results are
// deterministic.  Global mode (window == 0) reduces the products per block.
//
// The backends promise identical decisions (which pixels pass the eigenvalue
// test): no FMA contraction, IEEE sqrt and division, as the reference rounds.
// streammem-nvcc: --fmad=false
#include "common.cuh"

STREAMMEM_CUDA_MODULE_COMMON()

namespace streammem {

constexpr int kBlockX = 32;
constexpr int kBlockY = 8;

template <typename T>
__global__ void lk_products_kernel(const T* __restrict__ frames, float* __restrict__ prods, int H, int W,
                                   float scale) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int Hg = H - 2, Wg = W - 2;
  if (x >= Wg || y >= Hg) return;
  const T* prev = frames + static_cast<int64_t>(pair) * H * W;
  const T* cur = prev + static_cast<int64_t>(H) * W;
  float m[3][3];
#pragma unroll
  for (int dy = 0; dy < 3; ++dy)
#pragma unroll
    for (int dx = 0; dx < 3; ++dx) {
      const int64_t o = static_cast<int64_t>(y + dy) * W + (x + dx);
      m[dy][dx] = (static_cast<float>(prev[o]) + static_cast<float>(cur[o])) * (0.5f * scale);
    }
  // Sobel / 8: intensity change per pixel.
  const float ix = ((m[0][2] - m[0][0]) + 2.0f * (m[1][2] - m[1][0]) + (m[2][2] - m[2][0])) * 0.125f;
  const float iy = ((m[2][0] - m[0][0]) + 2.0f * (m[2][1] - m[0][1]) + (m[2][2] - m[0][2])) * 0.125f;
  const int64_t c = static_cast<int64_t>(y + 1) * W + (x + 1);
  const float it = (static_cast<float>(cur[c]) - static_cast<float>(prev[c])) * scale;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  float* out = prods + static_cast<int64_t>(pair) * 5 * plane + static_cast<int64_t>(y) * Wg + x;
  out[0] = ix * ix;
  out[plane] = ix * iy;
  out[2 * plane] = iy * iy;
  out[3 * plane] = ix * it;
  out[4 * plane] = iy * it;
}

__global__ void lk_window_kernel(const float* __restrict__ prods, float* __restrict__ partials, int Hg, int Wg,
                                 int win, float min_eig) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int Ho = Hg - win + 1, Wo = Wg - win + 1;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  float vals[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // |flow|, count, u, v
  if (x < Wo && y < Ho) {
    const float* base = prods + static_cast<int64_t>(pair) * 5 * plane;
    float s[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int dy = 0; dy < win; ++dy)
      for (int dx = 0; dx < win; ++dx) {
        const int64_t o = static_cast<int64_t>(y + dy) * Wg + (x + dx);
#pragma unroll
        for (int k = 0; k < 5; ++k) s[k] += __ldg(base + k * plane + o);
      }
    const float inv_area = 1.0f / static_cast<float>(win * win);
    const float a = s[0] * inv_area, b = s[1] * inv_area, c = s[2] * inv_area;
    const float bx = -s[3] * inv_area, by = -s[4] * inv_area;
    const float det = a * c - b * b;
    const float lmax = 0.5f * ((a + c) + sqrtf((a - c) * (a - c) + 4.0f * b * b));
    const float lmin = det / (lmax > 0.0f ? lmax : 1.0f);
    if (lmax > 0.0f && lmin > min_eig) {
      const float u = (c * bx - b * by) / det;
      const float v = (a * by - b * bx) / det;
      vals[0] = sqrtf(u * u + v * v);
      vals[1] = 1.0f;
      vals[2] = u;
      vals[3] = v;
    }
  }
  const int64_t blocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
  float* partial = partials + (static_cast<int64_t>(pair) * blocks + blockIdx.y * gridDim.x + blockIdx.x) * 4;
  block_sum<4, kBlockX * kBlockY>(vals, partial);
}

__global__ void lk_global_kernel(const float* __restrict__ prods, float* __restrict__ partials, int Hg, int Wg) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  float vals[5] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (x < Wg && y < Hg) {
    const float* base = prods + static_cast<int64_t>(pair) * 5 * plane + static_cast<int64_t>(y) * Wg + x;
#pragma unroll
    for (int k = 0; k < 5; ++k) vals[k] = base[k * plane];
  }
  const int64_t blocks = static_cast<int64_t>(gridDim.x) * gridDim.y;
  float* partial = partials + (static_cast<int64_t>(pair) * blocks + blockIdx.y * gridDim.x + blockIdx.x) * 5;
  block_sum<5, kBlockX * kBlockY>(vals, partial);
}

inline dim3 grid_for(int w, int h, int pairs) {
  return dim3((w + kBlockX - 1) / kBlockX, (h + kBlockY - 1) / kBlockY, pairs);
}

constexpr int kMaxGridZ = 65535;

template <typename T>
cudaError_t launch_lk_flow(const T* frames, float* prods, float* partials, int64_t pairs, int H, int W, int window,
                           float min_eig, float scale, cudaStream_t stream) {
  const dim3 block(kBlockX, kBlockY);
  const int Hg = H - 2, Wg = W - 2;
  const int nvals = window ? 4 : 5;
  const int ho = window ? Hg - window + 1 : Hg, wo = window ? Wg - window + 1 : Wg;
  const dim3 out_grid = grid_for(wo, ho, 1);
  const int64_t blocks = static_cast<int64_t>(out_grid.x) * out_grid.y;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  // gridDim.z is at most 65535: long clips go in chunks of pairs.
  for (int64_t p0 = 0; p0 < pairs; p0 += kMaxGridZ) {
    const int n = static_cast<int>(pairs - p0 < kMaxGridZ ? pairs - p0 : kMaxGridZ);
    const T* f = frames + p0 * H * W;
    float* pr = prods + p0 * 5 * plane;
    float* pa = partials + p0 * blocks * nvals;
    lk_products_kernel<T><<<grid_for(Wg, Hg, n), block, 0, stream>>>(f, pr, H, W, scale);
    if (window == 0) {
      lk_global_kernel<<<grid_for(Wg, Hg, n), block, 0, stream>>>(pr, pa, Hg, Wg);
    } else {
      lk_window_kernel<<<grid_for(wo, ho, n), block, 0, stream>>>(pr, pa, Hg, Wg, window, min_eig);
    }
  }
  return cudaGetLastError();
}

}  // namespace streammem

// Partials per pair: the blocks of the output grid (window 0: of the gradient grid).
STREAMMEM_EXPORT int64_t streammem_motion_partial_blocks(int64_t H, int64_t W, int64_t window) {
  const int Hg = static_cast<int>(H) - 2, Wg = static_cast<int>(W) - 2;
  const int ho = window ? Hg - static_cast<int>(window) + 1 : Hg;
  const int wo = window ? Wg - static_cast<int>(window) + 1 : Wg;
  const dim3 g = streammem::grid_for(wo, ho, 1);
  return static_cast<int64_t>(g.x) * g.y;
}

// frames: (pairs + 1, H, W) contiguous uint8 (is_uint8 = 1, scaled by `scale`) or float32.
// prods: (pairs, 5, H-2, W-2) float32 scratch.  partials: (pairs, partial_blocks, window ? 4 : 5) float32.
STREAMMEM_EXPORT int streammem_motion_lk_flow(const void* frames, int is_uint8, float* prods, float* partials,
                                              int64_t pairs, int64_t H, int64_t W, int64_t window, float min_eig,
                                              float scale, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err;
  if (is_uint8)
    err = streammem::launch_lk_flow<uint8_t>(static_cast<const uint8_t*>(frames), prods, partials, pairs,
                                             static_cast<int>(H), static_cast<int>(W), static_cast<int>(window),
                                             min_eig, scale, s);
  else
    err = streammem::launch_lk_flow<float>(static_cast<const float*>(frames), prods, partials, pairs,
                                           static_cast<int>(H), static_cast<int>(W), static_cast<int>(window),
                                           min_eig, scale, s);
  return static_cast<int>(err);
}
