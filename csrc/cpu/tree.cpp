// Cosine memory tree search and exact cosine top-k, CPU kernels.
//
// Contract (the specs: streammem_kernels/traversal.py for the searches, topk.py for the top-k).
// Per-call inputs arrive as raw pointers to C-contiguous CPU memory (common.h, in_ptr); the
// queries are the caller's float32 rows, *not* normalised: every entry point checks them
// (ValueError "queries must be finite, found NaN or Inf") and scales them to unit rows itself
// (unit_queries), so a public call needs no torch op before the kernel.
//   greedy(emb (n,D) f32 unit rows, child_ptr (n+1) i64, child_idx i64, roots (R) i64 ascending,
//          queries (Q,D) f32, Q, D, height, from_every_root)
//     -> path (Q,H+1) i64, path_scores (Q,H+1) f32, best_node (Q,) i64, best_score (Q,) f32,
//        with a root axis (Q,R,...) when from_every_root.
//   beam(emb, child_ptr, child_idx, roots, R, level (n) i64, utility (n) f32, queries, Q, D,
//        widths [H], k, min_score, use_utility)
//     -> ids (Q,k) i64, scores (Q,k) f32 (padded -1 / -inf); through a TreeView with a scan copy,
//        the same results read from the copy first (beam_into).
//   half_copy(src (n,D) f32, dst (n,D) f16 bits, n, D) -> (norm bound, error bound): writes the
//        half-precision scan copy of CosineTree(half_scan=True) and bounds what its beam search
//        needs (see "Half-precision scan copy"); half_scan_kernel() -> whether this CPU reads the
//        copy (F16C, AVX2, FMA); half_dots(query, rows) for the tests.
//   TreeView(pointers and sizes of a CosineTree snapshot, limits, keep; scan copy and its bounds) and
//   search_tensors(view, queries, beam, k, min_score, use_utility, from_every_root) -> the greedy or
//        beam result as torch tensors, or None: tree_search's fast path, on plain float32 CPU query
//        tensors read in place (tensor_args.h) and the public arguments checked here.
//   cosine_topk(queries, Q, keys (N,D) f32 raw, N, D, k, ranges (Q,2) i64 or 0 for whole)
//     -> ids (Q,k), scores (Q,k): one fused pass, key norms computed on the fly next to the dot
//        products while the key row is in L1; the keys' finiteness is read off the same pass
//        (a key's squared norm is finite unless it holds NaN/Inf or overflows, and only then is
//        the row itself checked), ranges are checked (ValueError) before the scan.
//   cosine_topk_tensors(queries, keys, k, max_queries, max_k) -> (ids, scores) torch tensors or None:
//        the same on plain float32 CPU tensors read in place (the public function's fast path).
//   topk_into_address() -> the address of the same top-k behind a C signature (topk_into_c), so
//        that graph.cpp's fused retrieval runs this scan instead of a copy of it.
//   unit_rows(queries (Q,D) f32) -> (Q,D) f32: the checked unit rows every entry point uses
//        (the BLAS path of topk.py multiplies with them).
//   row_norms(keys (N,D) f32) -> (N,) sqrt(dot(key, key)), the norms cosine_topk divides by.
//   topk_merge(dots (Q,B) f32, norms (B,) f32, queries (Q,D) f32 unit, keys (B,D) f32, offset,
//              ranges, ids (Q,k) inout, scores (Q,k) inout): folds one score block of
//        a BLAS GEMM into each query's running top-k (the GEMM filters, the
//        admitted keys are scored like cosine_topk scores them).
//   all_finite(values) -> bool.
//
// Dot products are simd::dot (four 8-lane accumulators, a fixed lane layout), so a row scores the
// same wherever it lies and identical rows tie exactly.  Every ranking orders by (score desc, id
// asc).  A running top-k is a sorted array: k is small (<= a few hundred) and, after the first
// few hundred keys, almost every candidate fails the one comparison with the current k-th.
#include "common.h"
#include "simd.h"
#include "tensor_args.h"

#include <pybind11/stl.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

namespace streammem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();
// Queries sharing one pass over a key row (the row stays in L1 for all of them).
constexpr int64_t kQueryBlock = 8;

STREAMMEM_HOT float dot(const float* __restrict a, const float* __restrict b, int64_t d) {
  return simd::dot(a, b, d);
}

// Validation pass without a boolean temporary: x - x is 0 for finite x and NaN for NaN/Inf, so
// one sum per chunk detects both.
STREAMMEM_HOT bool chunk_finite(const float* __restrict x, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i] - x[i];
  return acc == 0.f;
}

bool finite_values(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= (int64_t(1) << 20))
  for (int64_t c = 0; c < chunks; ++c)
    if (!chunk_finite(x + c * kChunk, std::min(kChunk, n - c * kChunk))) bad |= 1;
  return bad == 0;
}

// Squared norms in [kLowSquare, inf) are computed without loss by the plain dot product; rows
// outside (a norm above 1.8e19 overflows the square, one below ~1e-19 underflows it) are scaled
// by a power of two first (scaled_row), as the reference's unit_rows does for every row.  The
// scaling is exact, so both routes agree on ordinary rows; subnormal squares in a row whose
// squared norm is >= 2^-100 weigh at most D * 2^-49 of it.
constexpr float kLowSquare = 7.888609052210118e-31f;  // 2^-100
constexpr int kScaleExponent = 126;                   // _cosine.POW2_SCALE_EXPONENT

inline bool plain_square(float sq) { return sq >= kLowSquare && sq < kInf; }

// out = row * 2^-e with 2^e the power of two bringing max |row| into [0.5, 1) (exponent clamped
// to +-126); returns the norm of out (0 for an all-zero row, whose out is zero).
float scaled_row(const float* row, int64_t D, float* out) {
  float m = 0.f;
  for (int64_t d = 0; d < D; ++d) m = std::max(m, std::fabs(row[d]));
  if (m == 0.f) {
    std::fill(out, out + D, 0.f);
    return 0.f;
  }
  int e;
  std::frexp(m, &e);
  const float scale = std::ldexp(1.0f, -std::clamp(e, -kScaleExponent, kScaleExponent));
  for (int64_t d = 0; d < D; ++d) out[d] = row[d] * scale;
  return std::sqrt(dot(out, out, D));
}

// Queries scaled to unit L2 norm in float32, as the reference's unit_rows does: q / max(|q|, the
// smallest normal float), so a zero query stays zero and scores 0 everywhere; rows whose squared
// norm over- or underflows go through scaled_row.  Raises ValueError naming `name` on NaN/Inf (a
// finite |q|^2 proves the row finite; otherwise the row is checked, since squares of large
// finite values overflow too).
std::vector<float> unit_queries(const float* q, int64_t Q, int64_t D, const char* name) {
  std::vector<float> unit(static_cast<size_t>(Q * D));
  constexpr float kTiny = std::numeric_limits<float>::min();
  for (int64_t r = 0; r < Q; ++r) {
    const float* row = q + r * D;
    const float sq = dot(row, row, D);
    require(std::isfinite(sq) || chunk_finite(row, D), std::string(name) + " must be finite, found NaN or Inf");
    float* out = unit.data() + r * D;
    if (plain_square(sq)) {
      const float norm = std::sqrt(sq);
      for (int64_t d = 0; d < D; ++d) out[d] = row[d] / norm;
    } else {
      const float norm = std::max(scaled_row(row, D, out), kTiny);
      for (int64_t d = 0; d < D; ++d) out[d] /= norm;
    }
  }
  return unit;
}

