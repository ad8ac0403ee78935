// The int8 scan copy of CosineIndex(int8_scan=True): its writer, the integer dot product the one-pass
// scan scores it with, and the error bound that makes the scan exact (used by index.cpp).
//
// A scan of 2 x 10^6 keys of D = 384 streams 3 GB of float32 rows per query: it is bound by DRAM
// bandwidth.  The int8 copy holds each row r as codes c_r (D int8 in [-127, 127]) and one float32
// scale s_r (the row ~ s_r c_r), a quarter of the bytes.  A query u is quantised the same way (codes
// p, scale t); the copy's score of row r is fl(fl(float(p . c_r) * t) * s_r), whose integer dot
// product is exact.  With a bound delta on its distance to the exact float32 score, the scan reads the
// float32 row only of the keys the bound cannot rule out of the top-k (index.cpp): the results are the
// float32 scan's, bit for bit, ties included.
#include "tree.h"

#include "common.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace streammem {
namespace tree {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kCodeMax = 127;

// Codes of one row x (D floats) into out, its scale returned (0 for a zero row: all codes 0).  Any
// scale and any rounding would keep the scan exact (the error is measured afterwards, not assumed);
// max |x| / 127 with rounding to nearest keeps it small.
float quantise_row(const float* x, int64_t D, int8_t* out) {
  float top = 0.f;
  for (int64_t d = 0; d < D; ++d) top = std::max(top, std::fabs(x[d]));
  if (!(top > 0.f)) {
    std::fill(out, out + D, int8_t(0));
    return 0.f;
  }
  const float scale = top / kCodeMax;
  for (int64_t d = 0; d < D; ++d) {
    const float c = std::nearbyint(x[d] / scale);
    out[d] = static_cast<int8_t>(std::clamp(c, -float(kCodeMax), float(kCodeMax)));
  }
  return scale;
}

// |x - scale * codes| (L2) and |x| in double, the squares' sums rounded up by 1 + 2^-30 (their relative
// error is at most D 2^-53 <= 2^-33 for D <= 2^20; scale * code is exact in double).
std::pair<double, double> row_error(const float* x, const int8_t* codes, float scale, int64_t D) {
  double ns = 0.0, es = 0.0;
  for (int64_t d = 0; d < D; ++d) {
    const double v = x[d], e = v - static_cast<double>(scale) * codes[d];
    ns += v * v;
    es += e * e;
  }
  constexpr double kUp = 1.0 + 0x1p-30;
  return {std::sqrt(ns) * kUp, std::sqrt(es) * kUp};
}

int32_t dot_int8_scalar(const int16_t* __restrict p, const int8_t* __restrict c, int64_t D) {
  int32_t s = 0;
  for (int64_t d = 0; d < D; ++d) s += int32_t(p[d]) * int32_t(c[d]);
  return s;
}

// The same sum with AVX2 (vpmaddwd: exact int16 products summed in pairs into int32) and with
// AVX-512 VNNI (vpdpwssd, the non-saturating form): |p_i c_i| <= 127^2, so the int32 sums are exact
// for D < 2^17 (index_topk checks D).
#if defined(__GNUC__) && defined(__x86_64__)
__attribute__((target("avx2"))) int32_t dot_int8_avx2(const int16_t* __restrict p, const int8_t* __restrict c,
                                                       int64_t D) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0;
  int64_t i = 0;
  for (; i + 32 <= D; i += 32) {
    const __m256i c0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
    const __m256i c1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i + 16)));
    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), c0));
    s1 = _mm256_add_epi32(s1,
                          _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)), c1));
  }
  const __m256i s = _mm256_add_epi32(s0, s1);
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
  int32_t out = _mm_cvtsi128_si32(h);
  for (; i < D; ++i) out += int32_t(p[i]) * int32_t(c[i]);
  return out;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) int32_t dot_int8_vnni(const int16_t* __restrict p,
                                                                             const int8_t* __restrict c, int64_t D) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0;
  int64_t i = 0;
  for (; i + 64 <= D; i += 64) {
    const __m512i c0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
    const __m512i c1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i + 32)));
    s0 = _mm512_dpwssd_epi32(s0, _mm512_loadu_si512(p + i), c0);
    s1 = _mm512_dpwssd_epi32(s1, _mm512_loadu_si512(p + i + 32), c1);
  }
  for (; i + 32 <= D; i += 32) {
    const __m512i c0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
    s0 = _mm512_dpwssd_epi32(s0, _mm512_loadu_si512(p + i), c0);
  }
  int32_t out = _mm512_reduce_add_epi32(_mm512_add_epi32(s0, s1));
  for (; i < D; ++i) out += int32_t(p[i]) * int32_t(c[i]);
  return out;
}
#endif

}  // namespace

