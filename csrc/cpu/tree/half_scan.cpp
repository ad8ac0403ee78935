// The half-precision scan copy of CosineTree(half_scan=True): the float16 rows the beam search of
// search.cpp scores first, their writer and the error bound that makes the search exact.
//
// A beam search at 10^6 leaves is bound by the bytes it streams from DRAM (~500 rows of D floats
// per query).  With a float16 copy of the table the search reads half the bytes: it scores every
// level's pool on the copy, proves from an error bound which nodes can still be in the exact
// selection, and scores only those again, exactly as the float32 search does (same dot(), same
// selection): the results are the float32 search's, bit for bit, ties included.
#include "tree.h"

#include "common.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

namespace streammem {
namespace tree {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The copy holds zeros and normal float16 values only: |x| < 2^-14 (float16's subnormal range) is
// stored as 0, so every conversion back to float32 (F16C or the integer one) is exact whatever the
// MXCSR flush-to-zero / denormals-are-zero modes (torch.set_flush_denormal).  The conversions are
// integer code for the same reason.  The error of each row is measured when the copy is written
// (half_copy), not assumed, so flushing tiny entries only shows in the (measured) bound.
inline uint16_t half_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  const uint32_t sign = (b >> 16) & 0x8000u, mag = b & 0x7fffffffu;
  if (mag < 0x38800000u) return static_cast<uint16_t>(sign);             // |x| < 2^-14
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  uint32_t m = mag - 0x38000000u;                                         // exponent bias 127 -> 15
  m += 0x0fffu + ((m >> 13) & 1u);                                        // to nearest, ties to even
  return static_cast<uint16_t>(sign | (m >> 13));
}

inline float half_value(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, em = h & 0x7fffu;
  uint32_t b;
  if (em >= 0x7c00u) {
    b = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
  } else if (em >= 0x0400u) {
    b = sign | ((em << 13) + 0x38000000u);
  } else {  // zero or subnormal: em * 2^-24, a normal float (exact)
    const float v = static_cast<float>(em) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  float v;
  std::memcpy(&v, &b, sizeof(v));
  return v;
}

// sum_i q[i] * float(h[i]) in float32, in any order (only the bound below matters: the selection
// never ranks by this value), with F16C conversions (vcvtph2ps: 8 values per instruction), AVX2 and
// FMA (x86-64-v3).  Where the CPU lacks them the search ignores the copy (dot_half_kernel): a
// portable kernel (integer conversion, SSE2, vectorised) measured 172 us per 10^6-leaf beam here,
// against ~60 us for the float32 search and ~45 us for this one.
#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) float dot_half_f16c(const float* __restrict q,
                                                              const uint16_t* __restrict h, int64_t d) {
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    const __m128i* p = reinterpret_cast<const __m128i*>(h + i);
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtph_ps(_mm_loadu_si128(p)), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_cvtph_ps(_mm_loadu_si128(p + 1)), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 16), _mm256_cvtph_ps(_mm_loadu_si128(p + 2)), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 24), _mm256_cvtph_ps(_mm_loadu_si128(p + 3)), s3);
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  const __m128 h4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
  float out = _mm_cvtss_f32(_mm_add_ss(h2, _mm_shuffle_ps(h2, h2, 1)));
  for (; i < d; ++i) out += q[i] * half_value(h[i]);
  return out;
}
#endif

// Writes the copy of rows src (n, D) into dst (n, D) and returns upper bounds on max_r |src_r| and
// max_r |src_r - float(dst_r)| (L2 norms, summed in double: relative error <= D 2^-53 <= 2^-33
// for D <= 2^20, covered by the factor 1 + 2^-30).
std::pair<double, double> half_copy_into(const float* src, uint16_t* dst, int64_t n, int64_t D) {
  double norm_sq = 0.0, err_sq = 0.0;
#pragma omp parallel for schedule(static) reduction(max : norm_sq, err_sq) \
    num_threads(threads_for(n * D, int64_t(1) << 22))
  for (int64_t r = 0; r < n; ++r) {
    const float* row = src + r * D;
    uint16_t* out = dst + r * D;
    double ns = 0.0, es = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      out[d] = half_bits(row[d]);
      const double x = row[d], e = x - static_cast<double>(half_value(out[d]));
      ns += x * x;
      es += e * e;
    }
    norm_sq = std::max(norm_sq, ns);
    err_sq = std::max(err_sq, es);
  }
  constexpr double kUp = 1.0 + 0x1p-30;
  return {std::sqrt(norm_sq) * kUp, std::sqrt(err_sq) * kUp};
}

}  // namespace

