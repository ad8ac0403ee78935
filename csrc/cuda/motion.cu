// Lucas-Kanade motion magnitude, CUDA kernels (contract: streammem_kernels/motion.py).
//
// Stage 1 (lk_products): one thread per gradient pixel writes the five
// structure products (P, 5, H-2, W-2).  Stage 2 (lk_window): one thread per
// output pixel sums its w x w window (served from L1/L2), solves the 2x2
// system, and each block reduces (|flow|, count, u, v) to one partial; the
// host sums partials in float64 in a fixed order, so results are deterministic.
// Global mode (window == 0) reduces the products per block instead.
//
// Everything above `#ifndef STREAMMEM_KERNELS_ONLY` compiles with nvcc alone
// (CI compiles it for sm_80 and sm_90 without torch); the torch binding below
// is built only by setup.py when a CUDA torch is present.
#include <cuda_runtime.h>
#include <stdint.h>

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

template <int N>
__device__ void block_reduce(float (&vals)[N], float* partial) {
  __shared__ float shared[N][kBlockX * kBlockY / 32];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) vals[k] += __shfl_down_sync(0xffffffffu, vals[k], off);
  if ((tid & 31) == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) shared[k][tid >> 5] = vals[k];
  __syncthreads();
  if (tid == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float t = 0.0f;
      for (int w = 0; w < kBlockX * kBlockY / 32; ++w) t += shared[k][w];
      partial[k] = t;
    }
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
  block_reduce<4>(vals, partial);
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
  block_reduce<5>(vals, partial);
}

// Launchers.  `partials` must hold pairs * partial_blocks(...) * (window ? 4 : 5) floats.
inline dim3 grid_for(int w, int h, int pairs) {
  return dim3((w + kBlockX - 1) / kBlockX, (h + kBlockY - 1) / kBlockY, pairs);
}

inline int64_t partial_blocks(int H, int W, int window) {
  const int Hg = H - 2, Wg = W - 2;
  const int ho = window ? Hg - window + 1 : Hg, wo = window ? Wg - window + 1 : Wg;
  const dim3 g = grid_for(wo, ho, 1);
  return static_cast<int64_t>(g.x) * g.y;
}

template <typename T>
cudaError_t launch_lk_flow(const T* frames, float* prods, float* partials, int pairs, int H, int W, int window,
                           float min_eig, float scale, cudaStream_t stream) {
  const dim3 block(kBlockX, kBlockY);
  const int Hg = H - 2, Wg = W - 2;
  lk_products_kernel<T><<<grid_for(Wg, Hg, pairs), block, 0, stream>>>(frames, prods, H, W, scale);
  if (window == 0) {
    lk_global_kernel<<<grid_for(Wg, Hg, pairs), block, 0, stream>>>(prods, partials, Hg, Wg);
  } else {
    lk_window_kernel<<<grid_for(Wg - window + 1, Hg - window + 1, pairs), block, 0, stream>>>(prods, partials, Hg,
                                                                                            Wg, window, min_eig);
  }
  return cudaGetLastError();
}

template cudaError_t launch_lk_flow<uint8_t>(const uint8_t*, float*, float*, int, int, int, int, float, float,
                                             cudaStream_t);
template cudaError_t launch_lk_flow<float>(const float*, float*, float*, int, int, int, int, float, float,
                                           cudaStream_t);

}  // namespace streammem

#ifndef STREAMMEM_KERNELS_ONLY
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

namespace {

std::vector<torch::Tensor> lk_flow(torch::Tensor gray, int64_t window, double min_eig) {
  TORCH_CHECK(gray.is_cuda() && gray.dim() == 3 && gray.is_contiguous(), "gray must be a contiguous CUDA (T,H,W)");
  TORCH_CHECK(gray.scalar_type() == torch::kUInt8 || gray.scalar_type() == torch::kFloat32,
              "gray must be uint8 or float32");
  const c10::cuda::CUDAGuard guard(gray.device());
  const int pairs = static_cast<int>(gray.size(0) - 1), H = static_cast<int>(gray.size(1));
  const int W = static_cast<int>(gray.size(2));
  const auto fopts = gray.options().dtype(torch::kFloat32);
  auto prods = torch::empty({pairs, 5, H - 2, W - 2}, fopts);
  const int nvals = window ? 4 : 5;
  auto partials = torch::empty({pairs, streammem::partial_blocks(H, W, static_cast<int>(window)), nvals}, fopts);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaError_t err;
  if (gray.scalar_type() == torch::kUInt8)
    err = streammem::launch_lk_flow<uint8_t>(gray.data_ptr<uint8_t>(), prods.data_ptr<float>(),
                                             partials.data_ptr<float>(), pairs, H, W, static_cast<int>(window),
                                             static_cast<float>(min_eig), 1.0f / 255.0f, stream);
  else
    err = streammem::launch_lk_flow<float>(gray.data_ptr<float>(), prods.data_ptr<float>(), partials.data_ptr<float>(),
                                           pairs, H, W, static_cast<int>(window), static_cast<float>(min_eig), 1.0f,
                                           stream);
  TORCH_CHECK(err == cudaSuccess, "lk_flow launch failed: ", cudaGetErrorString(err));
  auto totals = partials.to(torch::kFloat64).sum(1);
  if (window == 0) {
    // Final 2x2 solve on the (pairs, 5) means, identical to the reference's.
    auto s = (totals / (static_cast<double>(H - 2) * (W - 2))).to(torch::kFloat32);
    auto a = s.select(1, 0), b = s.select(1, 1), c = s.select(1, 2);
    auto bx = -s.select(1, 3), by = -s.select(1, 4);
    auto det = a * c - b * b;
    auto lmax = 0.5 * ((a + c) + torch::sqrt((a - c) * (a - c) + 4.0 * b * b));
    auto lmin = det / torch::where(lmax > 0, lmax, torch::ones_like(lmax));
    auto valid = (lmax > 0) & (lmin > min_eig);
    auto safe = torch::where(valid, det, torch::ones_like(det));
    auto u = torch::where(valid, (c * bx - b * by) / safe, torch::zeros_like(det));
    auto v = torch::where(valid, (a * by - b * bx) / safe, torch::zeros_like(det));
    return {torch::sqrt(u * u + v * v), torch::stack({u, v}, 1)};
  }
  auto count = totals.select(1, 1).clamp_min(1.0);
  auto flow = (totals.select(1, 0) / count).to(torch::kFloat32);
  auto uv = (totals.slice(1, 2, 4) / count.unsqueeze(1)).to(torch::kFloat32);
  return {flow, uv};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lk_flow", &lk_flow, "Lucas-Kanade motion magnitude (CUDA)");
}
#endif
