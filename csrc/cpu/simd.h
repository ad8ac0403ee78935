// 8-lane float32 vectors and the register-tiled kernels built on them, shared by the CPU kernels.
//
// GCC vector extensions, not intrinsics: the callers are STREAMMEM_HOT functions (compiled for
// x86-64-v3 and for the baseline ISA, picked at load time), so the same source becomes AVX2 + FMA
// in one clone and pairs of SSE registers in the other.  Everything here is always inlined into
// those callers, which is also why GCC's note about the ABI of 32-byte vector arguments
// (-Wpsabi) is moot: no vector ever crosses a function boundary.
//
// Results depend only on the values, never on addresses: lanes are assigned by element index,
// so the same row gives the same bits wherever it lies (identical embeddings tie exactly, which
// the lower-id tie rule of the searches relies on).
#pragma once

#include <cstdint>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"

namespace streammem {
namespace simd {

typedef float v8f __attribute__((vector_size(32)));

__attribute__((always_inline)) inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));  // unaligned load
  return v;
}

__attribute__((always_inline)) inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }

__attribute__((always_inline)) inline float lanes_sum(v8f v) {
  // Fixed pairwise order: (0+4, 1+5, 2+6, 3+7), then halves.
  const float s0 = v[0] + v[4], s1 = v[1] + v[5], s2 = v[2] + v[6], s3 = v[3] + v[7];
  return (s0 + s2) + (s1 + s3);
}

// sum_i a[i] * b[i] in float32: four 8-lane accumulators over blocks of 32 elements (element i
// goes to accumulator (i / 8) % 4, lane i % 8), combined in a fixed order, then the tail of
// fewer than 32 elements in order.  Four independent chains hide the FMA latency that a single
// accumulator (what `omp simd reduction` gives) waits on at every step.
__attribute__((always_inline)) inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  v8f s0 = {}, s1 = {}, s2 = {}, s3 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 += load8(a + i) * load8(b + i);
    s1 += load8(a + i + 8) * load8(b + i + 8);
    s2 += load8(a + i + 16) * load8(b + i + 16);
    s3 += load8(a + i + 24) * load8(b + i + 24);
  }
  float s = lanes_sum((s0 + s1) + (s2 + s3));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// dot(q, k) and dot(k, k) in one pass over k (the exact top-k's score and key norm while the key
// row is in L1), each with the accumulation order of dot() above, so the two results are bit for
// bit dot(q, k) and dot(k, k).
__attribute__((always_inline)) inline void dot_and_square(const float* __restrict q, const float* __restrict k,
                                                          int64_t n, float* qk, float* kk) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {}, c0 = {}, c1 = {}, c2 = {}, c3 = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const v8f k0 = load8(k + i), k1 = load8(k + i + 8), k2 = load8(k + i + 16), k3 = load8(k + i + 24);
    a0 += load8(q + i) * k0;
    a1 += load8(q + i + 8) * k1;
    a2 += load8(q + i + 16) * k2;
    a3 += load8(q + i + 24) * k3;
    c0 += k0 * k0;
    c1 += k1 * k1;
    c2 += k2 * k2;
    c3 += k3 * k3;
  }
  float s = lanes_sum((a0 + a1) + (a2 + a3)), t = lanes_sum((c0 + c1) + (c2 + c3));
  for (; i < n; ++i) {
    s += q[i] * k[i];
    t += k[i] * k[i];
  }
  *qk = s;
  *kk = t;
}

// The register-tiled GEMM micro-kernel of the k-means scores and the linear log-probs:
//   acc[r][v] += a(r, h) * b[h * b_stride + 8 v : ... + 8]   for h in [h0, h1), r < 6, v < NV,
// i.e. a 6 x (8 NV) tile of C += A B with one broadcast of A per row and NV 8-float loads of B
// per step: 6 x 2 accumulators + 2 B vectors + 1 broadcast fit the 16 AVX2 registers at NV = 2.
// `a(r, h)` reads element (r, h) of the A operand wherever the caller keeps it (packed panels,
// or rows of the input).  Accumulators are updated in h order, one multiply-add each.
constexpr int kTileRows = 6;

template <int NV, class ReadA>
__attribute__((always_inline)) inline void fma_tile(ReadA a, const float* __restrict b, int64_t b_stride,
                                                    int64_t h0, int64_t h1, v8f (&acc)[kTileRows][NV]) {
  for (int64_t h = h0; h < h1; ++h) {
    v8f bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load8(b + h * b_stride + 8 * v);
    for (int r = 0; r < kTileRows; ++r) {
      const float av = a(r, h);
      for (int v = 0; v < NV; ++v) acc[r][v] += av * bv[v];
    }
  }
}

}  // namespace simd
}  // namespace streammem