// The copy's kernel on this CPU, or nullptr (the beam search then reads the float32 table only).
DotHalf dot_half_kernel() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const DotHalf picked = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2") &&
                                        __builtin_cpu_supports("fma")
                                    ? &dot_half_f16c
                                    : nullptr;
  return picked;
#else
  return nullptr;
#endif
}

// delta such that |dot(q, e) - dot_half(q, h)| <= delta for every row e of the table and its copy
// h, both computed in float32 (returned as a float rounded up; +inf when no useful bound exists).
//   exact:  |q.e - q.h| <= |q| |e - h| <= |q| scan_err                       (Cauchy-Schwarz)
//   float32 sums of D products, any order, FMA or not (Higham, Accuracy and Stability, 3.1):
//           |fl(q.e) - q.e| <= gamma_D sum |q_i e_i| <= gamma_D |q| scan_norm,
//           |fl(q.h) - q.h| <= gamma_D |q| |h| <= gamma_D |q| (scan_norm + scan_err),
//           gamma_D = D u / (1 - D u), u = 2^-24;
//   underflow (gradual or flushed) adds at most 2 D 2^-126 <= 2^-100 (D <= 2^20).
// So delta = |q| (scan_err + gamma_D (2 scan_norm + scan_err)), with |q| from a double sum (relative
// error <= 2^-33), taken 1/8 larger plus 2^-30 as a margin for slips in this derivation.  The
// selections then compare bounds fl(a - delta), fl(a + delta) of the float32 score c: since c is a
// float and c >= a - delta, c >= fl(a - delta) by the monotonicity of rounding (likewise above), so
// the rounding of those bounds needs no further margin.
float scan_delta(const float* q, int64_t D, double scan_norm, double scan_err) {
  const double Du = static_cast<double>(D) * 0x1p-24;
  if (!(Du < 0.5) || !std::isfinite(scan_norm) || !std::isfinite(scan_err)) return kInf;
  double qq = 0.0;
  for (int64_t d = 0; d < D; ++d) qq += static_cast<double>(q[d]) * q[d];
  const double nq = std::sqrt(qq) * (1.0 + 0x1p-30);
  const double gamma = Du / (1.0 - Du);
  const double delta = nq * (scan_err + gamma * (2.0 * scan_norm + scan_err)) * 1.125 + 0x1p-30;
  return bound_rounded_up(delta);
}

// half_copy(src (n, D) f32, dst (n, D) f16, bounds (2,) f64): writes the copy of src into dst and the
// bounds (max row norm, max distance of a row to its copy) into bounds.
Status half_copy(TensorView src, TensorView dst, TensorView bounds) {
  constexpr const char* entry = "half_copy";
  expect_tensor(src, DType::kFloat32, 2, entry, "src");
  expect_tensor(dst, DType::kFloat16, 2, entry, "dst");
  expect_tensor(bounds, DType::kFloat64, 1, entry, "bounds");
  expect(dst.size(0) == src.size(0) && dst.size(1) == src.size(1) && bounds.size(0) == 2 && src.size(1) >= 1, entry,
         "dst must have the shape (n, D) of src, bounds 2 entries");
  std::pair<double, double> b;
  {
    py::gil_scoped_release nogil;
    b = half_copy_into(src.ptr<float>(), dst.ptr<uint16_t>(), src.size(0), src.size(1));
  }
  bounds.ptr<double>()[0] = b.first;
  bounds.ptr<double>()[1] = b.second;
  return kOk;
}

// half_dots(query (D,) f32, rows (n, D) f16, out (n,) f32): the copy's kernel applied to the query and
// each row, for the tests; only where the CPU has the kernel (half_scan_kernel()).
Status half_dots(TensorView query, TensorView rows, TensorView out) {
  constexpr const char* entry = "half_dots";
  expect_tensor(query, DType::kFloat32, 1, entry, "query");
  expect_tensor(rows, DType::kFloat16, 2, entry, "rows");
  expect_tensor(out, DType::kFloat32, 1, entry, "out");
  const int64_t n = rows.size(0), D = rows.size(1);
  expect(query.size(0) == D && out.size(0) == n, entry, "query must be (D,), rows (n, D), out (n,)");
  const DotHalf f = dot_half_kernel();
  expect(f != nullptr, entry, "this CPU has no F16C/AVX2/FMA: the scan copy is not read here");
  for (int64_t r = 0; r < n; ++r) out.ptr<float>()[r] = f(query.ptr<float>(), rows.ptr<uint16_t>() + r * D, D);
  return kOk;
}

}  // namespace tree
}  // namespace streammem
