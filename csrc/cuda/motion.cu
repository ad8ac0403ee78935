// Pyramidal Lucas-Kanade motion magnitude, CUDA kernels (contract: streammem_kernels/motion/, reference.py).
//
// The per-level stages of reference.pyramid_flow, one thread per pixel, the Triton
// backend's structure:
//   lk_reduce:   the next pyramid level (the reference's reduce_level);
//   lk_guess:    a level's flow smoothed into the next level's guess (guess_field);
//   lk_warp:     the current frames moved by the guess's whole-pixel offsets
//                (warp_frames: a copy, in the frames' dtype);
//   lk_products: the five structure products of frame pairs, (P, 5, H-2, W-2)
//                float32 (pair_products);
//   lk_window:   the w x w window average of the products, the 2x2 solve, the
//                composition with the guess's offsets (when there is one) and the
//                per-pixel fields |flow|, u, v, valid, (P, 4, Ho, Wo) float32
//                (flow_fields(window_average(...)));
//   lk_search:   the coarsest level's sums of quantised absolute differences under
//                every whole-pixel shift, (P, K) int64 (search_sads; integer sums,
//                exact in any order); the reference's shift_of_sads picks the shift.
// The per-frame summary and the global mode (window 0) are the reference's own
// torch code applied to these tensors, and the reference's driver sequences the
// stages (streammem_kernels/_motion_cuda.py).
//
// Bit for bit with the reference: every expression is evaluated in the
// reference's order (the Sobel and It differences, the [1 2 1] sums, the
// row-major window and box sums from 0 divided as avg_pool2d does, the
// closed-form solve, floor(f * g + 0.5)), without FMA contraction and with IEEE
// division and square root (nvcc's defaults without fast math), so the fields --
// and every keep/drop decision made from them -- equal the reference's.
// streammem-nvcc: --fmad=false
#include "common.cuh"

STREAMMEM_CUDA_MODULE_COMMON()

namespace streammem {

constexpr int kBlockX = 32;
constexpr int kBlockY = 8;
constexpr int kMaxGridZ = 65535;

template <typename T>
__device__ __forceinline__ float unit_at(const T* __restrict__ p, int64_t o, float scale) {
  return static_cast<float>(p[o]) * scale;
}

template <typename T>
__global__ void lk_products_kernel(const T* __restrict__ prev_frames, const T* __restrict__ cur_frames,
                                   float* __restrict__ prods, int H, int W, float scale) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  const int Hg = H - 2, Wg = W - 2;
  if (x >= Wg || y >= Hg) return;
  const T* prev = prev_frames + static_cast<int64_t>(pair) * H * W;
  const T* cur = cur_frames + static_cast<int64_t>(pair) * H * W;
  const int64_t o = static_cast<int64_t>(y) * W + x;  // top-left of the 3x3 stencil
  float m[3][3], t[3];
  for (int r = 0; r < 3; ++r) {
    float p[3], c[3];
    for (int k = 0; k < 3; ++k) {
      p[k] = unit_at(prev, o + r * W + k, scale);
      c[k] = unit_at(cur, o + r * W + k, scale);
      m[r][k] = 0.5f * (p[k] + c[k]);
    }
    t[r] = ((c[0] - p[0]) + 2.0f * (c[1] - p[1])) + (c[2] - p[2]);  // the row's [1 2 1] sum of It
  }
  // Sobel / 8 in the reference's order: ((d0 + 2 d1) + d2) * 0.125; It: ((t0 + 2 t1) + t2) / 16.
  const float ix = (((m[0][2] - m[0][0]) + 2.0f * (m[1][2] - m[1][0])) + (m[2][2] - m[2][0])) * 0.125f;
  const float iy = (((m[2][0] - m[0][0]) + 2.0f * (m[2][1] - m[0][1])) + (m[2][2] - m[0][2])) * 0.125f;
  const float it = ((t[0] + 2.0f * t[1]) + t[2]) * 0.0625f;
  const int64_t plane = static_cast<int64_t>(Hg) * Wg;
  float* out = prods + static_cast<int64_t>(pair) * 5 * plane + static_cast<int64_t>(y) * Wg + x;
  out[0] = ix * ix;
  out[plane] = ix * iy;
  out[2 * plane] = iy * iy;
  out[3 * plane] = ix * it;
  out[4 * plane] = iy * it;
}

