// The cosine scoring rules in C++ and the exact top-k scan built on them, shared by the modules that
// score embeddings: _cpu_tree (cosine_topk, tree_search, CosineIndex's prepared scan) and _cpu_graph
// (graph_retrieve's seeds).
//
// The rules are those of streammem_kernels/tree/reference.py (the spec):
// * a score is dot(q / |q|, v / |v|) in float32; rows whose squared norm over- or underflows float32
//   are scaled by a power of two first (exact), as the reference's unit_rows scales every row, so
//   both routes agree on ordinary rows; an all-zero row scores 0 against everything;
// * a dot product is simd::dot (four 8-lane accumulators, a fixed lane layout), so a row scores the
//   same wherever it lies and identical rows tie exactly;
// * a ranking orders by (score desc, id asc).
//
// Everything here has internal linkage: each translation unit that includes the header compiles its
// own copy (the hot loops are cloned per ISA, STREAMMEM_HOT), and no function address crosses a
// module boundary.  Value checks are reported as statuses (ScanStatus), never thrown: each module
// maps them to its caller's declared checks (runtime/native.py, NativeChecks).
#pragma once

#include "common.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace streammem {
namespace cosine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kInf = std::numeric_limits<float>::infinity();
// Queries sharing one pass over a key row (the row stays in L1 for all of them).
constexpr int64_t kQueryBlock = 8;
// Scans below kScanGilWork multiply-adds keep the GIL and one thread; larger ones give each thread
// at least kScanWorkPerThread (about 0.4 ms on one core: threads_for, common.h).
constexpr int64_t kScanGilWork = int64_t(1) << 20;
constexpr int64_t kScanWorkPerThread = int64_t(1) << 22;

STREAMMEM_HOT inline float dot(const float* __restrict a, const float* __restrict b, int64_t d) {
  return simd::dot(a, b, d);
}

// Validation pass without a boolean temporary: x - x is 0 for finite x and NaN for NaN/Inf, so
// one sum per chunk detects both.
STREAMMEM_HOT inline bool chunk_finite(const float* __restrict x, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i] - x[i];
  return acc == 0.f;
}

inline bool finite_values(const float* x, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) num_threads(threads_for(n, int64_t(1) << 22))
  for (int64_t c = 0; c < chunks; ++c)
    if (!chunk_finite(x + c * kChunk, std::min(kChunk, n - c * kChunk))) bad |= 1;
  return bad == 0;
}

// Squared norms in [kLowSquare, inf) are computed without loss by the plain dot product; rows
// outside (a norm above 1.8e19 overflows the square, one below ~1e-19 underflows it) are scaled
// by a power of two first (scaled_row).  Subnormal squares in a row whose squared norm is >= 2^-100
// weigh at most D * 2^-49 of it.
constexpr float kLowSquare = 7.888609052210118e-31f;  // 2^-100
constexpr int kScaleExponent = 126;                   // reference.POW2_SCALE_EXPONENT

inline bool plain_square(float sq) { return sq >= kLowSquare && sq < kInf; }

