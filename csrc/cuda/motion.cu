// Lucas-Kanade motion magnitude, CUDA kernels (contract: streammem_kernels/motion.py).
//
// Two stages, one thread per pixel, the Triton backend's structure:
//   lk_products: the five structure products of the valid gradient region,
//                (P, 5, H-2, W-2) float32 (the reference's structure_products);
//   lk_window:   the w x w window average of the products, the 2x2 solve and
//                the per-pixel fields |flow|, u, v, valid, (P, 4, Ho, Wo)
//                float32 (the reference's flow_fields(window_average(...))).
// The per-frame summary and the global mode (window 0) are the reference's own
// torch code applied to these tensors (streammem_kernels/_motion_cuda.py).
//
// Bit for bit with the reference: every expression is evaluated in the
// reference's order (the Sobel differences, the row-major window sum from 0
// divided by w*w as avg_pool2d does, the closed-form solve), without FMA
// contraction and with IEEE division and square root (nvcc's defaults without
// fast math), so the fields -- and every keep/drop decision made from them --
// equal the reference's.
// streammem-nvcc: --fmad=false
#include "common.cuh"

STREAMMEM_CUDA_MODULE_COMMON()

namespace streammem {

constexpr int kBlockX = 32;
constexpr int kBlockY = 8;
constexpr int kMaxGridZ = 65535;

template <typename T>
__device__ __forceinline__ float mean_at(const T* __restrict__ prev, const T* __restrict__ cur, int64_t o,
                                         float scale) {
  const float p = static_cast<float>(prev[o]) * scale;
  const float c = static_cast<float>(cur[o]) * scale;
  return 0.5f * (p + c);
}

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
  const int64_t o = static_cast<int64_t>(y) * W + x;  // top-left of the 3x3 stencil
  const float m00 = mean_at(prev, cur, o, scale), m01 = mean_at(prev, cur, o + 1, scale);
  const float m02 = mean_at(prev, cur, o + 2, scale), m10 = mean_at(prev, cur, o + W, scale);
  const float m12 = mean_at(prev, cur, o + W + 2, scale), m20 = mean_at(prev, cur, o + 2 * W, scale);
  const float m21 = mean_at(prev, cur, o + 2 * W + 1, scale), m22 = mean_at(prev, cur, o + 2 * W + 2, scale);
  // Sobel / 8 in the reference's order: ((d0 + 2 d1) + d2) * 0.125.
  const float ix = (((m02 - m00) + 2.0f * (m12 - m10)) + (m22 - m20)) * 0.125f;
  const float iy = (((m20 - m00) + 2.0f * (m21 - m01)) + (m22 - m02)) * 0.125f;
  const int64_t c = o + W + 1;
  const float it = static_cast<float>(cur[c]) * scale - static_cast<float>(prev[c]) * scale;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  float* out = prods + static_cast<int64_t>(pair) * 5 * plane + static_cast<int64_t>(y) * Wg + x;
  out[0] = ix * ix;
  out[plane] = ix * iy;
  out[2 * plane] = iy * iy;
  out[3 * plane] = ix * it;
  out[4 * plane] = iy * it;
}