// Beam search scores nodes scattered over a tree far larger than the caches (a 10^6-leaf tree of
// D = 384 is 1.7 GB): each row is a run of cache misses.  Asking for the row kAhead candidates
// ahead overlaps those misses with the dot products in between.
constexpr size_t kAhead = 4;

inline void prefetch_bytes(const void* start, int64_t bytes) {
  const char* p = static_cast<const char*>(start);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
}

inline void prefetch_row(const float* row, int64_t D) { prefetch_bytes(row, D * int64_t(sizeof(float))); }

inline void prefetch_half(const uint16_t* row, int64_t D) { prefetch_bytes(row, D * int64_t(sizeof(uint16_t))); }

inline bool better(float s1, int64_t i1, float s2, int64_t i2) { return s1 > s2 || (s1 == s2 && i1 < i2); }

// Sorted top-k of one query living in caller memory (ids -1 / scores -inf = empty).
struct TopK {
  float* score;
  int64_t* id;
  int64_t k;
  int64_t count;

  TopK(float* s, int64_t* i, int64_t k_) : score(s), id(i), k(k_), count(0) {
    while (count < k && id[count] >= 0) ++count;
  }
  bool admits(float s, int64_t i) const { return count < k || better(s, i, score[k - 1], id[k - 1]); }
  void push(float s, int64_t i) {
    if (!admits(s, i)) return;
    int64_t p = count < k ? count : k - 1;
    while (p > 0 && better(s, i, score[p - 1], id[p - 1])) {
      score[p] = score[p - 1];
      id[p] = id[p - 1];
      --p;
    }
    score[p] = s;
    id[p] = i;
    if (count < k) ++count;
  }
};

template <typename T, int Flags>
T* out_ptr(py::array_t<T, Flags>& a) {
  return static_cast<T*>(a.mutable_data());
}

// In-place outputs must be the caller's own buffers: a converting cast would
// silently write into a temporary copy.
template <typename T>
T* inplace_ptr(py::array& a, const char* name) {
  require(a.dtype().is(py::dtype::of<T>()) && (a.flags() & py::array::c_style) && a.writeable(),
          std::string("topk_merge: ") + name + " must be a writeable C-contiguous array of the right dtype");
  return static_cast<T*>(a.mutable_data());
}

// ---------------------------------------------------------------------------
// Greedy descent (Algorithm 1)
// ---------------------------------------------------------------------------
// The tree a search reads: raw pointers into C-contiguous CPU memory the caller keeps alive.
struct TreeArrays {
  const float* emb;  // (n, D) unit rows
  int64_t D;
  const int64_t* child_ptr;  // (n + 1)
  const int64_t* child_idx;
  const int64_t* roots;  // (R) ascending
  int64_t R;
  const int64_t* level;  // (n)
  const float* utility;  // (n)
  // Optional half-precision scan copy of emb (CosineTree(half_scan=True), see "Half-precision scan
  // copy" below): (n, D) float16 bits, and upper bounds on the norm of every emb row and on the
  // distance of every row to its copy; nullptr when the tree keeps none.
  const uint16_t* scan = nullptr;
  double scan_norm = 0.0;
  double scan_err = 0.0;
};

// ---------------------------------------------------------------------------
// Half-precision scan copy
// ---------------------------------------------------------------------------
// A beam search at 10^6 leaves is bound by the bytes it streams from DRAM (~500 rows of D floats
// per query).  With a float16 copy of the table the search reads half the bytes: it scores every
// level's pool on the copy, proves from an error bound which nodes can still be in the exact
// selection, and scores only those again, exactly as the float32 search does (same dot(), same
// selection): the results are the float32 search's, bit for bit, ties included.
//
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

using DotHalf = float (*)(const float*, const uint16_t*, int64_t);

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

// Writes the copy of rows src (n, D) into dst (n, D) and returns upper bounds on max_r |src_r| and
// max_r |src_r - float(dst_r)| (L2 norms, summed in double: relative error <= D 2^-53 <= 2^-33
// for D <= 2^20, covered by the factor 1 + 2^-30).
std::pair<double, double> half_copy_into(const float* src, uint16_t* dst, int64_t n, int64_t D) {
  double norm_sq = 0.0, err_sq = 0.0;
#pragma omp parallel for schedule(static) reduction(max : norm_sq, err_sq) if (n * D >= (int64_t(1) << 22))
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

py::tuple half_copy(std::uintptr_t src_ptr, std::uintptr_t dst_ptr, int64_t n, int64_t D) {
  require(n >= 0 && D >= 1, "half_copy: bad sizes");
  std::pair<double, double> bounds;
  {
    py::gil_scoped_release nogil;
    bounds = half_copy_into(in_ptr<float>(src_ptr), reinterpret_cast<uint16_t*>(dst_ptr), n, D);
  }
  return py::make_tuple(bounds.first, bounds.second);
}

// The copy's kernel applied to query (D,) and each row of rows (n, D) (float16 bits), for the tests;
// ValueError where the CPU has no such kernel.
py::array_t<float> half_dots(carray<float> query, py::array_t<uint16_t, py::array::c_style> rows) {
  require(query.ndim() == 1 && rows.ndim() == 2 && rows.shape(1) == query.shape(0), "half_dots: bad shapes");
  const int64_t n = rows.shape(0), D = rows.shape(1);
  const DotHalf f = dot_half_kernel();
  require(f != nullptr, "half_dots: this CPU has no F16C/AVX2/FMA, the scan copy is not read here");
  py::array_t<float> out(n);
  for (int64_t r = 0; r < n; ++r) out_ptr(out)[r] = f(query.data(), rows.data() + r * D, D);
  return out;
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
  float out = static_cast<float>(delta);
  if (static_cast<double>(out) < delta) out = std::nextafter(out, kInf);
  return out;
}

// Greedy descent of Q unit queries Qm (Q, D) into P, PS (S, height + 1) and BN, BS (S,), with
// S = Q x R when from_every_root (else Q).  Runs without the GIL.
void greedy_into(const TreeArrays& t, const float* Qm, int64_t Q, int64_t height, bool from_every_root, int64_t* P,
                 float* PS, int64_t* BN, float* BS) {
  const int64_t D = t.D, R = t.R, width = height + 1;
  const int64_t S = from_every_root ? Q * R : Q;
  const float* E = t.emb;
  const int64_t* ptr = t.child_ptr;
  const int64_t* kids = t.child_idx;
  const int64_t* root = t.roots;
  {
    // A parallel region costs more than a few short descents (and much more
    // when the cores are oversubscribed): small batches run on one thread.
#pragma omp parallel for schedule(dynamic, 16) if (S * width >= 256)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t q = from_every_root ? s / R : s;
      const float* qv = Qm + q * D;
      int64_t* p = P + s * width;
      float* ps = PS + s * width;
      std::fill(p, p + width, int64_t(-1));
      std::fill(ps, ps + width, kNegInf);
      int64_t cur;
      float cur_score;
      if (from_every_root) {
        cur = root[s % R];
        cur_score = dot(qv, E + cur * D, D);
      } else {
        cur = -1;
        cur_score = kNegInf;
        for (int64_t r = 0; r < R; ++r) {
          const float sc = dot(qv, E + root[r] * D, D);
          if (cur < 0 || sc > cur_score) {  // first maximum: the lowest root id
            cur = root[r];
            cur_score = sc;
          }
        }
      }
      p[0] = cur;
      ps[0] = cur_score;
      for (int64_t step = 1; step < width; ++step) {
        const int64_t lo = ptr[cur], hi = ptr[cur + 1];
        if (lo == hi) break;
        int64_t nxt = -1;
        float nxt_score = kNegInf;
        for (int64_t e = lo; e < hi; ++e) {
          const int64_t c = kids[e];
          if (e + 1 < hi) __builtin_prefetch(E + kids[e + 1] * D);
          const float sc = dot(qv, E + c * D, D);
          if (nxt < 0 || sc > nxt_score) {
            nxt = c;
            nxt_score = sc;
          }
        }
        p[step] = nxt;
        ps[step] = nxt_score;
        cur = nxt;
      }
      // Running best from -inf with a strict '>': the first maximum on the path.
      int64_t bi = 0;
      for (int64_t i = 1; i < width && p[i] >= 0; ++i)
        if (ps[i] > ps[bi]) bi = i;
      BN[s] = p[bi];
      BS[s] = ps[bi];
    }
  }
}

