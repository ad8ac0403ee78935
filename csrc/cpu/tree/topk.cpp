// Exact cosine top-k, CPU kernels (the spec: streammem_kernels/tree/reference.py,
// cosine_topk_reference; the public function: tree/topk.py).
//
//   cosine_topk(queries (Q,D) f32 raw, keys (N,D) f32 raw, ranges (Q,2) i64 or None for all keys,
//               ids (Q,k) i64, scores (Q,k) f32) -> Status: the fused one-pass scan (cosine_scan.h).
//     Status 1: queries not finite, 2: keys not finite, 3: a range outside 0 <= start <= end <= N.
// The BLAS path of topk.py (blocked torch.mm GEMMs filter the keys for a running top-k):
//   unit_rows(queries (Q,D) f32, out (Q,D) f32) -> Status 1 when the queries are not finite:
//     the checked unit rows it multiplies with.
//   row_norms(keys (N,D) f32, norms (N) f32) -> Status 1 when the keys are not finite: the norms
//     the scan divides by, in the same pass as the check.
//   topk_merge(dots (Q,B) f32, norms (B) f32, queries (Q,D) f32 unit, keys (B,D) f32, offset,
//              ranges (Q,2) i64, ids (Q,k) i64 inout, scores (Q,k) f32 inout) -> Status: folds one
//     GEMM score block into each query's running top-k; the admitted keys are scored exactly as the
//     fused scan scores them, so both paths rank by the same numbers and identical keys tie.
#include "tree.h"

#include "common.h"
#include "cosine_scan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace streammem {
namespace tree {
namespace {

using cosine::dot;
using cosine::kInf;
using cosine::any_at_least;
using cosine::kNegInf;
using cosine::scaled_row;
using cosine::TopK;

}  // namespace

Status cosine_topk(TensorView queries, TensorView keys, std::optional<TensorView> ranges, TensorView ids,
                   TensorView scores) {
  constexpr const char* entry = "cosine_topk";
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  expect_tensor(keys, DType::kFloat32, 2, entry, "keys");
  expect_tensor(ids, DType::kInt64, 2, entry, "ids");
  expect_tensor(scores, DType::kFloat32, 2, entry, "scores");
  const int64_t Q = queries.size(0), N = keys.size(0), D = keys.size(1), k = ids.size(1);
  expect(Q >= 1 && N >= 1 && D >= 1 && k >= 1 && queries.size(1) == D, entry,
         "queries (Q, D) and keys (N, D) must be non-empty, k >= 1");
  expect(ids.size(0) == Q && scores.size(0) == Q && scores.size(1) == k, entry, "ids and scores must be (Q, k)");
  const int64_t* rg = nullptr;
  if (ranges.has_value()) {
    expect_tensor(*ranges, DType::kInt64, 2, entry, "ranges");
    expect(ranges->size(0) == Q && ranges->size(1) == 2, entry, "ranges must be (Q, 2)");
    rg = ranges->ptr<int64_t>();
  }
  return cosine::cosine_topk_into(queries.ptr<float>(), Q, keys.ptr<float>(), N, D, k, rg, ids.ptr<int64_t>(),
                                  scores.ptr<float>());
}

Status unit_rows(TensorView queries, TensorView out) {
  constexpr const char* entry = "unit_rows";
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  expect_tensor(out, DType::kFloat32, 2, entry, "out");
  expect(out.size(0) == queries.size(0) && out.size(1) == queries.size(1), entry, "out must have the queries' shape");
  return cosine::unit_rows_into(queries.ptr<float>(), queries.size(0), queries.size(1), out.ptr<float>())
             ? kOk
             : kQueriesNotFinite;
}

Status row_norms(TensorView keys, TensorView norms) {
  constexpr const char* entry = "row_norms";
  expect_tensor(keys, DType::kFloat32, 2, entry, "keys");
  expect_tensor(norms, DType::kFloat32, 1, entry, "norms");
  const int64_t N = keys.size(0), D = keys.size(1);
  expect(norms.size(0) == N, entry, "norms must be (N,)");
  const float* K = keys.ptr<float>();
  float* o = norms.ptr<float>();
  int bad = 0;
  {
    py::gil_scoped_release nogil;
    // A finite squared norm proves its row finite; only a non-finite one (NaN/Inf, or huge finite
    // values whose squares overflow) has its row checked.
#pragma omp parallel for schedule(static) reduction(| : bad) num_threads(threads_for(N * D, int64_t(1) << 22))
    for (int64_t j = 0; j < N; ++j) {
      const float sq = dot(K + j * D, K + j * D, D);
      o[j] = std::sqrt(sq);
      if (!std::isfinite(sq) && !cosine::chunk_finite(K + j * D, D)) bad |= 1;
    }
  }
  return bad ? 1 : kOk;
}

// Folds the GEMM score block dots = queries . keys^T (keys = keys[offset : offset + B], norms their
// row_norms) into the running top-k.  The GEMM's dot products only filter: a BLAS sums each one in an
// order that depends on where the key falls in its tiles, so two identical keys can differ by an ulp
// there, which would break the tie rule.  Every key the filter admits is scored again exactly as the
// fused scan scores it (dot(q, key) / norm).
Status topk_merge(TensorView dots, TensorView norms, TensorView queries, TensorView keys, int64_t offset,
                  TensorView ranges, TensorView ids, TensorView scores) {
  constexpr const char* entry = "topk_merge";
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
  const float* Dm = dots.ptr<float>();
  const float* norm = norms.ptr<float>();
  const float* Qm = queries.ptr<float>();
  const float* K = keys.ptr<float>();
  const int64_t* rg = ranges.ptr<int64_t>();
  int64_t* I = ids.ptr<int64_t>();
  float* S = scores.ptr<float>();
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
  // Each (query, key) costs one filter comparison; a rescored key costs D more (few, after the
  // first block).  Dynamic: a descheduled thread delays the region by one query, not its share.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads_for(Q * B, int64_t(1) << 17))
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
  return kOk;
}

}  // namespace tree
}  // namespace streammem