__global__ void lk_window_kernel(const float* __restrict__ prods, float* __restrict__ fields, int Hg, int Wg,
                                 int win, float min_eig) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int Ho = Hg - win + 1, Wo = Wg - win + 1;
  if (x >= Wo || y >= Ho) return;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  const float* base = prods + static_cast<int64_t>(pair) * 5 * plane + static_cast<int64_t>(y) * Wg + x;
  float a = 0.0f, b = 0.0f, c = 0.0f, sx = 0.0f, sy = 0.0f;
  for (int dy = 0; dy < win; ++dy)  // row-major from 0: avg_pool2d's summation order
    for (int dx = 0; dx < win; ++dx) {
      const float* p = base + static_cast<int64_t>(dy) * Wg + dx;
      a += __ldg(p);
      b += __ldg(p + plane);
      c += __ldg(p + 2 * plane);
      sx += __ldg(p + 3 * plane);
      sy += __ldg(p + 4 * plane);
    }
  const float area = static_cast<float>(win * win);
  a = a / area;
  b = b / area;
  c = c / area;
  const float bx = -(sx / area), by = -(sy / area);
  // The reference's solve_lk, operation for operation.
  const float det = a * c - b * b;
  const float lmax = 0.5f * ((a + c) + sqrtf((a - c) * (a - c) + 4.0f * b * b));
  const float lmin = det / (lmax > 0.0f ? lmax : 1.0f);
  const bool valid = (lmax > 0.0f) && (lmin > min_eig);
  const float safe_det = valid ? det : 1.0f;
  const float u = valid ? (c * bx - b * by) / safe_det : 0.0f;
  const float v = valid ? (a * by - b * bx) / safe_det : 0.0f;
  const int64_t out_plane = static_cast<int64_t>(Ho) * Wo;
  float* out = fields + static_cast<int64_t>(pair) * 4 * out_plane + static_cast<int64_t>(y) * Wo + x;
  out[0] = sqrtf(u * u + v * v);
  out[out_plane] = u;
  out[2 * out_plane] = v;
  out[3 * out_plane] = valid ? 1.0f : 0.0f;
}

inline dim3 grid_for(int w, int h, int pairs) {
  return dim3((w + kBlockX - 1) / kBlockX, (h + kBlockY - 1) / kBlockY, pairs);
}

}  // namespace streammem

// frames: (pairs + 1, H, W) contiguous, uint8 (is_uint8 = 1) or float32, scaled by `scale` on load.
// prods: (pairs, 5, H-2, W-2) float32 output.  gridDim.z is at most 65,535: long clips go in chunks.
STREAMMEM_EXPORT int streammem_motion_products(const void* frames, int is_uint8, float* prods, int64_t pairs,
                                               int64_t H, int64_t W, float scale, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  const int h = static_cast<int>(H), w = static_cast<int>(W);
  const int64_t plane = (H - 2) * (W - 2);
  for (int64_t p0 = 0; p0 < pairs; p0 += streammem::kMaxGridZ) {
    const int n = static_cast<int>(pairs - p0 < streammem::kMaxGridZ ? pairs - p0 : streammem::kMaxGridZ);
    const dim3 grid = streammem::grid_for(w - 2, h - 2, n);
    if (is_uint8)
      streammem::lk_products_kernel<uint8_t><<<grid, block, 0, s>>>(static_cast<const uint8_t*>(frames) + p0 * H * W,
                                                                    prods + p0 * 5 * plane, h, w, scale);
    else
      streammem::lk_products_kernel<float><<<grid, block, 0, s>>>(static_cast<const float*>(frames) + p0 * H * W,
                                                                  prods + p0 * 5 * plane, h, w, scale);
  }
  return static_cast<int>(cudaGetLastError());
}

// prods: (pairs, 5, Hg, Wg) float32; fields: (pairs, 4, Hg-window+1, Wg-window+1) float32 output.
STREAMMEM_EXPORT int streammem_motion_fields(const float* prods, float* fields, int64_t pairs, int64_t Hg,
                                             int64_t Wg, int64_t window, float min_eig, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  const int64_t Ho = Hg - window + 1, Wo = Wg - window + 1;
  for (int64_t p0 = 0; p0 < pairs; p0 += streammem::kMaxGridZ) {
    const int n = static_cast<int>(pairs - p0 < streammem::kMaxGridZ ? pairs - p0 : streammem::kMaxGridZ);
    streammem::lk_window_kernel<<<streammem::grid_for(static_cast<int>(Wo), static_cast<int>(Ho), n), block, 0, s>>>(
        prods + p0 * 5 * Hg * Wg, fields + p0 * 4 * Ho * Wo, static_cast<int>(Hg), static_cast<int>(Wg),
        static_cast<int>(window), min_eig);
  }
  return static_cast<int>(cudaGetLastError());
}