// Output arrays of a greedy search: path (lead..., H+1), path_scores, best_node (lead), best_score.
// (Built in the member initialisers: a default-constructed py::array_t allocates an empty array.)
struct GreedyOut {
  using Shape = std::vector<py::ssize_t>;
  py::array_t<int64_t> path;
  py::array_t<float> path_scores;
  py::array_t<int64_t> best_node;
  py::array_t<float> best_score;

  static Shape lead(int64_t Q, int64_t R, bool from_every_root) { return from_every_root ? Shape{Q, R} : Shape{Q}; }
  static Shape full(int64_t Q, int64_t R, int64_t height, bool from_every_root) {
    Shape s = lead(Q, R, from_every_root);
    s.push_back(height + 1);
    return s;
  }
  GreedyOut(int64_t Q, int64_t R, int64_t height, bool from_every_root)
      : path(full(Q, R, height, from_every_root)),
        path_scores(full(Q, R, height, from_every_root)),
        best_node(lead(Q, R, from_every_root)),
        best_score(lead(Q, R, from_every_root)) {}
};

GreedyOut greedy_run(const TreeArrays& t, const float* queries, int64_t Q, int64_t height, bool from_every_root) {
  require(t.R >= 1, "greedy: the tree has no roots");
  require(Q >= 1 && t.D >= 1 && height >= 0, "greedy: bad sizes");
  const std::vector<float> unit = unit_queries(queries, Q, t.D, "queries");
  GreedyOut out(Q, t.R, height, from_every_root);
  int64_t* P = out_ptr(out.path);
  float* PS = out_ptr(out.path_scores);
  int64_t* BN = out_ptr(out.best_node);
  float* BS = out_ptr(out.best_score);
  {
    py::gil_scoped_release nogil;
    greedy_into(t, unit.data(), Q, height, from_every_root, P, PS, BN, BS);
  }
  return out;
}

py::tuple greedy(std::uintptr_t emb_ptr, int64_t D, std::uintptr_t child_ptr_ptr, std::uintptr_t child_idx_ptr,
                 std::uintptr_t roots_ptr, int64_t R, std::uintptr_t queries_ptr, int64_t Q, int64_t height,
                 bool from_every_root) {
  const TreeArrays t{in_ptr<float>(emb_ptr), D, in_ptr<int64_t>(child_ptr_ptr), in_ptr<int64_t>(child_idx_ptr),
                     in_ptr<int64_t>(roots_ptr), R, nullptr, nullptr};
  GreedyOut out = greedy_run(t, in_ptr<float>(queries_ptr), Q, height, from_every_root);
  return py::make_tuple(out.path, out.path_scores, out.best_node, out.best_score);
}

// ---------------------------------------------------------------------------
// Level-synchronous beam search
// ---------------------------------------------------------------------------
// Beam search of Q unit queries Qm (Q, D), widths W[0..H) from the top level, into I, S (Q, k).
// Runs without the GIL.
//
// With a scan copy (t.scan), each pool is first scored on the copy (a_i, within delta of the exact
// float32 score c_i, see scan_delta), and only the nodes that may belong to the exact selection are
// scored exactly and selected as without the copy:
// * a level keeping `width` nodes: L = the width-th largest fl(a_i - delta); a node with
//   fl(a_i + delta) < L has c_i < c_j for `width` other nodes j, so it cannot be kept.  When exactly
//   `width` nodes remain, they are the kept set and nothing is scored exactly.
// * the leaves: a leaf with fl(a_i + delta) < min_score fails the filter; the others' keys lie in
//   [key_lo, key_hi] (cos, or cos x utility: fl(lo x u) and fl(hi x u) in the order of u's sign,
//   again by monotone rounding, so any finite utility, 0 and negative included, needs no extra
//   margin); with T the k-th largest key_lo among leaves certain to pass (fl(a_i - delta) >=
//   min_score; -inf when fewer than k are), a leaf with key_hi < T ranks below k passing leaves.
// The leaves left are scored exactly, filtered and ranked as without the copy.
constexpr size_t kSmallSelect = 32;

// The n best values of v (n <= min(v.size(), kSmallSelect); `before` a strict order) into
// top[0..n), best first: the n best so far in a sorted array, which after the first few values most
// values leave with one comparison.  The beam's selections of up to 32 (widths, k, their bounds) use
// it instead of nth_element / partial_sort, whose partitions mispredict about every other branch
// (perf: 11% of a 10^6-leaf search with the scan copy, ~5% without).
template <typename T, typename Before>
void small_best(const std::vector<T>& v, size_t n, Before before, T* top) {
  if (n == 0) return;
  size_t count = 0;
  for (const T& x : v) {
    if (count == n && !before(x, top[n - 1])) continue;
    size_t p = count < n ? count++ : n - 1;
    for (; p > 0 && before(x, top[p - 1]); --p) top[p] = top[p - 1];
    top[p] = x;
  }
}

