// CosineIndex's scans, CPU kernels (the spec: streammem_kernels/tree/reference.py, index_topk_reference;
// the class: tree/index.py).  The keys are prepared: unit rows checked finite when added, with their
// norms as cosine_topk's scan computes them (row_norms of topk.cpp), so both scans rank alike.
//
//   index_topk(queries (Q,D) f32 raw, keys (N,D) f32 unit, norms (N) f32, alive (N) bool or None,
//              ranges (Q,2) i64 or None, ids (Q,k) i64, scores (Q,k) f32, scan (N,D) f16 or i8 or None,
//              scan_scale (N) f32 or None, scan_norm, scan_err, norm_slack) -> Status: the fused one-pass
//     scan of prepared keys (cosine_scan.h, prepared_topk_into), reading the scan copy first when given:
//     float16 rows (when this CPU has their kernel), or int8 codes with their row scales scan_scale
//     (int8_scan.cpp; D <= 2^16, any CPU).  Status 1: queries not finite, 2: a range outside
//     0 <= start <= end <= N.
//   index_prepare(src (n,D) f32, dst (n,D) f32, norms (n) f32, scale (n) f32) -> Status: what add() stores
//     of new keys, in one pass over each row: its unit row (cosine_scan.h's unit_rows_into, the rule the
//     scan applies to queries), that row's norm as the scan computes it, and the power of two the Triton
//     kernel scales it by (reference.pow2_row_scale).  Status 1: src holds NaN or Inf (dst then partly
//     written, nothing else).
//   index_merge(dots (Q,B) f32, norms (B) f32, queries (Q,D) f32 unit, keys (B,D) f32, offset,
//               ranges (Q,2) i64, alive (B) bool or None, ids (Q,k) i64 inout, scores (Q,k) f32 inout)
//     -> Status 0: topk_merge of topk.cpp for prepared keys (the BLAS path of large batches): the cached
//     norms, removed rows skipped, zero rows scored 0.
#include "tree.h"