// Whole-pixel offsets (gx, gy) at level pixel (y, x): the reference's guess_offsets.
__device__ __forceinline__ void guess_offsets(const float* __restrict__ guess, int y, int x, int H, int W, int Hc,
                                              int Wc, int border, int factor, float& gx, float& gy) {
  const int ci = min(max(y / factor - border, 0), Hc - 1);
  const int cj = min(max(x / factor - border, 0), Wc - 1);
  const int64_t at = static_cast<int64_t>(ci) * Wc + cj;
  const float f = static_cast<float>(factor);
  gx = floorf(f * guess[at] + 0.5f);
  gy = floorf(f * guess[static_cast<int64_t>(Hc) * Wc + at] + 0.5f);
  const float wf = static_cast<float>(W), hf = static_cast<float>(H);
  gx = gx >= -wf ? (gx <= wf ? gx : wf) : -wf;  // NaN-safe clamp (NaN -> low)
  gy = gy >= -hf ? (gy <= hf ? gy : hf) : -hf;
}

__global__ void lk_window_kernel(const float* __restrict__ prods, float* __restrict__ fields,
                                 const float* __restrict__ guess, int Hg, int Wg, int win, float min_eig, int Hc,
                                 int Wc, int factor) {
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
  bool valid = (lmax > 0.0f) && (lmin > min_eig);
  const float safe_det = valid ? det : 1.0f;
  float u = valid ? (c * bx - b * by) / safe_det : 0.0f;
  float v = valid ? (a * by - b * bx) / safe_det : 0.0f;
  if (guess != nullptr) {  // the products came from the pair warped by the guess: compose
    const int H = Hg + 2, W = Wg + 2, border = (win - 1) / 2 + 1;
    const int yi = y + border, xi = x + border;
    float gx, gy;
    guess_offsets(guess + static_cast<int64_t>(pair) * 2 * Hc * Wc, yi, xi, H, W, Hc, Wc, border, factor, gx, gy);
    const float xs = static_cast<float>(xi) + gx, ys = static_cast<float>(yi) + gy;
    const float lo = static_cast<float>(border);
    const bool inside = xs >= lo && xs <= static_cast<float>(W - 1 - border) && ys >= lo &&
                        ys <= static_cast<float>(H - 1 - border);
    valid = valid && inside;
    u = valid ? gx + u : gx;
    v = valid ? gy + v : gy;
  }
  const int64_t out_plane = static_cast<int64_t>(Ho) * Wo;
  float* out = fields + static_cast<int64_t>(pair) * 4 * out_plane + static_cast<int64_t>(y) * Wo + x;
  out[0] = sqrtf(u * u + v * v);
  out[out_plane] = u;
  out[2 * out_plane] = v;
  out[3 * out_plane] = valid ? 1.0f : 0.0f;
}

__global__ void lk_guess_kernel(const float* __restrict__ fields, float* __restrict__ guess, int Ho, int Wo,
                                int box) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= Wo || y >= Ho) return;
  const int64_t plane = static_cast<int64_t>(Ho) * Wo;
  const float* base = fields + static_cast<int64_t>(pair) * 4 * plane;
  // avg_pool2d with zero padding: the in-frame part of each box, row-major from 0.
  float su = 0.0f, sv = 0.0f, sw = 0.0f;
  const int half = box / 2;
  for (int dy = -half; dy <= half; ++dy) {
    const int r = y + dy;
    if (r < 0 || r >= Ho) continue;
    for (int dx = -half; dx <= half; ++dx) {
      const int q = x + dx;
      if (q < 0 || q >= Wo) continue;
      const int64_t at = static_cast<int64_t>(r) * Wo + q;
      const float w = __ldg(base + 3 * plane + at);
      su += __ldg(base + plane + at) * w;
      sv += __ldg(base + 2 * plane + at) * w;
      sw += w;
    }
  }
  const float area = static_cast<float>(box * box);
  su = su / area;
  sv = sv / area;
  sw = sw / area;
  const int64_t at = static_cast<int64_t>(y) * Wo + x;
  float* out = guess + static_cast<int64_t>(pair) * 2 * plane + at;
  const bool has = sw > 0.0f;
  out[0] = has ? su / sw : base[plane + at];
  out[plane] = has ? sv / sw : base[2 * plane + at];
}