void beam_into(const TreeArrays& t, const float* Qm, int64_t Q, const int64_t* W, int64_t H, int64_t k,
               float min_score, bool use_utility, int64_t* I, float* S) {
  const int64_t D = t.D, R = t.R;
  const float* E = t.emb;
  const uint16_t* HS = t.scan;
  const int64_t* ptr = t.child_ptr;
  const int64_t* kids = t.child_idx;
  const int64_t* root = t.roots;
  const int64_t* lvl = t.level;
  const float* util = t.utility;
  const DotHalf dot_half = dot_half_kernel();
  {
#pragma omp parallel if (Q >= 8)
    {
      std::vector<int64_t> pending, next, at_level, exact;
      std::vector<std::pair<float, int64_t>> pool;
      std::vector<float> approx, bound;
      // One allocation each for a typical search (beam (5, 10) over fan-out 10 holds ~100 nodes
      // per level) instead of a growth series.
      for (auto* v : {&pending, &next, &at_level, &exact}) v->reserve(256);
      pool.reserve(256);
      auto by_rank = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
        return better(a.first, a.second, b.first, b.second);
      };
      // pool += (dot(q, row), node) for each node, the rows asked for kAhead nodes ahead.
      auto score_exact = [&](const float* qv, const std::vector<int64_t>& nodes) {
        const size_t np = nodes.size();
        for (size_t i = 0; i < std::min<size_t>(kAhead, np); ++i) prefetch_row(E + nodes[i] * D, D);
        for (size_t i = 0; i < np; ++i) {
          if (i + kAhead < np) prefetch_row(E + nodes[i + kAhead] * D, D);
          pool.emplace_back(dot(qv, E + nodes[i] * D, D), nodes[i]);
        }
      };
      // approx[i] = the copy's score of nodes[i].
      auto score_half = [&](const float* qv, const std::vector<int64_t>& nodes) {
        const size_t np = nodes.size();
        approx.resize(np);
        for (size_t i = 0; i < std::min<size_t>(kAhead, np); ++i) prefetch_half(HS + nodes[i] * D, D);
        for (size_t i = 0; i < np; ++i) {
          if (i + kAhead < np) prefetch_half(HS + nodes[i + kAhead] * D, D);
          approx[i] = dot_half(qv, HS + nodes[i] * D, D);
        }
      };
      // Moves the n best of pool (by_rank, n <= pool.size()) to pool[0..n), best first (the ranking
      // is a total order, so the set and its order are nth_element's / partial_sort's).
      auto best_first = [&](size_t n) {
        if (n > kSmallSelect) {
          std::partial_sort(pool.begin(), pool.begin() + n, pool.end(), by_rank);
          return;
        }
        std::pair<float, int64_t> top[kSmallSelect];
        small_best(pool, n, by_rank, top);
        std::copy(top, top + n, pool.begin());
      };
      // The n-th largest of bound[0..) (n >= 1, bound.size() >= n; larger n reorders bound).
      auto nth_largest = [&](size_t n) {
        if (n > kSmallSelect) {
          std::nth_element(bound.begin(), bound.begin() + (n - 1), bound.end(), std::greater<float>());
          return bound[n - 1];
        }
        float top[kSmallSelect];
        small_best(bound, n, std::greater<float>(), top);
        return top[n - 1];
      };
#pragma omp for schedule(dynamic, 8)
      for (int64_t q = 0; q < Q; ++q) {
        const float* qv = Qm + q * D;
        const float delta = HS != nullptr && dot_half != nullptr ? scan_delta(qv, D, t.scan_norm, t.scan_err) : kInf;
        const bool half = delta < kInf;
        pending.assign(root, root + R);
        for (int64_t step = 0; step < H; ++step) {
          const int64_t at = H - step;
          at_level.clear();
          next.clear();
          for (const int64_t node : pending) (lvl[node] == at ? at_level : next).push_back(node);
          if (at_level.empty()) continue;
          const size_t width = static_cast<size_t>(W[step]);
          if (at_level.size() > width) {
            const std::vector<int64_t>* scored = &at_level;
            bool settled = false;
            if (half) {
              score_half(qv, at_level);
              bound.resize(approx.size());
              for (size_t i = 0; i < approx.size(); ++i) bound[i] = approx[i] - delta;
              const float floor_kept = nth_largest(width);
              exact.clear();
              for (size_t i = 0; i < approx.size(); ++i)
                if (approx[i] + delta >= floor_kept) exact.push_back(at_level[i]);
              // At least `width` remain (the width largest lower bounds' own upper bounds reach L).
              if (exact.size() == width) {
                at_level.swap(exact);  // the copy alone proved which nodes are kept
                settled = true;
              } else if (exact.size() > width) {
                scored = &exact;
              }
            }
            if (!settled) {
              pool.clear();
              score_exact(qv, *scored);
              best_first(width);  // only the set kept matters (the ranking is a total order)
              at_level.clear();
              for (size_t i = 0; i < width; ++i) at_level.push_back(pool[i].second);
            }
          }  // else every node of the level is kept: none needs a score
          for (const int64_t node : at_level) next.insert(next.end(), kids + ptr[node], kids + ptr[node + 1]);
          pending.swap(next);
        }
        const std::vector<int64_t>* leaves = &pending;
        if (half && !pending.empty()) {
          score_half(qv, pending);
          bound.clear();
          for (size_t i = 0; i < pending.size(); ++i) {
            const float lo = approx[i] - delta;
            if (!(lo >= min_score)) continue;
            if (!use_utility) {
              bound.push_back(lo);
            } else {
              const float u = util[pending[i]];
              bound.push_back(u >= 0.f ? lo * u : (approx[i] + delta) * u);
            }
          }
          const size_t kk = static_cast<size_t>(k);
          const float floor_key = bound.size() >= kk ? nth_largest(kk) : kNegInf;
          exact.clear();
          for (size_t i = 0; i < pending.size(); ++i) {
            const float hi = approx[i] + delta;
            if (!(hi >= min_score)) continue;
            float key_hi = hi;
            if (use_utility) {
              const float u = util[pending[i]];
              key_hi = u >= 0.f ? hi * u : (approx[i] - delta) * u;
            }
            if (key_hi >= floor_key) exact.push_back(pending[i]);
          }
          leaves = &exact;
        }
        pool.clear();
        const size_t np = leaves->size();
        for (size_t i = 0; i < std::min<size_t>(kAhead, np); ++i) prefetch_row(E + (*leaves)[i] * D, D);
        for (size_t i = 0; i < np; ++i) {
          const int64_t node = (*leaves)[i];
          if (i + kAhead < np) prefetch_row(E + (*leaves)[i + kAhead] * D, D);
          const float cos = dot(qv, E + node * D, D);
          if (!(cos >= min_score)) continue;
          pool.emplace_back(use_utility ? cos * util[node] : cos, node);
        }
        const size_t keep = std::min<size_t>(static_cast<size_t>(k), pool.size());
        best_first(keep);
        for (int64_t i = 0; i < k; ++i) {
          const bool have = static_cast<size_t>(i) < keep;
          I[q * k + i] = have ? pool[i].second : -1;
          S[q * k + i] = have ? pool[i].first : kNegInf;
        }
      }
    }
  }
}