#include "common.h"
#include "cosine_scan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace streammem {
namespace tree {
namespace {

using cosine::any_at_least;
using cosine::dot;
using cosine::kInf;
using cosine::kNegInf;
using cosine::TopK;

// The prefilter's bound for one unit query q: |c - a| <= delta, where c = fl(fl(q . e) / n) is the exact
// score of a row e of norm n and a = dot_half(q, h) the score of its copy h.
//   |fl(q . e) - a| <= scan_delta(q, ...)                                      (half_scan.cpp)
//   |c - fl(q . e)| <= |fl(q . e)| |1/n - 1| + ulp  <=  1.01 scan_norm slack + 2^-22,
// where slack = max |1/n - 1| over the non-zero rows (the caller's, in double, rounded up) and
// |fl(q . e)| <= |q| |e| (1 + D u) <= 1.01 scan_norm for a unit query.  A zero row scores 0 = its copy's.
float prefilter_delta(const float* q, int64_t D, double scan_norm, double scan_err, double norm_slack) {
  const float half = scan_delta(q, D, scan_norm, scan_err);
  const double total = static_cast<double>(half) + 1.01 * scan_norm * norm_slack + 0x1p-22;
  if (!std::isfinite(total) || total >= 4.0) return kInf;  // no useful bound: every key is scored exactly
  return bound_rounded_up(total);
}

}  // namespace

Status index_prepare(TensorView src, TensorView dst, TensorView norms, TensorView scale) {
  constexpr const char* entry = "index_prepare";
  expect_tensor(src, DType::kFloat32, 2, entry, "src");
  expect_tensor(dst, DType::kFloat32, 2, entry, "dst");
  expect_tensor(norms, DType::kFloat32, 1, entry, "norms");
  expect_tensor(scale, DType::kFloat32, 1, entry, "scale");
  const int64_t n = src.size(0), D = src.size(1);
  expect(dst.size(0) == n && dst.size(1) == D && norms.size(0) == n && scale.size(0) == n && D >= 1, entry,
         "dst (n, D), norms (n,) and scale (n,) must match src (n, D)");
  const float* in = src.ptr<float>();
  float* out = dst.ptr<float>();
  float* nrm = norms.ptr<float>();
  float* scl = scale.ptr<float>();
  int bad = 0;
  {
    py::gil_scoped_release nogil;
#pragma omp parallel for schedule(static) reduction(| : bad) num_threads(threads_for(n * D, int64_t(1) << 22))
    for (int64_t r = 0; r < n; ++r) {
      float* row = out + r * D;
      if (!cosine::unit_rows_into(in + r * D, 1, D, row)) {
        bad |= 1;
        continue;
      }
      nrm[r] = std::sqrt(dot(row, row, D));
      float top = 0.f;
      for (int64_t d = 0; d < D; ++d) top = std::max(top, std::fabs(row[d]));
      int e;
      std::frexp(top, &e);
      scl[r] = std::ldexp(1.0f, std::clamp(-e, -cosine::kScaleExponent, cosine::kScaleExponent));
    }
  }
  return bad ? 1 : kOk;
}

Status index_topk(TensorView queries, TensorView keys, TensorView norms, std::optional<TensorView> alive,
                  std::optional<TensorView> ranges, TensorView ids, TensorView scores, std::optional<TensorView> scan,
                  std::optional<TensorView> scan_scale, double scan_norm, double scan_err, double norm_slack) {
  constexpr const char* entry = "index_topk";
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  expect_tensor(keys, DType::kFloat32, 2, entry, "keys");
  expect_tensor(norms, DType::kFloat32, 1, entry, "norms");
  expect_tensor(ids, DType::kInt64, 2, entry, "ids");
  expect_tensor(scores, DType::kFloat32, 2, entry, "scores");
  const int64_t Q = queries.size(0), N = keys.size(0), D = keys.size(1), k = ids.size(1);
  expect(Q >= 1 && N >= 1 && D >= 1 && k >= 1 && queries.size(1) == D && norms.size(0) == N, entry,
         "queries (Q, D), keys (N, D) and norms (N,) must be non-empty, k >= 1");
  expect(ids.size(0) == Q && scores.size(0) == Q && scores.size(1) == k, entry, "ids and scores must be (Q, k)");
  const bool* live = nullptr;
  if (alive.has_value()) {
    expect_tensor(*alive, DType::kBool, 1, entry, "alive");
    expect(alive->size(0) == N, entry, "alive must be (N,)");
    live = alive->ptr<bool>();
  }
  const int64_t* rg = nullptr;
  if (ranges.has_value()) {
    expect_tensor(*ranges, DType::kInt64, 2, entry, "ranges");
    expect(ranges->size(0) == Q && ranges->size(1) == 2, entry, "ranges must be (Q, 2)");
    rg = ranges->ptr<int64_t>();
  }
  cosine::HalfPrefilter half;
  std::vector<int16_t> query_codes;
  std::vector<float> query_scale;
  if (scan.has_value() && scan->dtype == DType::kInt8) {
    expect_tensor(*scan, DType::kInt8, 2, entry, "scan");
    expect(scan->size(0) == N && scan->size(1) == D, entry, "scan must have the keys' shape (N, D)");
    expect(scan_scale.has_value(), entry, "an int8 scan copy needs its scan_scale");
    expect_tensor(*scan_scale, DType::kFloat32, 1, entry, "scan_scale");
    expect(scan_scale->size(0) == N, entry, "scan_scale must be (N,)");
    // The int32 sums of the copy's dot products are exact below 2^31 / 127^2 > 2^17 dimensions.
    if (D <= kInt8MaxDim) {
      half.codes = scan->ptr<int8_t>();
      half.code_scale = scan_scale->ptr<float>();
      half.int8_dot = dot_int8_kernel();
      query_codes.resize(static_cast<size_t>(Q * D));
      query_scale.resize(static_cast<size_t>(Q));
      half.query_codes = query_codes.data();
      half.query_scale = query_scale.data();
    }
  } else if (scan.has_value() && dot_half_kernel() != nullptr) {
    expect_tensor(*scan, DType::kFloat16, 2, entry, "scan");
    expect(scan->size(0) == N && scan->size(1) == D, entry, "scan must have the keys' shape (N, D)");
    half.rows = scan->ptr<uint16_t>();
    half.dot = dot_half_kernel();
  }
  return cosine::prepared_topk_into(queries.ptr<float>(), Q, keys.ptr<float>(), norms.ptr<float>(), live, N, D, k, rg,
                                    ids.ptr<int64_t>(), scores.ptr<float>(), half, [&](const float* q, int64_t at) {
                                      if (half.codes == nullptr)
                                        return prefilter_delta(q, D, scan_norm, scan_err, norm_slack);
                                      double query_err;
                                      query_scale[at] = quantise_query(q, D, query_codes.data() + at * D, &query_err);
                                      return int8_delta(q, D, query_err, scan_norm, scan_err, norm_slack);
                                    });
}

// Folds the GEMM score block dots = queries . keys^T (keys = the prepared keys[offset : offset + B], norms
// their cached norms) into the running top-k, as topk_merge does: the GEMM's dot products only filter,
// and every key they admit is scored again exactly as the fused scan scores it.
Status index_merge(TensorView dots, TensorView norms, TensorView queries, TensorView keys, int64_t offset,
                   TensorView ranges, std::optional<TensorView> alive, TensorView ids, TensorView scores) {
  constexpr const char* entry = "index_merge";
  expect_tensor(dots, DType::kFloat32, 2, entry, "dots");
  expect_tensor(norms, DType::kFloat32, 1, entry, "norms");
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  expect_tensor(keys, DType::kFloat32, 2, entry, "keys");
  expect_tensor(ranges, DType::kInt64, 2, entry, "ranges");
  expect_tensor(ids, DType::kInt64, 2, entry, "ids");
  expect_tensor(scores, DType::kFloat32, 2, entry, "scores");
  const int64_t Q = dots.size(0), B = dots.size(1), k = ids.size(1), D = keys.size(1);
  expect(ids.size(0) == Q && scores.size(0) == Q && scores.size(1) == k && k >= 1, entry,
         "ids and scores must be (Q, k)");
  expect(keys.size(0) == B && norms.size(0) == B && queries.size(0) == Q && queries.size(1) == D &&
             ranges.size(0) == Q && ranges.size(1) == 2,
         entry, "dots (Q, B), norms (B,), queries (Q, D), keys (B, D) and ranges (Q, 2) must agree");
  const bool* live = nullptr;
  if (alive.has_value()) {
    expect_tensor(*alive, DType::kBool, 1, entry, "alive");
    expect(alive->size(0) == B, entry, "alive must be (B,)");
    live = alive->ptr<bool>();
  }
  const float* Dm = dots.ptr<float>();
  const float* norm = norms.ptr<float>();
  const float* Qm = queries.ptr<float>();
  const float* K = keys.ptr<float>();
  const int64_t* rg = ranges.ptr<int64_t>();
  int64_t* I = ids.ptr<int64_t>();
  float* S = scores.ptr<float>();
  py::gil_scoped_release nogil;
  // Removed rows are neither filtered nor scored (inv 0, not listed); zero rows (norm 0) score 0.
  std::vector<float> inv(B);
  std::vector<int64_t> zero;
  for (int64_t j = 0; j < B; ++j) {
    const bool live_row = live == nullptr || live[j];
    inv[j] = live_row && norm[j] > 0.f ? 1.f / norm[j] : 0.f;
    if (live_row && !(norm[j] > 0.f)) zero.push_back(j);
  }
  // The filter's margin, as in topk_merge: |GEMM dot - exact dot| <= D u |q| |key| whatever the order.
  const float margin = 2.5f * static_cast<float>(D + 8) * 5.9604645e-8f;
  const float* iv = inv.data();
  constexpr int64_t kChunk = 16;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(Q * B, int64_t(1) << 17))
  for (int64_t q = 0; q < Q; ++q) {
    const int64_t lo = std::max<int64_t>(0, rg[2 * q] - offset), hi = std::min<int64_t>(B, rg[2 * q + 1] - offset);
    TopK top(S + q * k, I + q * k, k);
    const float* row = Dm + q * B;
    const float* qv = Qm + q * D;
    for (int64_t j = lo; j < hi; j += kChunk) {
      const int64_t end = std::min(hi, j + kChunk);
      const float thr = top.count < k ? kNegInf : top.score[k - 1] - margin;
      const bool full = top.count == k;
      if (full && !any_at_least(row + j, iv + j, end - j, thr)) continue;
      for (int64_t t = j; t < end; ++t) {
        if (iv[t] == 0.f || (full && !(row[t] * iv[t] >= thr))) continue;
        const float s = dot(qv, K + t * D, D) / norm[t];
        if (top.admits(s, offset + t)) top.push(s, offset + t);
      }
    }
    for (const int64_t t : zero)
      if (t >= lo && t < hi && top.admits(0.f, offset + t)) top.push(0.f, offset + t);
  }
  return kOk;
}

}  // namespace tree
}  // namespace streammem