template <typename T>
__global__ void lk_warp_kernel(const T* __restrict__ src, const float* __restrict__ guess, T* __restrict__ out, int H,
                               int W, int Hc, int Wc, int border, int factor) {
  const int pair = blockIdx.z;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= W || y >= H) return;
  float gx, gy;
  guess_offsets(guess + static_cast<int64_t>(pair) * 2 * Hc * Wc, y, x, H, W, Hc, Wc, border, factor, gx, gy);
  const int sy = min(max(y + static_cast<int>(gy), 0), H - 1);
  const int sx = min(max(x + static_cast<int>(gx), 0), W - 1);
  const int64_t frame = static_cast<int64_t>(pair) * H * W;
  out[frame + static_cast<int64_t>(y) * W + x] = src[frame + static_cast<int64_t>(sy) * W + sx];
}

template <typename T>
__device__ __forceinline__ float reduce_row_at(const T* __restrict__ row, int x, int W, float scale) {
  const int l = max(2 * x - 1, 0), c = min(2 * x, W - 1), r = min(2 * x + 1, W - 1);
  return ((unit_at(row, l, scale) + 2.0f * unit_at(row, c, scale)) + unit_at(row, r, scale)) * 0.25f;
}

template <typename T>
__global__ void lk_reduce_kernel(const T* __restrict__ src, float* __restrict__ dst, int H, int W, float scale) {
  const int frame = blockIdx.z;
  const int Hn = (H + 1) / 2, Wn = (W + 1) / 2;
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= Wn || y >= Hn) return;
  const T* s = src + static_cast<int64_t>(frame) * H * W;
  // The reference's [1 2 1] / 4 along rows at the three source rows, then along the column.
  const float h0 = reduce_row_at(s + static_cast<int64_t>(max(2 * y - 1, 0)) * W, x, W, scale);
  const float h1 = reduce_row_at(s + static_cast<int64_t>(min(2 * y, H - 1)) * W, x, W, scale);
  const float h2 = reduce_row_at(s + static_cast<int64_t>(min(2 * y + 1, H - 1)) * W, x, W, scale);
  dst[static_cast<int64_t>(frame) * Hn * Wn + static_cast<int64_t>(y) * Wn + x] = ((h0 + 2.0f * h1) + h2) * 0.25f;
}

constexpr int kSearchThreads = 256;

// One block per (shift k, pair): the sum over prev's central region [ry, H - ry) x [rx, W - rx)
// of |floor(quant * (cur[y + dy, x + dx] - prev[y, x]) + 0.5)|, k row-major over (dy, dx).
__global__ void lk_search_kernel(const float* __restrict__ prev_frames, const float* __restrict__ cur_frames,
                                 long long* __restrict__ sads, int H, int W, int ry, int rx, float quant) {
  const int k = blockIdx.x, pair = blockIdx.y;
  const int side = 2 * rx + 1;
  const int dy = k / side - ry, dx = k % side - rx;
  const int nr = H - 2 * ry, nc = W - 2 * rx;
  const float* prev = prev_frames + static_cast<int64_t>(pair) * H * W;
  const float* cur = cur_frames + static_cast<int64_t>(pair) * H * W;
  long long acc = 0;
  for (int i = threadIdx.x; i < nr * nc; i += blockDim.x) {
    const int y = i / nc + ry, x = i % nc + rx;
    const float d = cur[static_cast<int64_t>(y + dy) * W + x + dx] - prev[static_cast<int64_t>(y) * W + x];
    acc += static_cast<long long>(fabsf(floorf(d * quant + 0.5f)));
  }
  __shared__ long long part[kSearchThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kSearchThreads / 2; s > 0; s >>= 1) {  // integer sums: any order gives the same total
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) sads[static_cast<int64_t>(pair) * gridDim.x + k] = part[0];
}