// ids (Q, k) int64 and scores (Q, k) float32 of a beam search.
std::pair<py::array_t<int64_t>, py::array_t<float>> beam_run(const TreeArrays& t, const float* queries, int64_t Q,
                                                             const int64_t* W, int64_t H, int64_t k, float min_score,
                                                             bool use_utility) {
  require(k >= 1, "beam: k must be >= 1");
  require(Q >= 1 && t.D >= 1, "beam: bad sizes");
  const std::vector<float> unit = unit_queries(queries, Q, t.D, "queries");
  py::array_t<int64_t> ids({Q, k});
  py::array_t<float> scores({Q, k});
  int64_t* I = out_ptr(ids);
  float* S = out_ptr(scores);
  {
    py::gil_scoped_release nogil;
    beam_into(t, unit.data(), Q, W, H, k, min_score, use_utility, I, S);
  }
  return {std::move(ids), std::move(scores)};
}

py::tuple beam(std::uintptr_t emb_ptr, int64_t D, std::uintptr_t child_ptr_ptr, std::uintptr_t child_idx_ptr,
               std::uintptr_t roots_ptr, int64_t R, std::uintptr_t level_ptr, std::uintptr_t utility_ptr,
               std::uintptr_t queries_ptr, int64_t Q, const std::vector<int64_t>& widths, int64_t k,
               float min_score, bool use_utility) {
  const TreeArrays t{in_ptr<float>(emb_ptr), D, in_ptr<int64_t>(child_ptr_ptr), in_ptr<int64_t>(child_idx_ptr),
                     in_ptr<int64_t>(roots_ptr), R, in_ptr<int64_t>(level_ptr), in_ptr<float>(utility_ptr)};
  auto out = beam_run(t, in_ptr<float>(queries_ptr), Q, widths.data(), static_cast<int64_t>(widths.size()), k,
                      min_score, use_utility);
  return py::make_tuple(out.first, out.second);
}

// ---------------------------------------------------------------------------
// The public function's fast path on tensors (traversal.tree_search)
// ---------------------------------------------------------------------------
// One snapshot of a CosineTree (cosine_tree.SearchArrays) as the kernels read it: its pointers and
// sizes, the limits of the public function, and a reference to the snapshot's tensors, which it
// keeps alive (a search holding the view stays in bounds whatever other threads do to the tree).
struct TreeView {
  TreeArrays arrays;
  int64_t height;
  int64_t num_live;
  int64_t max_results;
  int64_t max_width;
  py::object keep;
};

// Per-level widths from the top (the last repeats) of a beam the Python fast path accepts: an int in
// (1, max_width] or a non-empty tuple of ints in [1, max_width] (exact ints: bool and numpy
// integers go through the general path).  False for anything else.
bool beam_widths(py::handle beam, int64_t height, int64_t max_width, std::vector<int64_t>* widths) {
  namespace ta = tensor_args;
  int64_t one;
  std::vector<int64_t> given;
  if (ta::exact_int(beam, &one)) {
    if (one <= 1 || one > max_width) return false;
    given.push_back(one);
  } else if (PyTuple_CheckExact(beam.ptr()) && PyTuple_GET_SIZE(beam.ptr()) > 0) {
    const Py_ssize_t n = PyTuple_GET_SIZE(beam.ptr());
    for (Py_ssize_t i = 0; i < n; ++i) {
      if (!ta::exact_int(PyTuple_GET_ITEM(beam.ptr(), i), &one) || one < 1 || one > max_width) return false;
      given.push_back(one);
    }
  } else {
    return false;
  }
  widths->resize(static_cast<size_t>(std::max<int64_t>(height, 0)));
  for (size_t i = 0; i < widths->size(); ++i) (*widths)[i] = given[std::min(i, given.size() - 1)];
  return true;
}

// tree_search on a tree view and plain float32 CPU queries (Q, D) (tensor_args.h) with arguments
// the public function would accept unchanged: greedy (beam the int 1, k the int 1, min_score None,
// use_utility False) -> (path, path_scores, best_node, best_score); beam search (k an int >= 1,
// min_score None or a finite int/float, use_utility a bool, from_every_root False) -> (ids, scores),
// as torch tensors.  None for anything else (the general path then validates, explains and
// dispatches); ValueError for NaN/Inf queries, as the kernels raise it on every path.
py::object search_tensors(const TreeView& v, py::handle queries, py::handle beam, py::handle k_obj,
                          py::handle min_score, py::handle use_utility, py::handle from_every_root) {
  namespace ta = tensor_args;
  ta::Plain<2> q;
  if (v.num_live < 1 || v.arrays.R < 1 || !PyBool_Check(from_every_root.ptr()) ||
      !PyBool_Check(use_utility.ptr()) || !ta::plain_cpu(queries, ta::torch_objects().float32, &q))
    return py::none();
  const int64_t Q = q.size[0];
  if (Q < 1 || q.size[1] != v.arrays.D) return py::none();
  const bool every_root = from_every_root.ptr() == Py_True, utility = use_utility.ptr() == Py_True;
  int64_t k;
  if (!ta::exact_int(k_obj, &k)) return py::none();
  int64_t greedy_beam;
  if (ta::exact_int(beam, &greedy_beam) && greedy_beam == 1) {
    if (k != 1 || !min_score.is_none() || utility) return py::none();
    if (every_root && Q > v.max_results / (v.arrays.R * (v.height + 1))) return py::none();  // no overflow
    GreedyOut out = greedy_run(v.arrays, in_ptr<float>(q.data), Q, v.height, every_root);
    return py::make_tuple(ta::to_tensor(out.path), ta::to_tensor(out.path_scores), ta::to_tensor(out.best_node),
                          ta::to_tensor(out.best_score));
  }
  if (every_root || k < 1 || k > v.max_results / Q) return py::none();  // Q x k <= max_results, no overflow
  float min_val = kNegInf;
  if (!min_score.is_none()) {
    double m;
    if (PyFloat_CheckExact(min_score.ptr())) {
      m = PyFloat_AS_DOUBLE(min_score.ptr());
    } else if (PyLong_CheckExact(min_score.ptr())) {
      m = PyLong_AsDouble(min_score.ptr());
      if (m == -1.0 && PyErr_Occurred()) {  // too large for a double
        PyErr_Clear();
        return py::none();
      }
    } else {
      return py::none();
    }
    if (!std::isfinite(m)) return py::none();
    min_val = static_cast<float>(m);
  }
  std::vector<int64_t> widths;
  if (!beam_widths(beam, v.height, v.max_width, &widths)) return py::none();
  auto out = beam_run(v.arrays, in_ptr<float>(q.data), Q, widths.data(), static_cast<int64_t>(widths.size()), k,
                      min_val, utility);
  return py::make_tuple(ta::to_tensor(out.first), ta::to_tensor(out.second));
}