DotInt8 dot_int8_kernel() {
#if defined(__GNUC__) && defined(__x86_64__)
  static const DotInt8 picked = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")
                                    ? &dot_int8_vnni
                                : __builtin_cpu_supports("avx2") ? &dot_int8_avx2
                                                                 : &dot_int8_scalar;
  return picked;
#else
  return &dot_int8_scalar;
#endif
}

const char* dot_int8_name() {
  const DotInt8 f = dot_int8_kernel();
#if defined(__GNUC__) && defined(__x86_64__)
  if (f == &dot_int8_vnni) return "avx512vnni";
  if (f == &dot_int8_avx2) return "avx2";
#endif
  return f == &dot_int8_scalar ? "scalar" : "unknown";
}

// The kernel named `name` ("avx512vnni", "avx2", "scalar"), or nullptr when this CPU lacks it.
DotInt8 dot_int8_named(const std::string& name) {
  if (name == "scalar") return &dot_int8_scalar;
#if defined(__GNUC__) && defined(__x86_64__)
  if (name == "avx2" && __builtin_cpu_supports("avx2")) return &dot_int8_avx2;
  if (name == "avx512vnni" && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw"))
    return &dot_int8_vnni;
#endif
  return nullptr;
}

float quantise_query(const float* u, int64_t D, int16_t* codes, double* err) {
  // int8 codes widened to int16, the form the kernels read (one row of codes per query, in cache).
  thread_local std::vector<int8_t> bytes;
  bytes.resize(static_cast<size_t>(D));
  const float scale = quantise_row(u, D, bytes.data());
  for (int64_t d = 0; d < D; ++d) codes[d] = bytes[d];
  *err = row_error(u, bytes.data(), scale, D).second;
  return scale;
}

// delta such that |c - a| <= delta for every stored row e (norm n as stored, copy s_r c_r), where
//   c = fl(fl(u . e) / n)                        the exact score (any summation order, FMA or not),
//   a = fl(fl(float(p . c_r) * t) * s_r)         the copy's score (p . c_r exact in int32),
// u the unit query, u' = t p its quantised form with |u - u'| <= query_err (measured), and over the
// rows |e| <= scan_norm, |e - s_r c_r| <= scan_err (measured when the copy was written).
//   real:    |u.e - u'.e'| <= |u - u'| |e| + |u'| |e - e'| <= qe N + (|u| + qe) E
//   a:       three roundings (the int to float conversion, two products): |a - u'.e'| <= g3 |u'| |e'|,
//            g3 = 3u / (1 - 3u), |u'| |e'| <= (|u| + qe)(N + E); underflow adds < 2^-100;
//   float:   |fl(u.e) - u.e| <= gamma_D |u| N, gamma_D = D u / (1 - D u), u = 2^-24 (Higham 3.1);
//   divide:  |c - fl(u.e)| <= 1.01 N slack + 2^-22 (index.cpp, prefilter_delta), slack = max |1/n - 1|.
// |u| is taken from a double sum (relative error <= 2^-33) plus 2^-30; the total 1/8 larger plus 2^-30
// as a margin for slips in this derivation, rounded up to a float.  The scan compares fl(a + delta) with
// the k-th score: c <= a + delta implies c <= fl(a + delta) (rounding is monotone, c is a float).
float int8_delta(const float* u, int64_t D, double query_err, double scan_norm, double scan_err, double norm_slack) {
  const double Du = static_cast<double>(D) * 0x1p-24;
  if (!(Du < 0.5) || !std::isfinite(scan_norm) || !std::isfinite(scan_err) || !std::isfinite(query_err) ||
      !std::isfinite(norm_slack))
    return kInf;
  double uu = 0.0;
  for (int64_t d = 0; d < D; ++d) uu += static_cast<double>(u[d]) * u[d];
  const double nu = std::sqrt(uu) * (1.0 + 0x1p-30) + 0x1p-30;
  const double gamma_d = Du / (1.0 - Du), g3 = 3.0 * 0x1p-24 / (1.0 - 3.0 * 0x1p-24);
  const double N = scan_norm, E = scan_err, qe = query_err;
  const double total = qe * N + (nu + qe) * E + g3 * (nu + qe) * (N + E) + 0x1p-100 + gamma_d * nu * N +
                       1.01 * N * norm_slack + 0x1p-22;
  const double delta = total * 1.125 + 0x1p-30;
  if (!(delta < 4.0)) return kInf;  // no useful bound: every key is scored exactly
  return bound_rounded_up(delta);
}

// int8_copy(src (n, D) f32, codes (n, D) i8, scales (n,) f32, bounds (2,) f64): writes the copy of src
// and the bounds (max row norm, max distance of a row to scale * codes).
Status int8_copy(TensorView src, TensorView codes, TensorView scales, TensorView bounds) {
  constexpr const char* entry = "int8_copy";
  expect_tensor(src, DType::kFloat32, 2, entry, "src");
  expect_tensor(codes, DType::kInt8, 2, entry, "codes");
  expect_tensor(scales, DType::kFloat32, 1, entry, "scales");
  expect_tensor(bounds, DType::kFloat64, 1, entry, "bounds");
  const int64_t n = src.size(0), D = src.size(1);
  expect(codes.size(0) == n && codes.size(1) == D && scales.size(0) == n && bounds.size(0) == 2 && D >= 1, entry,
         "codes must have the shape (n, D) of src, scales (n,), bounds 2 entries");
  const float* in = src.ptr<float>();
  int8_t* out = codes.ptr<int8_t>();
  float* scl = scales.ptr<float>();
  double norm = 0.0, err = 0.0;
  {
    py::gil_scoped_release nogil;
#pragma omp parallel for schedule(static) reduction(max : norm, err) \
    num_threads(threads_for(n * D, int64_t(1) << 22))
    for (int64_t r = 0; r < n; ++r) {
      scl[r] = quantise_row(in + r * D, D, out + r * D);
      const std::pair<double, double> b = row_error(in + r * D, out + r * D, scl[r], D);
      norm = std::max(norm, b.first);
      err = std::max(err, b.second);
    }
  }
  bounds.ptr<double>()[0] = norm;
  bounds.ptr<double>()[1] = err;
  return kOk;
}

// int8_dots(query (D,) f32, codes (n, D) i8, scales (n,) f32, out (n,) f32, kernel): the copy's scores
// of one (unit) query as the scan computes them, by this CPU's kernel ("") or the one named; for the tests.
Status int8_dots(TensorView query, TensorView codes, TensorView scales, TensorView out, const std::string& kernel) {
  constexpr const char* entry = "int8_dots";
  expect_tensor(query, DType::kFloat32, 1, entry, "query");
  expect_tensor(codes, DType::kInt8, 2, entry, "codes");
  expect_tensor(scales, DType::kFloat32, 1, entry, "scales");
  expect_tensor(out, DType::kFloat32, 1, entry, "out");
  const int64_t n = codes.size(0), D = codes.size(1);
  expect(query.size(0) == D && scales.size(0) == n && out.size(0) == n, entry,
         "query must be (D,), codes (n, D), scales and out (n,)");
  std::vector<int16_t> p(static_cast<size_t>(D));
  double qerr;
  const float t = quantise_query(query.ptr<float>(), D, p.data(), &qerr);
  const DotInt8 f = kernel.empty() ? dot_int8_kernel() : dot_int8_named(kernel);
  expect(f != nullptr, entry, "this CPU lacks the kernel " + kernel);
  for (int64_t r = 0; r < n; ++r)
    out.ptr<float>()[r] =
        static_cast<float>(f(p.data(), codes.ptr<int8_t>() + r * D, D)) * t * scales.ptr<float>()[r];
  return kOk;
}

}  // namespace tree
}  // namespace streammem
