// What the translation units of _cpu_tree share: the tree a search reads, the half-precision scan
// copy's kernel and error bound, and the module's entries (bound in module.cpp).
//
// Every entry takes its tensors as TensorView (tensor_view.h), writes into outputs its caller
// allocated and returns a Status: 0, or the number of the value check that failed among those the
// Python caller declares (streammem_kernels/tree/search.py, topk.py: NativeChecks).  Shapes, dtypes
// and sizes are the caller's promises (expect: a RuntimeError when broken).
#pragma once

#include "tensor_view.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace streammem {
namespace tree {

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
  // Optional half-precision scan copy of emb (CosineTree(half_scan=True), half_scan.cpp): (n, D)
  // float16 bits, and upper bounds on the norm of every emb row and on the distance of every row to
  // its copy; nullptr when the search ignores it.
  const uint16_t* scan = nullptr;
  double scan_norm = 0.0;
  double scan_err = 0.0;
};

// An error bound computed in double as the float32 the scans compare with: the nearest float at or above
// it (a bound rounded down could rule out a key the exact scan keeps).
inline float bound_rounded_up(double bound) {
  float out = static_cast<float>(bound);
  if (static_cast<double>(out) < bound) out = std::nextafter(out, std::numeric_limits<float>::infinity());
  return out;
}

// ---- half_scan.cpp: the scan copy ------------------------------------------------------------
// sum_i q[i] * float(h[i]) in float32 over a row of the copy (float16 bits).
using DotHalf = float (*)(const float*, const uint16_t*, int64_t);

// The copy's kernel on this CPU (F16C, AVX2, FMA), or nullptr: the beam search then reads the float32
// table only.
DotHalf dot_half_kernel();

// delta such that |dot(q, e) - dot_half(q, h)| <= delta for every row e of the table and its copy h,
// both computed in float32 (+inf when no useful bound exists).
float scan_delta(const float* q, int64_t D, double scan_norm, double scan_err);

// ---- int8_scan.cpp: the int8 scan copy (CosineIndex) --------------------------------------------
// sum_i p[i] * c[i] in int32 (exact for D <= kInt8MaxDim): query codes p (int16-widened), row codes c.
using DotInt8 = int32_t (*)(const int16_t*, const int8_t*, int64_t);
constexpr int64_t kInt8MaxDim = int64_t(1) << 16;

// This CPU's kernel (AVX-512 VNNI, AVX2, or the portable loop), and its name.
DotInt8 dot_int8_kernel();
const char* dot_int8_name();

// The codes (int16-widened) and scale of a unit query u (D,), and *err >= |u - scale * codes| (L2).
float quantise_query(const float* u, int64_t D, int16_t* codes, double* err);

// delta with |exact score - copy's score| <= delta for every row (int8_scan.cpp derives it), +inf
// when no useful bound exists.
float int8_delta(const float* u, int64_t D, double query_err, double scan_norm, double scan_err, double norm_slack);

// ---- entries -------------------------------------------------------------------------------------
// Status 1 of every search and top-k entry: the queries hold NaN or Inf.
constexpr Status kQueriesNotFinite = 1;

// search.cpp
Status greedy(TensorView emb, TensorView child_ptr, TensorView child_idx, TensorView roots, TensorView queries,
              bool from_every_root, TensorView path, TensorView path_scores, TensorView best_node,
              TensorView best_score);
Status beam(TensorView emb, TensorView child_ptr, TensorView child_idx, TensorView roots, TensorView level,
            TensorView utility, TensorView queries, TensorView widths, double min_score,
            bool use_utility, TensorView ids, TensorView scores, std::optional<TensorView> scan, double scan_norm,
            double scan_err);

// half_scan.cpp
Status half_copy(TensorView src, TensorView dst, TensorView bounds);
Status half_dots(TensorView query, TensorView rows, TensorView out);

// int8_scan.cpp
Status int8_copy(TensorView src, TensorView codes, TensorView scales, TensorView bounds);
Status int8_dots(TensorView query, TensorView codes, TensorView scales, TensorView out, const std::string& kernel);

// topk.cpp
Status cosine_topk(TensorView queries, TensorView keys, std::optional<TensorView> ranges, TensorView ids,
                   TensorView scores);
Status unit_rows(TensorView queries, TensorView out);
Status row_norms(TensorView keys, TensorView norms);
Status topk_merge(TensorView dots, TensorView norms, TensorView queries, TensorView keys, int64_t offset,
                  TensorView ranges, TensorView ids, TensorView scores);

// index.cpp (CosineIndex: prepared keys)
Status index_prepare(TensorView src, TensorView dst, TensorView norms, TensorView scale);
Status index_topk(TensorView queries, TensorView keys, TensorView norms, std::optional<TensorView> alive,
                  std::optional<TensorView> ranges, TensorView ids, TensorView scores, std::optional<TensorView> scan,
                  std::optional<TensorView> scan_scale, double scan_norm, double scan_err, double norm_slack);
Status index_merge(TensorView dots, TensorView norms, TensorView queries, TensorView keys, int64_t offset,
                   TensorView ranges, std::optional<TensorView> alive, TensorView ids, TensorView scores);

}  // namespace tree
}  // namespace streammem