// ---------------------------------------------------------------------------
// Exact cosine top-k
// ---------------------------------------------------------------------------
// Scans keys [k_lo, k_hi) for the queries [q_lo, q_hi), each restricted to its
// range, folding into the running top-k arrays (row stride k).  Sets *bad when a
// scanned key holds NaN/Inf (its squared norm is then not finite; a finite one
// proves the row finite, and only a non-finite one, NaN/Inf or an overflow of
// huge finite values, has its row checked).
STREAMMEM_HOT void scan_keys(const float* __restrict Qm, const float* __restrict K, int64_t D, int64_t q_lo,
                             int64_t q_hi, int64_t k_lo, int64_t k_hi, const int64_t* __restrict ranges,
                             float* top_score, int64_t* top_id, int64_t k, int* bad) {
  for (int64_t qb = q_lo; qb < q_hi; qb += kQueryBlock) {
    const int64_t qe = std::min(q_hi, qb + kQueryBlock);
    int64_t lo = k_hi, hi = k_lo;
    for (int64_t q = qb; q < qe; ++q) {
      lo = std::min(lo, std::max(k_lo, ranges[2 * q]));
      hi = std::max(hi, std::min(k_hi, ranges[2 * q + 1]));
    }
    std::vector<TopK> tops;
    tops.reserve(qe - qb);
    for (int64_t q = qb; q < qe; ++q) tops.emplace_back(top_score + q * k, top_id + q * k, k);
    const bool single = qe - qb == 1;
    int found_bad = 0;
    std::vector<float> scaled;  // a key whose squared norm over/underflows, scaled (rare)
    for (int64_t i = lo; i < hi; ++i) {
      const float* key = K + i * D;
      float nsq, first = 0.f;
      // One query: its dot product and the key's squared norm in one pass (same bits as two dots).
      if (single)
        simd::dot_and_square(Qm + qb * D, key, D, &first, &nsq);
      else
        nsq = dot(key, key, D);
      const bool plain = plain_square(nsq);
      float norm;
      if (plain) {
        // Divide (not multiply by 1/norm) so that a key parallel to the query
        // scores exactly like its normalised copy in the reference.
        norm = std::sqrt(nsq);
      } else {
        if (!std::isfinite(nsq) && !chunk_finite(key, D)) {
          found_bad = 1;
          continue;
        }
        // Huge or tiny key: score its exactly scaled copy (an all-zero key scores 0).
        scaled.resize(static_cast<size_t>(D));
        norm = scaled_row(key, D, scaled.data());
        key = scaled.data();
      }
      for (int64_t q = qb; q < qe; ++q) {
        if (i < ranges[2 * q] || i >= ranges[2 * q + 1]) continue;
        const float s = norm > 0.f ? (single && plain ? first : dot(Qm + q * D, key, D)) / norm : 0.f;
        TopK& t = tops[q - qb];
        if (t.admits(s, i)) t.push(s, i);
      }
    }
    if (found_bad) {
#pragma omp atomic write
      *bad = 1;
    }
  }
}

// 0 <= start <= end <= N for every query (ValueError otherwise).
void check_ranges(const int64_t* rg, int64_t Q, int64_t N) {
  for (int64_t q = 0; q < Q; ++q)
    require(rg[2 * q] >= 0 && rg[2 * q] <= rg[2 * q + 1] && rg[2 * q + 1] <= N,
            "ranges must satisfy 0 <= start <= end <= N=" + std::to_string(N) + " for every query");
}

// A copy of float rows at a 64-byte aligned address.
class AlignedRows {
 public:
  explicit AlignedRows(const std::vector<float>& rows) : storage_(rows.size() + kPad) {
    const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(storage_.data());
    start_ = storage_.data() + ((64 - at % 64) % 64) / sizeof(float);
    std::copy(rows.begin(), rows.end(), start_);
  }
  const float* data() const { return start_; }

 private:
  static constexpr size_t kPad = 64 / sizeof(float);
  std::vector<float> storage_;
  float* start_;
};

// The exact top-k of Q raw queries against the raw keys (N, D), into ids / scores (Q, k) (filled
// here), each query restricted to its range (ranges (Q, 2), or nullptr for all keys).  Raises
// ValueError on NaN/Inf in the queries or keys and on bad ranges.
void cosine_topk_into(const float* queries, int64_t Q, const float* K, int64_t N, int64_t D, int64_t k,
                      const int64_t* ranges, int64_t* I, float* S) {
  require(Q >= 1 && N >= 1 && D >= 1, "cosine_topk: bad sizes");
  require(k >= 1, "cosine_topk: k must be >= 1");
  const std::vector<float> checked = unit_queries(queries, Q, D, "queries");
  // The scan reads every query row once per key, 8 floats at a time: from a 64-byte aligned copy
  // no read straddles two cache lines (malloc's 16-byte alignment made half of them do, and the
  // address, hence the cost, changed from call to call: up to 8 ns per key of D = 384).
  const AlignedRows unit(checked);
  std::vector<int64_t> whole;
  const int64_t* rg = ranges;
  if (ranges == nullptr) {  // every query scans every key: the scan proves every key finite
    whole.resize(2 * Q);
    for (int64_t q = 0; q < Q; ++q) {
      whole[2 * q] = 0;
      whole[2 * q + 1] = N;
    }
    rg = whole.data();
  } else {  // keys outside every range are not scanned, but the contract covers all keys
    check_ranges(rg, Q, N);
    bool ok;
    {
      py::gil_scoped_release nogil;
      ok = finite_values(K, N * D);
    }
    require(ok, "keys must be finite, found NaN or Inf");
  }
  std::fill(I, I + Q * k, int64_t(-1));
  std::fill(S, S + Q * k, kNegInf);
  const float* Qm = unit.data();
  const int threads = max_threads();
  int bad = 0;
  if (Q * N * D < (int64_t(1) << 20)) {
    // Up to about 100 us of work (one query against 2,700 keys of D = 384): one thread, and the
    // GIL kept, since handing it back and taking it again costs about 1 us, 3% of a scan of 1,000
    // keys (Python's switch interval, 5 ms, is far longer than this).
    for (int64_t b = 0; b < Q; b += kQueryBlock)
      scan_keys(Qm, K, D, b, std::min(Q, b + kQueryBlock), 0, N, rg, S, I, k, &bad);
  } else {
    py::gil_scoped_release nogil;
    if (Q >= 2 * int64_t(threads) * kQueryBlock || threads == 1) {
      // Enough query blocks to keep every thread busy.
      const int64_t blocks = (Q + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t b = 0; b < blocks; ++b)
        scan_keys(Qm, K, D, b * kQueryBlock, std::min(Q, (b + 1) * kQueryBlock), 0, N, rg, S, I, k, &bad);
    } else {
      // Few queries: split the keys across threads, then merge the partial top-k.
      std::vector<float> part_s(size_t(threads) * Q * k, kNegInf);
      std::vector<int64_t> part_i(size_t(threads) * Q * k, -1);
#pragma omp parallel num_threads(threads)
      {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        const int64_t lo = N * t / nt, hi = N * (t + 1) / nt;
        scan_keys(Qm, K, D, 0, Q, lo, hi, rg, part_s.data() + size_t(t) * Q * k, part_i.data() + size_t(t) * Q * k,
                  k, &bad);
      }
      for (int64_t q = 0; q < Q; ++q) {
        TopK top(S + q * k, I + q * k, k);
        for (int t = 0; t < threads; ++t)
          for (int64_t j = 0; j < k; ++j) {
            const size_t at = (size_t(t) * Q + q) * k + j;
            if (part_i[at] < 0) break;
            top.push(part_s[at], part_i[at]);
          }
      }
    }
  }
  require(!bad, "keys must be finite, found NaN or Inf");
}