inline dim3 grid_for(int64_t w, int64_t h, int n) {
  return dim3(static_cast<unsigned>((w + kBlockX - 1) / kBlockX), static_cast<unsigned>((h + kBlockY - 1) / kBlockY),
              static_cast<unsigned>(n));
}

// Launches `launch(first, count)` over chunks of at most 65,535 grid layers (pairs or frames).
template <typename Launch>
inline void in_chunks(int64_t total, Launch launch) {
  for (int64_t p0 = 0; p0 < total; p0 += kMaxGridZ)
    launch(p0, static_cast<int>(total - p0 < kMaxGridZ ? total - p0 : kMaxGridZ));
}

}  // namespace streammem

// prev, cur: (pairs, H, W) contiguous frames (cur may be a view one frame after prev), uint8
// (is_uint8 = 1) or float32, scaled by `scale` on load.  prods: (pairs, 5, H-2, W-2) float32 output.
STREAMMEM_EXPORT int streammem_motion_products(const void* prev, const void* cur, int is_uint8, float* prods,
                                               int64_t pairs, int64_t H, int64_t W, float scale, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  const int h = static_cast<int>(H), w = static_cast<int>(W);
  const int64_t plane = (H - 2) * (W - 2);
  streammem::in_chunks(pairs, [&](int64_t p0, int n) {
    const dim3 grid = streammem::grid_for(W - 2, H - 2, n);
    if (is_uint8)
      streammem::lk_products_kernel<uint8_t><<<grid, block, 0, s>>>(
          static_cast<const uint8_t*>(prev) + p0 * H * W, static_cast<const uint8_t*>(cur) + p0 * H * W,
          prods + p0 * 5 * plane, h, w, scale);
    else
      streammem::lk_products_kernel<float><<<grid, block, 0, s>>>(
          static_cast<const float*>(prev) + p0 * H * W, static_cast<const float*>(cur) + p0 * H * W,
          prods + p0 * 5 * plane, h, w, scale);
  });
  return static_cast<int>(cudaGetLastError());
}

// prods: (pairs, 5, Hg, Wg) float32; fields: (pairs, 4, Hg-window+1, Wg-window+1) float32 output.
// guess: (pairs, 2, Hc, Wc) float32, `factor` times coarser, or null (no composition).
STREAMMEM_EXPORT int streammem_motion_fields(const float* prods, float* fields, const float* guess, int64_t pairs,
                                             int64_t Hg, int64_t Wg, int64_t window, float min_eig, int64_t Hc,
                                             int64_t Wc, int64_t factor, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  const int64_t Ho = Hg - window + 1, Wo = Wg - window + 1;
  streammem::in_chunks(pairs, [&](int64_t p0, int n) {
    streammem::lk_window_kernel<<<streammem::grid_for(Wo, Ho, n), block, 0, s>>>(
        prods + p0 * 5 * Hg * Wg, fields + p0 * 4 * Ho * Wo, guess == nullptr ? nullptr : guess + p0 * 2 * Hc * Wc,
        static_cast<int>(Hg), static_cast<int>(Wg), static_cast<int>(window), min_eig, static_cast<int>(Hc),
        static_cast<int>(Wc), static_cast<int>(factor));
  });
  return static_cast<int>(cudaGetLastError());
}

// fields: (pairs, 4, Ho, Wo) float32; guess: (pairs, 2, Ho, Wo) float32 output; box: odd side.
STREAMMEM_EXPORT int streammem_motion_guess(const float* fields, float* guess, int64_t pairs, int64_t Ho, int64_t Wo,
                                            int64_t box, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  streammem::in_chunks(pairs, [&](int64_t p0, int n) {
    streammem::lk_guess_kernel<<<streammem::grid_for(Wo, Ho, n), block, 0, s>>>(
        fields + p0 * 4 * Ho * Wo, guess + p0 * 2 * Ho * Wo, static_cast<int>(Ho), static_cast<int>(Wo),
        static_cast<int>(box));
  });
  return static_cast<int>(cudaGetLastError());
}