// out = row * 2^-e with 2^e the power of two bringing max |row| into [0.5, 1) (exponent clamped
// to +-126); returns the norm of out (0 for an all-zero row, whose out is zero).
inline float scaled_row(const float* row, int64_t D, float* out) {
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

// Rows q (Q, D) scaled to unit L2 norm in float32 into out (Q, D), as the reference's unit_rows
// does: q / max(|q|, the smallest normal float), so a zero row stays zero; rows whose squared norm
// over- or underflows go through scaled_row.  False when a row holds NaN/Inf (a finite |q|^2 proves
// the row finite; otherwise the row is checked, since squares of large finite values overflow too).
inline bool unit_rows_into(const float* q, int64_t Q, int64_t D, float* out) {
  constexpr float kTiny = std::numeric_limits<float>::min();
  for (int64_t r = 0; r < Q; ++r) {
    const float* row = q + r * D;
    float* o = out + r * D;
    const float sq = dot(row, row, D);
    if (!std::isfinite(sq) && !chunk_finite(row, D)) return false;
    if (plain_square(sq)) {
      const float norm = std::sqrt(sq);
      for (int64_t d = 0; d < D; ++d) o[d] = row[d] / norm;
    } else {
      const float norm = std::max(scaled_row(row, D, o), kTiny);
      for (int64_t d = 0; d < D; ++d) o[d] /= norm;
    }
  }
  return true;
}

// Does any of row[0..n) * inv[0..n) reach thr?  A vectorised pre-filter of a GEMM score block: after
// the first few hundred keys almost no score enters a query's top-k, so most 16-wide chunks are
// rejected with one SIMD pass and no per-element branch.
STREAMMEM_HOT inline bool any_at_least(const float* __restrict row, const float* __restrict inv, int64_t n,
                                       float thr) {
  int hit = 0;
#pragma omp simd reduction(| : hit)
  for (int64_t i = 0; i < n; ++i) hit |= row[i] * inv[i] >= thr;
  return hit != 0;
}

inline bool better(float s1, int64_t i1, float s2, int64_t i2) { return s1 > s2 || (s1 == s2 && i1 < i2); }

// Sorted top-k of one query living in caller memory (ids -1 / scores -inf = empty).  k is small
// (<= a few hundred) and, after the first few hundred keys, almost every candidate fails the one
// comparison with the current k-th.
struct TopK {
  float* score;
  int64_t* id;
  int64_t k;
  int64_t count;

  TopK() = default;
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

// Scans keys [k_lo, k_hi) for the unit queries [q_lo, q_hi), each restricted to its range, folding
// into the running top-k arrays (row stride k).  Sets *bad when a scanned key holds NaN/Inf (its
// squared norm is then not finite; a finite one proves the row finite, and only a non-finite one,
// NaN/Inf or an overflow of huge finite values, has its row checked).
STREAMMEM_HOT inline void scan_keys(const float* __restrict Qm, const float* __restrict K, int64_t D, int64_t q_lo,
                                    int64_t q_hi, int64_t k_lo, int64_t k_hi, const int64_t* __restrict ranges,
                                    float* top_score, int64_t* top_id, int64_t k, int* bad) {
  for (int64_t qb = q_lo; qb < q_hi; qb += kQueryBlock) {
    const int64_t qe = std::min(q_hi, qb + kQueryBlock);
    int64_t lo = k_hi, hi = k_lo;
    for (int64_t q = qb; q < qe; ++q) {
      lo = std::min(lo, std::max(k_lo, ranges[2 * q]));
      hi = std::max(hi, std::min(k_hi, ranges[2 * q + 1]));
    }
    TopK tops[kQueryBlock];
    for (int64_t q = qb; q < qe; ++q) tops[q - qb] = TopK(top_score + q * k, top_id + q * k, k);
    const bool single = qe - qb == 1;
    int found_bad = 0;
    std::vector<float> scaled;  // a key whose squared norm over/underflows, scaled (rare)
    for (int64_t i = lo; i < hi; ++i) {
      const float* key = K + i * D;
      float nsq, first = 0.f;
      // The one query whose range holds the key, when exactly one does (a single query, or a
      // VideoAgent round's disjoint segments): its dot product and the key's squared norm in one
      // pass (same bits as two dots).
      int64_t owner = single ? qb : -1;
      for (int64_t q = qb; q < qe && !single; ++q) {
        if (i < ranges[2 * q] || i >= ranges[2 * q + 1]) continue;
        if (owner != -1) {
          owner = -1;
          break;
        }
        owner = q;
      }
      if (owner >= 0)
        simd::dot_and_square(Qm + owner * D, key, D, &first, &nsq);
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
        const float s = norm > 0.f ? (q == owner && plain ? first : dot(Qm + q * D, key, D)) / norm : 0.f;
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

// A copy of float rows at a 64-byte aligned address: the scan reads every query row once per key,
// 8 floats at a time, and from an aligned copy no read straddles two cache lines.
// The rows of a few queries live in the object itself (no allocation on the single-item path).
class AlignedRows {
 public:
  explicit AlignedRows(size_t count) {
    if (count > kInline) heap_.resize(count + kPad);
    float* base = count > kInline ? heap_.data() : inline_;
    const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(base);
    start_ = base + ((64 - at % 64) % 64) / sizeof(float);
  }
  AlignedRows(const AlignedRows&) = delete;
  AlignedRows& operator=(const AlignedRows&) = delete;
  float* data() { return start_; }
  const float* data() const { return start_; }

 private:
  static constexpr size_t kPad = 64 / sizeof(float);
  static constexpr size_t kInline = 1024;  // one query of D <= 1024
  float inline_[kInline + kPad];
  std::vector<float> heap_;
  float* start_;
};

// The value checks of the scan, in the order of the statuses its callers declare.
enum ScanStatus : int { kScanOk = 0, kQueriesNotFinite = 1, kKeysNotFinite = 2, kRangesOutside = 3 };

// The exact top-k of Q raw queries against the raw keys K (N, D), into I / S (Q, k) (filled here),
// each query restricted to its range (ranges (Q, 2), or nullptr for all keys; with ranges, every key
// is still checked finite, as the contract covers all keys).  Q, N, D, k >= 1.  Small scans keep the
// GIL and one thread; larger ones release it and split the queries, or for few queries the keys,
// across threads.  Call with the GIL held.
inline int cosine_topk_into(const float* queries, int64_t Q, const float* K, int64_t N, int64_t D, int64_t k,
                            const int64_t* ranges, int64_t* I, float* S) {
  AlignedRows unit(static_cast<size_t>(Q * D));
  if (!unit_rows_into(queries, Q, D, unit.data())) return kQueriesNotFinite;
  int64_t whole_inline[2 * kQueryBlock];
  std::vector<int64_t> whole_heap;
  const int64_t* rg = ranges;
  if (ranges == nullptr) {  // every query scans every key: the scan proves every key finite
    if (Q > kQueryBlock) whole_heap.resize(2 * Q);
    int64_t* whole = Q > kQueryBlock ? whole_heap.data() : whole_inline;
    for (int64_t q = 0; q < Q; ++q) {
      whole[2 * q] = 0;
      whole[2 * q + 1] = N;
    }
    rg = whole;
  } else {  // keys outside every range are not scanned, but the contract covers all keys
    for (int64_t q = 0; q < Q; ++q)
      if (!(rg[2 * q] >= 0 && rg[2 * q] <= rg[2 * q + 1] && rg[2 * q + 1] <= N)) return kRangesOutside;
    // With one query block the scan computes the squared norm of every key between the lowest
    // start and the highest end (a finite one proves its row finite), so only the keys outside
    // need a pass of their own.
    int64_t lo = 0, hi = 0;
    if (Q <= kQueryBlock) {
      lo = N;
      for (int64_t q = 0; q < Q; ++q) {
        lo = std::min(lo, rg[2 * q]);
        hi = std::max(hi, rg[2 * q + 1]);
      }
      if (lo >= hi) lo = hi = 0;
    }
    if (lo > 0 || hi < N) {
      bool ok;
      {
        py::gil_scoped_release nogil;
        ok = finite_values(K, lo * D) && finite_values(K + hi * D, (N - hi) * D);
      }
      if (!ok) return kKeysNotFinite;
    }
  }
  std::fill(I, I + Q * k, int64_t(-1));
  std::fill(S, S + Q * k, kNegInf);
  const float* Qm = unit.data();
  // The work is the (query, key) pairs in range, not Q x N: a VideoAgent round of 20 segments
  // over 3,600 frames scores 3,600 pairs, not 72,000.
  int64_t pairs = 0;
  for (int64_t q = 0; q < Q; ++q) pairs += rg[2 * q + 1] - rg[2 * q];
  const int64_t work = pairs * D;
  int bad = 0;
  if (work < kScanGilWork) {
    // Up to about 100 us of work (one query against 2,700 keys of D = 384): one thread, and the
    // GIL kept, since handing it back and taking it again costs about 1 us, 3% of a scan of 1,000
    // keys (Python's switch interval, 5 ms, is far longer than this).
    for (int64_t b = 0; b < Q; b += kQueryBlock)
      scan_keys(Qm, K, D, b, std::min(Q, b + kQueryBlock), 0, N, rg, S, I, k, &bad);
    return bad ? kKeysNotFinite : kScanOk;
  }
  py::gil_scoped_release nogil;
  const int threads = threads_for(work, kScanWorkPerThread);
  const int64_t blocks = (Q + kQueryBlock - 1) / kQueryBlock;
  if (threads == 1 || blocks >= 2 * int64_t(threads)) {
    // Enough query blocks to keep every thread busy; dynamic, so a thread the scheduler leaves
    // waiting delays the region by one block, not by its share.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t b = 0; b < blocks; ++b)
      scan_keys(Qm, K, D, b * kQueryBlock, std::min(Q, (b + 1) * kQueryBlock), 0, N, rg, S, I, k, &bad);
    return bad ? kKeysNotFinite : kScanOk;
  }
  // Few queries: every thread folds key chunks, taken dynamically, into its own partial top-k,
  // then the partials merge.  Chunks of about kScanWorkPerThread / 4 work each: a descheduled
  // thread holds the others at the barrier for one chunk, not for its half of the keys.
  const int64_t chunk = std::max<int64_t>(64, kScanWorkPerThread / 4 / std::max<int64_t>(1, Q * D));
  const int64_t chunks = (N + chunk - 1) / chunk;
  std::vector<float> part_s(size_t(threads) * Q * k, kNegInf);
  std::vector<int64_t> part_i(size_t(threads) * Q * k, -1);
#pragma omp parallel num_threads(threads)
  {
    int t = 0;
#ifdef _OPENMP
    t = omp_get_thread_num();
#endif
    float* my_s = part_s.data() + size_t(t) * Q * k;
    int64_t* my_i = part_i.data() + size_t(t) * Q * k;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; ++c)
      scan_keys(Qm, K, D, 0, Q, c * chunk, std::min(N, (c + 1) * chunk), rg, my_s, my_i, k, &bad);
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
  return bad ? kKeysNotFinite : kScanOk;
}


// ---- Prepared keys: the scan of a CosineIndex ------------------------------------------------------------
// An index's keys were normalised and checked finite once, when they were added, and it keeps each key's
// norm as the scan above computes it (sqrt(dot(key, key)): row_norms of topk.cpp): a prepared scan scores
// dot(q, key) / norm exactly as scan_keys scores the same rows (the same dot(), the same division), so
// its ranking is cosine_topk's on those rows, ties included, without the squared norms and the finite
// check.  A zero row (norm 0) scores 0, as there.  Rows whose alive flag is false (removed, not yet
// compacted away) are skipped.
//
// Optionally the scan reads a half-precision copy of the keys first (HalfPrefilter: half_scan.cpp's
// kernel and error bound, as CosineTree's beam search does): once a query's top-k is full, a key whose
// copy scores fl(a + delta) < the k-th score cannot enter (its exact score c <= a + delta, so c <= fl(a +
// delta) by the monotonicity of rounding), and only the other keys are read in float32 and scored
// exactly.  The results are the float32 scan's, bit for bit.
//
// Or an int8 copy (int8_scan.cpp): per row int8 codes and a scale, per query int16-widened codes and a
// scale; the copy's score fl(fl(float(codes . codes) * query scale) * row scale) and its bound take the
// place of the float16 ones, with the same rule.
struct HalfPrefilter {
  const uint16_t* rows = nullptr;                            // (N, D) float16 bits, nullptr: no copy
  float (*dot)(const float*, const uint16_t*, int64_t) = nullptr;
  const int8_t* codes = nullptr;                             // (N, D) int8 codes, nullptr: no int8 copy
  const float* code_scale = nullptr;                         // (N,) their scales
  int32_t (*int8_dot)(const int16_t*, const int8_t*, int64_t) = nullptr;
  int16_t* query_codes = nullptr;                            // (Q, D), written with delta
  float* query_scale = nullptr;                              // (Q,), written with delta
  const float* delta = nullptr;                              // per query: |exact score - copy's score| bound
  bool any() const { return rows != nullptr || codes != nullptr; }
};

STREAMMEM_HOT inline void scan_prepared(const float* __restrict Qm, const float* __restrict K,
                                        const float* __restrict norms, const bool* __restrict alive,
                                        const HalfPrefilter& half, int64_t D, int64_t q_lo, int64_t q_hi, int64_t k_lo,
                                        int64_t k_hi, const int64_t* __restrict ranges, float* top_score,
                                        int64_t* top_id, int64_t k) {
  for (int64_t qb = q_lo; qb < q_hi; qb += kQueryBlock) {
    const int64_t qe = std::min(q_hi, qb + kQueryBlock);
    int64_t lo = k_hi, hi = k_lo;
    for (int64_t q = qb; q < qe; ++q) {
      lo = std::min(lo, std::max(k_lo, ranges[2 * q]));
      hi = std::max(hi, std::min(k_hi, ranges[2 * q + 1]));
    }
    TopK tops[kQueryBlock];
    for (int64_t q = qb; q < qe; ++q) tops[q - qb] = TopK(top_score + q * k, top_id + q * k, k);
    for (int64_t i = lo; i < hi; ++i) {
      if (alive != nullptr && !alive[i]) continue;
      const float* key = K + i * D;
      const float norm = norms[i];
      for (int64_t q = qb; q < qe; ++q) {
        if (i < ranges[2 * q] || i >= ranges[2 * q + 1]) continue;
        TopK& t = tops[q - qb];
        if (t.count == k) {
          if (half.rows != nullptr) {
            const float approx = half.dot(Qm + q * D, half.rows + i * D, D);
            if (approx + half.delta[q] < t.score[k - 1]) continue;
          } else if (half.codes != nullptr) {
            const float approx = static_cast<float>(half.int8_dot(half.query_codes + q * D, half.codes + i * D, D)) *
                                 half.query_scale[q] * half.code_scale[i];
            if (approx + half.delta[q] < t.score[k - 1]) continue;
          }
        }
        const float s = norm > 0.f ? dot(Qm + q * D, key, D) / norm : 0.f;
        if (t.admits(s, i)) t.push(s, i);
      }
    }
  }
}

// The value checks of the prepared scan, in the order of the statuses its callers declare.
enum PreparedStatus : int { kPreparedOk = 0, kPreparedQueriesNotFinite = 1, kPreparedRangesOutside = 2 };

// The exact top-k of Q raw queries against the prepared keys K (N, D) with their norms, into I / S (Q, k)
// (filled here), each query restricted to its range (ranges (Q, 2), or nullptr for all keys), removed rows
// skipped (alive, or nullptr for none).  half.any(): the prefilter of a scan copy, whose delta this
// function fills per query from half_delta(unit query, its index) (which, for the int8 copy, also writes
// that query's codes and scale).  Threads as cosine_topk_into.  Call with
// the GIL held.
template <typename HalfDelta>
inline int prepared_topk_into(const float* queries, int64_t Q, const float* K, const float* norms, const bool* alive,
                              int64_t N, int64_t D, int64_t k, const int64_t* ranges, int64_t* I, float* S,
                              HalfPrefilter half, HalfDelta half_delta) {
  AlignedRows unit(static_cast<size_t>(Q * D));
  if (!unit_rows_into(queries, Q, D, unit.data())) return kPreparedQueriesNotFinite;
  int64_t whole_inline[2 * kQueryBlock];
  std::vector<int64_t> whole_heap;
  const int64_t* rg = ranges;
  if (ranges == nullptr) {
    if (Q > kQueryBlock) whole_heap.resize(2 * Q);
    int64_t* whole = Q > kQueryBlock ? whole_heap.data() : whole_inline;
    for (int64_t q = 0; q < Q; ++q) {
      whole[2 * q] = 0;
      whole[2 * q + 1] = N;
    }
    rg = whole;
  } else {
    for (int64_t q = 0; q < Q; ++q)
      if (!(rg[2 * q] >= 0 && rg[2 * q] <= rg[2 * q + 1] && rg[2 * q + 1] <= N)) return kPreparedRangesOutside;
  }
  const float* Qm = unit.data();
  std::vector<float> deltas;
  if (half.any()) {
    deltas.resize(static_cast<size_t>(Q));
    for (int64_t q = 0; q < Q; ++q) deltas[q] = half_delta(Qm + q * D, q);
    half.delta = deltas.data();
  }
  std::fill(I, I + Q * k, int64_t(-1));
  std::fill(S, S + Q * k, kNegInf);
  // As cosine_topk_into: the work is the pairs in range; small scans keep one thread and the GIL.
  int64_t pairs = 0;
  for (int64_t q = 0; q < Q; ++q) pairs += rg[2 * q + 1] - rg[2 * q];
  const int64_t work = pairs * D;
  if (work < kScanGilWork) {
    scan_prepared(Qm, K, norms, alive, half, D, 0, Q, 0, N, rg, S, I, k);
    return kPreparedOk;
  }
  py::gil_scoped_release nogil;
  const int threads = threads_for(work, kScanWorkPerThread);
  const int64_t blocks = (Q + kQueryBlock - 1) / kQueryBlock;
  if (threads == 1 || blocks >= 2 * int64_t(threads)) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t b = 0; b < blocks; ++b)
      scan_prepared(Qm, K, norms, alive, half, D, b * kQueryBlock, std::min(Q, (b + 1) * kQueryBlock), 0, N, rg, S, I,
                    k);
    return kPreparedOk;
  }
  const int64_t chunk = std::max<int64_t>(64, kScanWorkPerThread / 4 / std::max<int64_t>(1, Q * D));
  const int64_t chunks = (N + chunk - 1) / chunk;
  std::vector<float> part_s(size_t(threads) * Q * k, kNegInf);
  std::vector<int64_t> part_i(size_t(threads) * Q * k, -1);
#pragma omp parallel num_threads(threads)
  {
    int t = 0;
#ifdef _OPENMP
    t = omp_get_thread_num();
#endif
    float* my_s = part_s.data() + size_t(t) * Q * k;
    int64_t* my_i = part_i.data() + size_t(t) * Q * k;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; ++c)
      scan_prepared(Qm, K, norms, alive, half, D, 0, Q, c * chunk, std::min(N, (c + 1) * chunk), rg, my_s, my_i, k);
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
  return kPreparedOk;
}

}  // namespace
}  // namespace cosine
}  // namespace streammem