py::tuple cosine_topk(std::uintptr_t queries_ptr, int64_t Q, std::uintptr_t keys_ptr, int64_t N, int64_t D,
                      int64_t k, std::uintptr_t ranges_ptr) {
  py::array_t<int64_t> ids({Q, k});
  py::array_t<float> scores({Q, k});
  cosine_topk_into(in_ptr<float>(queries_ptr), Q, in_ptr<float>(keys_ptr), N, D, k,
                   ranges_ptr == 0 ? nullptr : in_ptr<int64_t>(ranges_ptr), out_ptr(ids), out_ptr(scores));
  return py::make_tuple(ids, scores);
}

// The public function's fast path (topk.cosine_topk): queries (Q, D) and keys (N, D) plain
// float32 CPU tensors (tensor_args.h) with 1 <= Q < max_queries, k an int in [1, max_k], read and
// checked here rather than in Python bytecode.  Returns (ids, scores) as torch tensors, or None
// when the input is not this case (the general path then converts, validates and dispatches).
py::object cosine_topk_tensors(py::handle queries, py::handle keys, py::handle k_obj, int64_t max_queries,
                               int64_t max_k) {
  namespace ta = tensor_args;
  ta::Plain<2> q, kv;
  int64_t k;
  if (!ta::topk_args(queries, keys, k_obj, max_queries, max_k, &q, &kv, &k)) return py::none();
  const int64_t Q = q.size[0], N = kv.size[0], D = kv.size[1];
  py::array_t<int64_t> ids({Q, k});
  py::array_t<float> scores({Q, k});
  cosine_topk_into(in_ptr<float>(q.data), Q, in_ptr<float>(kv.data), N, D, k, nullptr, out_ptr(ids),
                   out_ptr(scores));
  return py::make_tuple(ta::to_tensor(ids), ta::to_tensor(scores));
}

// cosine_topk_into behind a C signature for the other CPU modules (graph.cpp's fused retrieval
// reaches it through topk_into_address(), so the scan exists once): returns nullptr, or the
// ValueError message (valid until this thread's next call).
const char* topk_into_c(const float* queries, int64_t Q, const float* keys, int64_t N, int64_t D, int64_t k,
                        int64_t* ids, float* scores) noexcept {
  thread_local std::string error;
  try {
    cosine_topk_into(queries, Q, keys, N, D, k, nullptr, ids, scores);
    return nullptr;
  } catch (const std::exception& e) {
    error = e.what();
    return error.c_str();
  }
}

// The checked unit rows of the queries (see unit_queries), for the BLAS path of topk.py.
py::array_t<float> unit_rows(carray<float> queries) {
  require(queries.ndim() == 2, "unit_rows: queries must be (Q, D)");
  const int64_t Q = queries.shape(0), D = queries.shape(1);
  const std::vector<float> unit = unit_queries(queries.data(), Q, D, "queries");
  py::array_t<float> out({Q, D});
  std::copy(unit.begin(), unit.end(), out_ptr(out));
  return out;
}

// Does any of row[0..n) * inv[0..n) reach thr?  A vectorised pre-filter: after the first
// few hundred keys almost no score enters a query's top-k, so most 16-wide chunks
// are rejected with one SIMD pass and no per-element branch.
STREAMMEM_HOT bool any_at_least(const float* __restrict row, const float* __restrict inv, int64_t n, float thr) {
  int hit = 0;
#pragma omp simd reduction(| : hit)
  for (int64_t i = 0; i < n; ++i) hit |= row[i] * inv[i] >= thr;
  return hit != 0;
}

// sqrt(dot(key, key)) per key: the norm the fused scan divides by, computed once per call
// of the BLAS path (one parallel pass) for topk_merge.
py::array_t<float> row_norms(carray<float> keys) {
  require(keys.ndim() == 2, "row_norms: keys must be (N, D)");
  const int64_t N = keys.shape(0), D = keys.shape(1);
  py::array_t<float> out(N);
  float* o = out_ptr(out);
  const float* K = keys.data();
  py::gil_scoped_release nogil;
#pragma omp parallel for schedule(static) if (N * D >= (int64_t(1) << 20))
  for (int64_t j = 0; j < N; ++j) o[j] = std::sqrt(dot(K + j * D, K + j * D, D));
  return out;
}

// Folds the GEMM score block dots = queries . keys^T (keys = keys[offset : offset + B], norm
// their row_norms) into the running top-k.  The GEMM's dot products only filter: a BLAS sums
// each one in an order that depends on where the key falls in its tiles, so two identical
// keys can differ by an ulp there, which would break the tie rule.  Every key the filter
// admits is scored again exactly as the fused scan scores it (dot(q, key) / norm), so both
// paths rank by the same numbers and identical keys tie.
void topk_merge(carray<float> dots, carray<float> norms, carray<float> queries, carray<float> keys, int64_t offset,
                carray<int64_t> ranges, py::array ids, py::array scores) {
  require(dots.ndim() == 2 && ids.ndim() == 2 && scores.ndim() == 2 && queries.ndim() == 2 && keys.ndim() == 2,
          "topk_merge: bad ranks");
  const int64_t Q = dots.shape(0), B = dots.shape(1), k = ids.shape(1), D = keys.shape(1);
  require(ids.shape(0) == Q && scores.shape(0) == Q && scores.shape(1) == k, "topk_merge: bad output shapes");
  require(keys.shape(0) == B && norms.shape(0) == B && queries.shape(0) == Q && queries.shape(1) == D &&
              ranges.shape(0) == Q,
          "topk_merge: bad shapes");
  const float* Dm = dots.data();
  const float* norm = norms.data();
  const float* Qm = queries.data();
  const float* K = keys.data();
  const int64_t* rg = ranges.data();
  int64_t* I = inplace_ptr<int64_t>(ids, "ids");
  float* S = inplace_ptr<float>(scores, "scores");
  py::gil_scoped_release nogil;
  // Keys whose squared norm over/underflows (norm outside [2^-50, inf), see plain_square) are
  // not filtered (inv 0) but scored from their scaled copies after the block.
  constexpr float kLowNorm = 8.881784197001252e-16f;  // 2^-50 = sqrt(kLowSquare)
  std::vector<float> inv(B);
  std::vector<int64_t> odd;
  for (int64_t j = 0; j < B; ++j) {
    const bool plain = norm[j] >= kLowNorm && norm[j] < kInf;
    inv[j] = plain ? 1.f / norm[j] : 0.f;
    if (!plain) odd.push_back(j);
  }
  // |GEMM dot - exact dot| <= D u |q| |key| for any summation order (u = 2^-24), and the
  // same holds for the exact scan's own dot: the filter's score dot * (1 / |key|) is within
  // 2 (D + 8) u of the rescored one (|q| <= 1, a few more ulps for the norm and the
  // reciprocal), so lowering the threshold by more than that never rejects a key the
  // exact score would admit.  Ties at the threshold are resolved by push.
  const float margin = 2.5f * static_cast<float>(D + 8) * 5.9604645e-8f;
  const float* iv = inv.data();
  constexpr int64_t kChunk = 16;
#pragma omp parallel for schedule(static) if (Q * B >= 65536)
  for (int64_t q = 0; q < Q; ++q) {
    const int64_t lo = std::max<int64_t>(0, rg[2 * q] - offset), hi = std::min<int64_t>(B, rg[2 * q + 1] - offset);
    TopK top(S + q * k, I + q * k, k);
    const float* row = Dm + q * B;
    const float* qv = Qm + q * D;
    for (int64_t j = lo; j < hi; j += kChunk) {
      const int64_t end = std::min(hi, j + kChunk);
      // -inf while the top-k is not full.
      const float thr = top.count < k ? kNegInf : top.score[k - 1] - margin;
      const bool full = top.count == k;
      if (full && !any_at_least(row + j, iv + j, end - j, thr)) continue;
      for (int64_t t = j; t < end; ++t) {
        if (iv[t] == 0.f || (full && !(row[t] * iv[t] >= thr))) continue;
        const float s = dot(qv, K + t * D, D) / norm[t];
        if (top.admits(s, offset + t)) top.push(s, offset + t);
      }
    }
    if (!odd.empty()) {
      std::vector<float> scaled(static_cast<size_t>(D));
      for (const int64_t t : odd) {
        if (t < lo || t >= hi) continue;
        const float n = scaled_row(K + t * D, D, scaled.data());
        const float s = n > 0.f ? dot(qv, scaled.data(), D) / n : 0.f;
        if (top.admits(s, offset + t)) top.push(s, offset + t);
      }
    }
  }
}

