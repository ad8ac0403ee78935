// Greedy and beam search of a CosineTree, CPU kernels (the spec: streammem_kernels/tree/reference.py,
// greedy_levels and beam_levels; the public function: tree/search.py).
//
//   greedy(emb (n,D) f32 unit rows, child_ptr (n+1) i64, child_idx (E) i64, roots (R) i64 ascending,
//          queries (Q,D) f32, from_every_root, path (S,H+1) i64, path_scores (S,H+1) f32,
//          best_node (S) i64, best_score (S) f32) -> Status
//     with S = Q, or (Q, R) when from_every_root (path (Q,R,H+1), ...).
//   beam(emb, child_ptr, child_idx, roots, level (n) i64, utility (n) f32, queries (Q,D) f32,
//        widths (H,) i64 (the beam at level H - i), min_score, use_utility, ids (Q,k) i64, scores (Q,k) f32,
//        scan (n,D) f16 or None, scan_norm, scan_err) -> Status
//     ids / scores padded with -1 / -inf; with a scan copy, the same results read from the copy first
//     (half_scan.cpp).
// The queries are the caller's float32 rows, not normalised: each entry checks them (status
// kQueriesNotFinite) and scales them to unit rows itself (cosine::unit_rows_into), so a public call
// needs no torch op before the kernel.  Both search every query independently, OpenMP over queries.
#include "tree.h"

#include "common.h"
#include "cosine_scan.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace streammem {
namespace tree {
namespace {

using cosine::better;
using cosine::dot;
using cosine::kInf;
using cosine::kNegInf;

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

// ---------------------------------------------------------------------------
// Greedy descent (Algorithm 1)
// ---------------------------------------------------------------------------
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
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads_for(S * width, 256))
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
#pragma omp parallel num_threads(threads_for(Q, 8))
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

}  // namespace

Status greedy(TensorView emb, TensorView child_ptr, TensorView child_idx, TensorView roots, TensorView queries,
              bool from_every_root, TensorView path, TensorView path_scores, TensorView best_node,
              TensorView best_score) {
  constexpr const char* entry = "greedy";
  expect_tensor(emb, DType::kFloat32, 2, entry, "emb");
  expect_tensor(child_ptr, DType::kInt64, 1, entry, "child_ptr");
  expect_tensor(child_idx, DType::kInt64, 1, entry, "child_idx");
  expect_tensor(roots, DType::kInt64, 1, entry, "roots");
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  const int lead = from_every_root ? 2 : 1;
  expect_tensor(path, DType::kInt64, lead + 1, entry, "path");
  expect_tensor(path_scores, DType::kFloat32, lead + 1, entry, "path_scores");
  expect_tensor(best_node, DType::kInt64, lead, entry, "best_node");
  expect_tensor(best_score, DType::kFloat32, lead, entry, "best_score");
  const int64_t Q = queries.size(0), D = emb.size(1), R = roots.size(0), height = path.size(lead) - 1;
  const int64_t S = from_every_root ? Q * R : Q;
  expect(Q >= 1 && D >= 1 && R >= 1 && queries.size(1) == D && child_ptr.size(0) == emb.size(0) + 1, entry,
         "queries must be (Q, D) with Q >= 1 and the tree non-empty");
  const bool lead_ok = path.size(0) == Q && best_node.size(0) == Q &&
                       (!from_every_root || (path.size(1) == R && best_node.size(1) == R));
  expect(lead_ok && height >= 0 && path_scores.numel() == S * (height + 1) && best_score.numel() == S, entry,
         "the outputs must be (Q, H+1) and (Q,), or (Q, R, H+1) and (Q, R) from every root");
  cosine::AlignedRows unit(static_cast<size_t>(Q * D));
  if (!cosine::unit_rows_into(queries.ptr<float>(), Q, D, unit.data())) return kQueriesNotFinite;
  const TreeArrays t{emb.ptr<float>(), D, child_ptr.ptr<int64_t>(), child_idx.ptr<int64_t>(), roots.ptr<int64_t>(), R,
                     nullptr, nullptr};
  py::gil_scoped_release nogil;
  greedy_into(t, unit.data(), Q, height, from_every_root, path.ptr<int64_t>(), path_scores.ptr<float>(),
              best_node.ptr<int64_t>(), best_score.ptr<float>());
  return kOk;
}

Status beam(TensorView emb, TensorView child_ptr, TensorView child_idx, TensorView roots, TensorView level,
            TensorView utility, TensorView queries, TensorView widths, double min_score,
            bool use_utility, TensorView ids, TensorView scores, std::optional<TensorView> scan, double scan_norm,
            double scan_err) {
  constexpr const char* entry = "beam";
  expect_tensor(emb, DType::kFloat32, 2, entry, "emb");
  expect_tensor(child_ptr, DType::kInt64, 1, entry, "child_ptr");
  expect_tensor(child_idx, DType::kInt64, 1, entry, "child_idx");
  expect_tensor(roots, DType::kInt64, 1, entry, "roots");
  expect_tensor(level, DType::kInt64, 1, entry, "level");
  expect_tensor(utility, DType::kFloat32, 1, entry, "utility");
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  expect_tensor(ids, DType::kInt64, 2, entry, "ids");
  expect_tensor(scores, DType::kFloat32, 2, entry, "scores");
  const int64_t n = emb.size(0), Q = queries.size(0), D = emb.size(1), k = ids.size(1);
  expect(Q >= 1 && D >= 1 && roots.size(0) >= 1 && queries.size(1) == D && child_ptr.size(0) == n + 1 &&
             level.size(0) == n && utility.size(0) == n,
         entry, "queries must be (Q, D) with Q >= 1, the tree non-empty and its arrays of one length");
  expect(k >= 1 && ids.size(0) == Q && scores.size(0) == Q && scores.size(1) == k, entry,
         "ids and scores must be (Q, k) with k >= 1");
  expect_tensor(widths, DType::kInt64, 1, entry, "widths");
  const int64_t H = widths.size(0);
  for (int64_t i = 0; i < H; ++i) expect(widths.ptr<int64_t>()[i] >= 1, entry, "every beam width must be >= 1");
  TreeArrays t{emb.ptr<float>(), D, child_ptr.ptr<int64_t>(), child_idx.ptr<int64_t>(), roots.ptr<int64_t>(),
               roots.size(0), level.ptr<int64_t>(), utility.ptr<float>()};
  if (scan.has_value()) {
    expect_tensor(*scan, DType::kFloat16, 2, entry, "scan");
    expect(scan->size(0) == n && scan->size(1) == D, entry, "scan must have the shape (n, D) of emb");
    t.scan = scan->ptr<uint16_t>();
    t.scan_norm = scan_norm;
    t.scan_err = scan_err;
  }
  cosine::AlignedRows unit(static_cast<size_t>(Q * D));
  if (!cosine::unit_rows_into(queries.ptr<float>(), Q, D, unit.data())) return kQueriesNotFinite;
  py::gil_scoped_release nogil;
  beam_into(t, unit.data(), Q, widths.ptr<int64_t>(), H, k, static_cast<float>(min_score), use_utility,
            ids.ptr<int64_t>(), scores.ptr<float>());
  return kOk;
}

}  // namespace tree
}  // namespace streammem