// src, out: (pairs, H, W) contiguous, uint8 (is_uint8 = 1) or float32; guess: (pairs, 2, Hc, Wc) float32.
STREAMMEM_EXPORT int streammem_motion_warp(const void* src, int is_uint8, const float* guess, void* out, int64_t pairs,
                                           int64_t H, int64_t W, int64_t Hc, int64_t Wc, int64_t border,
                                           int64_t factor, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  const int h = static_cast<int>(H), w = static_cast<int>(W), hc = static_cast<int>(Hc), wc = static_cast<int>(Wc);
  streammem::in_chunks(pairs, [&](int64_t p0, int n) {
    const dim3 grid = streammem::grid_for(W, H, n);
    const float* g = guess + p0 * 2 * Hc * Wc;
    if (is_uint8)
      streammem::lk_warp_kernel<uint8_t><<<grid, block, 0, s>>>(static_cast<const uint8_t*>(src) + p0 * H * W, g,
                                                                 static_cast<uint8_t*>(out) + p0 * H * W, h, w, hc, wc,
                                                                 static_cast<int>(border), static_cast<int>(factor));
    else
      streammem::lk_warp_kernel<float><<<grid, block, 0, s>>>(static_cast<const float*>(src) + p0 * H * W, g,
                                                               static_cast<float*>(out) + p0 * H * W, h, w, hc, wc,
                                                               static_cast<int>(border), static_cast<int>(factor));
  });
  return static_cast<int>(cudaGetLastError());
}

// src: (frames, H, W) contiguous uint8 (is_uint8 = 1) or float32, scaled by `scale` on load;
// dst: (frames, (H+1)/2, (W+1)/2) float32 output.
STREAMMEM_EXPORT int streammem_motion_reduce(const void* src, int is_uint8, float* dst, int64_t frames, int64_t H,
                                             int64_t W, float scale, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const dim3 block(streammem::kBlockX, streammem::kBlockY);
  const int64_t Hn = (H + 1) / 2, Wn = (W + 1) / 2;
  streammem::in_chunks(frames, [&](int64_t f0, int n) {
    const dim3 grid = streammem::grid_for(Wn, Hn, n);
    if (is_uint8)
      streammem::lk_reduce_kernel<uint8_t><<<grid, block, 0, s>>>(static_cast<const uint8_t*>(src) + f0 * H * W,
                                                                   dst + f0 * Hn * Wn, static_cast<int>(H),
                                                                   static_cast<int>(W), scale);
    else
      streammem::lk_reduce_kernel<float><<<grid, block, 0, s>>>(static_cast<const float*>(src) + f0 * H * W,
                                                                 dst + f0 * Hn * Wn, static_cast<int>(H),
                                                                 static_cast<int>(W), scale);
  });
  return static_cast<int>(cudaGetLastError());
}

// prev, cur: (pairs, H, W) contiguous float32 frames; sads: (pairs, (2 ry + 1)(2 rx + 1)) int64 output.
STREAMMEM_EXPORT int streammem_motion_search(const float* prev, const float* cur, int64_t* sads, int64_t pairs,
                                             int64_t H, int64_t W, int64_t ry, int64_t rx, float quant,
                                             void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t shifts = (2 * ry + 1) * (2 * rx + 1);
  streammem::in_chunks(pairs, [&](int64_t p0, int n) {
    const dim3 grid(static_cast<unsigned>(shifts), static_cast<unsigned>(n));
    streammem::lk_search_kernel<<<grid, streammem::kSearchThreads, 0, s>>>(
        prev + p0 * H * W, cur + p0 * H * W, reinterpret_cast<long long*>(sads) + p0 * shifts, static_cast<int>(H),
        static_cast<int>(W), static_cast<int>(ry), static_cast<int>(rx), quant);
  });
  return static_cast<int>(cudaGetLastError());
}