bool all_finite(carray<float> values) {
  const float* x = values.data();
  const int64_t n = values.size();
  py::gil_scoped_release nogil;
  return finite_values(x, n);
}

}  // namespace
}  // namespace streammem

namespace py = pybind11;

PYBIND11_MODULE(_cpu_tree, m) {
  m.doc() = "Cosine memory tree search and exact cosine top-k (CPU, OpenMP over queries)";
  m.def("greedy", &streammem::greedy, py::arg("emb"), py::arg("dim"), py::arg("child_ptr"), py::arg("child_idx"),
        py::arg("roots"), py::arg("num_roots"), py::arg("queries"), py::arg("num_queries"), py::arg("height"),
        py::arg("from_every_root"));
  m.def("beam", &streammem::beam, py::arg("emb"), py::arg("dim"), py::arg("child_ptr"), py::arg("child_idx"),
        py::arg("roots"), py::arg("num_roots"), py::arg("level"), py::arg("utility"), py::arg("queries"),
        py::arg("num_queries"), py::arg("widths"), py::arg("k"), py::arg("min_score"), py::arg("use_utility"));
  py::class_<streammem::TreeView>(m, "TreeView",
                                  "A CosineTree snapshot's pointers, sizes and tensors (kept alive) for search_tensors")
      .def(py::init([](std::uintptr_t emb, int64_t dim, std::uintptr_t child_ptr, std::uintptr_t child_idx,
                       std::uintptr_t roots, int64_t num_roots, std::uintptr_t level, std::uintptr_t utility,
                       int64_t height, int64_t num_live, int64_t max_results, int64_t max_width, py::object keep,
                       std::uintptr_t scan, double scan_norm, double scan_err) {
             using streammem::in_ptr;
             return streammem::TreeView{{in_ptr<float>(emb), dim, in_ptr<int64_t>(child_ptr),
                                         in_ptr<int64_t>(child_idx), in_ptr<int64_t>(roots), num_roots,
                                         in_ptr<int64_t>(level), in_ptr<float>(utility), in_ptr<uint16_t>(scan),
                                         scan_norm, scan_err},
                                        height, num_live, max_results, max_width, std::move(keep)};
           }),
           py::arg("emb"), py::arg("dim"), py::arg("child_ptr"), py::arg("child_idx"), py::arg("roots"),
           py::arg("num_roots"), py::arg("level"), py::arg("utility"), py::arg("height"), py::arg("num_live"),
           py::arg("max_results"), py::arg("max_width"), py::arg("keep"), py::kw_only(), py::arg("scan") = 0,
           py::arg("scan_norm") = 0.0, py::arg("scan_err") = 0.0);
  m.def("half_dots", &streammem::half_dots, py::arg("query"), py::arg("rows"),
        "float32 dot products of query (D,) with the float16 rows (n, D) (uint16 bits) of a scan copy, by the "
        "beam search's kernel (ValueError where the CPU has none)");
  m.def("half_scan_kernel", [] { return streammem::dot_half_kernel() != nullptr; },
        "Whether this CPU has the kernel (F16C, AVX2, FMA) with which the beam search reads a scan copy; "
        "without it the copy is kept but not read (same results, float32 speed)");
  m.def("half_copy", &streammem::half_copy, py::arg("src"), py::arg("dst"), py::arg("rows"), py::arg("dim"),
        "Write the float16 scan copy of float32 rows src (rows, dim) into dst (rows, dim) (round to nearest even, "
        "|x| < 2^-14 stored as 0); returns upper bounds on the largest row norm and on the largest L2 distance of "
        "a row to its copy");
  m.def("search_tensors", &streammem::search_tensors, py::arg("view"), py::arg("queries"), py::arg("beam"),
        py::arg("k"), py::arg("min_score"), py::arg("use_utility"), py::arg("from_every_root"));
  m.def("cosine_topk", &streammem::cosine_topk, py::arg("queries"), py::arg("num_queries"), py::arg("keys"),
        py::arg("num_keys"), py::arg("dim"), py::arg("k"), py::arg("ranges"));
  m.def("cosine_topk_tensors", &streammem::cosine_topk_tensors, py::arg("queries"), py::arg("keys"), py::arg("k"),
        py::arg("max_queries"), py::arg("max_k"));
  m.def("topk_into_address", [] { return reinterpret_cast<std::uintptr_t>(&streammem::topk_into_c); },
        "Address of cosine_topk_into as `const char* (const float* queries, int64_t Q, const float* keys, "
        "int64_t N, int64_t D, int64_t k, int64_t* ids, float* scores) noexcept` (nullptr or the ValueError "
        "message), for the other CPU modules");
  m.def("unit_rows", &streammem::unit_rows, py::arg("queries"));
  m.def("all_finite", &streammem::all_finite, py::arg("values"));
  m.def("row_norms", &streammem::row_norms, py::arg("keys"));
  m.def("topk_merge", &streammem::topk_merge, py::arg("dots"), py::arg("norms"), py::arg("queries"),
        py::arg("keys"), py::arg("offset"), py::arg("ranges"), py::arg("ids"), py::arg("scores"));
}
