// Cosine memory tree search and exact cosine top-k, CPU kernels.
//
// Contract (streammem_kernels/tree.py is the spec; inputs arrive prepared):
//   greedy(emb (n,D) f32 unit rows, child_ptr (n+1) i64, child_idx (m) i64,
//          roots (R) i64 ascending, queries (Q,D) f32 unit rows, height,
//          from_every_root)
//     -> path (S,H+1) i64, path_scores (S,H+1) f32, best_node (S,) i64,
//        best_score (S,) f32 with S = Q, or Q*R rows when from_every_root.
//   beam(emb, child_ptr, child_idx, roots, level (n) i64, utility (n) f32,
//        queries, widths (H) i64, k, min_score, use_utility)
//     -> ids (Q,k) i64, scores (Q,k) f32 (padded -1 / -inf).
//   cosine_topk(queries (Q,D) f32 unit, keys (N,D) f32 raw, k, ranges (Q,2))
//     -> ids (Q,k), scores (Q,k): one fused pass, key norms computed on the
//        fly next to the dot products while the key row is in L1.
//   row_norms(keys (N,D) f32) -> (N,) sqrt(dot(key, key)), the norms cosine_topk divides by.
//   topk_merge(dots (Q,B) f32, norms (B,) f32, queries (Q,D) f32, keys (B,D) f32, offset,
//              ranges, ids (Q,k) inout, scores (Q,k) inout): folds one score block of
//        a BLAS GEMM into each query's running top-k (the GEMM filters, the
//        admitted keys are scored like cosine_topk scores them).
//
// Every ranking orders by (score desc, id asc).  A running top-k is a sorted
// array: k is small (<= a few hundred) and, after the first few hundred keys,
// almost every candidate fails the one comparison with the current k-th.
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace streammem {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Queries sharing one pass over a key row (the row stays in L1 for all of them).
constexpr int64_t kQueryBlock = 8;

STREAMMEM_HOT float dot(const float* __restrict a, const float* __restrict b, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

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
py::tuple greedy(carray<float> emb, carray<int64_t> child_ptr, carray<int64_t> child_idx, carray<int64_t> roots,
                 carray<float> queries, int64_t height, bool from_every_root) {
  require(emb.ndim() == 2 && queries.ndim() == 2 && emb.shape(1) == queries.shape(1), "greedy: bad shapes");
  const int64_t D = emb.shape(1), Q = queries.shape(0), R = roots.shape(0), width = height + 1;
  require(R >= 1, "greedy: the tree has no roots");
  const int64_t S = from_every_root ? Q * R : Q;
  py::array_t<int64_t> path({S, width});
  py::array_t<float> path_scores({S, width});
  py::array_t<int64_t> best_node(S);
  py::array_t<float> best_score(S);
  const float* E = emb.data();
  const int64_t* ptr = child_ptr.data();
  const int64_t* kids = child_idx.data();
  const int64_t* root = roots.data();
  const float* Qm = queries.data();
  int64_t* P = out_ptr(path);
  float* PS = out_ptr(path_scores);
  int64_t* BN = out_ptr(best_node);
  float* BS = out_ptr(best_score);
  {
    py::gil_scoped_release nogil;
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
  return py::make_tuple(path, path_scores, best_node, best_score);
}

// ---------------------------------------------------------------------------
// Level-synchronous beam search
// ---------------------------------------------------------------------------
py::tuple beam(carray<float> emb, carray<int64_t> child_ptr, carray<int64_t> child_idx, carray<int64_t> roots,
               carray<int64_t> level, carray<float> utility, carray<float> queries, carray<int64_t> widths,
               int64_t k, float min_score, bool use_utility) {
  require(emb.ndim() == 2 && queries.ndim() == 2 && emb.shape(1) == queries.shape(1), "beam: bad shapes");
  require(k >= 1, "beam: k must be >= 1");
  const int64_t D = emb.shape(1), Q = queries.shape(0), R = roots.shape(0), H = widths.shape(0);
  py::array_t<int64_t> ids({Q, k});
  py::array_t<float> scores({Q, k});
  const float* E = emb.data();
  const int64_t* ptr = child_ptr.data();
  const int64_t* kids = child_idx.data();
  const int64_t* root = roots.data();
  const int64_t* lvl = level.data();
  const float* util = utility.data();
  const float* Qm = queries.data();
  const int64_t* W = widths.data();
  int64_t* I = out_ptr(ids);
  float* S = out_ptr(scores);
  {
    py::gil_scoped_release nogil;
#pragma omp parallel if (Q >= 8)
    {
      std::vector<int64_t> pending, next;
      std::vector<std::pair<float, int64_t>> pool;
      auto by_rank = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
        return better(a.first, a.second, b.first, b.second);
      };
#pragma omp for schedule(dynamic, 8)
      for (int64_t q = 0; q < Q; ++q) {
        const float* qv = Qm + q * D;
        pending.assign(root, root + R);
        for (int64_t step = 0; step < H; ++step) {
          const int64_t at = H - step;
          pool.clear();
          next.clear();
          for (int64_t node : pending) {
            if (lvl[node] == at)
              pool.emplace_back(dot(qv, E + node * D, D), node);
            else
              next.push_back(node);
          }
          if (pool.empty()) continue;
          const size_t keep = std::min<size_t>(static_cast<size_t>(W[step]), pool.size());
          std::partial_sort(pool.begin(), pool.begin() + keep, pool.end(), by_rank);
          for (size_t i = 0; i < keep; ++i) {
            const int64_t node = pool[i].second;
            next.insert(next.end(), kids + ptr[node], kids + ptr[node + 1]);
          }
          pending.swap(next);
        }
        pool.clear();
        for (int64_t node : pending) {
          const float cos = dot(qv, E + node * D, D);
          if (!(cos >= min_score)) continue;
          pool.emplace_back(use_utility ? cos * util[node] : cos, node);
        }
        const size_t keep = std::min<size_t>(static_cast<size_t>(k), pool.size());
        std::partial_sort(pool.begin(), pool.begin() + keep, pool.end(), by_rank);
        for (int64_t i = 0; i < k; ++i) {
          const bool have = static_cast<size_t>(i) < keep;
          I[q * k + i] = have ? pool[i].second : -1;
          S[q * k + i] = have ? pool[i].first : kNegInf;
        }
      }
    }
  }
  return py::make_tuple(ids, scores);
}

// ---------------------------------------------------------------------------
// Exact cosine top-k
// ---------------------------------------------------------------------------
// Scans keys [k_lo, k_hi) for the queries [q_lo, q_hi), each restricted to its
// range, folding into the running top-k arrays (row stride k).
STREAMMEM_HOT void scan_keys(const float* __restrict Qm, const float* __restrict K, int64_t D, int64_t q_lo,
                             int64_t q_hi, int64_t k_lo, int64_t k_hi, const int64_t* __restrict ranges,
                             float* top_score, int64_t* top_id, int64_t k) {
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
    for (int64_t i = lo; i < hi; ++i) {
      const float* key = K + i * D;
      const float nsq = dot(key, key, D);
      // Divide (not multiply by 1/norm) so that a key parallel to the query
      // scores exactly like its normalised copy in the reference.
      const float norm = std::sqrt(nsq);
      for (int64_t q = qb; q < qe; ++q) {
        if (i < ranges[2 * q] || i >= ranges[2 * q + 1]) continue;
        const float s = nsq > 0.f ? dot(Qm + q * D, key, D) / norm : 0.f;
        TopK& t = tops[q - qb];
        if (t.admits(s, i)) t.push(s, i);
      }
    }
  }
}

py::tuple cosine_topk(carray<float> queries, carray<float> keys, int64_t k, carray<int64_t> ranges) {
  require(queries.ndim() == 2 && keys.ndim() == 2 && queries.shape(1) == keys.shape(1), "cosine_topk: bad shapes");
  require(k >= 1, "cosine_topk: k must be >= 1");
  const int64_t Q = queries.shape(0), N = keys.shape(0), D = keys.shape(1);
  py::array_t<int64_t> ids({Q, k});
  py::array_t<float> scores({Q, k});
  int64_t* I = out_ptr(ids);
  float* S = out_ptr(scores);
  std::fill(I, I + Q * k, int64_t(-1));
  std::fill(S, S + Q * k, kNegInf);
  const float* Qm = queries.data();
  const float* K = keys.data();
  const int64_t* rg = ranges.data();
  const int threads = max_threads();
  {
    py::gil_scoped_release nogil;
    if (Q >= 2 * int64_t(threads) * kQueryBlock || threads == 1 || Q * N * D < (int64_t(1) << 20)) {
      // Enough query blocks to keep every thread busy.
      const int64_t blocks = (Q + kQueryBlock - 1) / kQueryBlock;
#pragma omp parallel for schedule(dynamic, 1) if (Q * N * D >= (int64_t(1) << 20))
      for (int64_t b = 0; b < blocks; ++b)
        scan_keys(Qm, K, D, b * kQueryBlock, std::min(Q, (b + 1) * kQueryBlock), 0, N, rg, S, I, k);
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
                  k);
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
  return py::make_tuple(ids, scores);
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
  std::vector<float> inv(B);
  for (int64_t j = 0; j < B; ++j) inv[j] = norm[j] > 0.f ? 1.f / norm[j] : 0.f;
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
        if (full && !(row[t] * iv[t] >= thr)) continue;
        const float s = norm[t] > 0.f ? dot(qv, K + t * D, D) / norm[t] : 0.f;
        if (top.admits(s, offset + t)) top.push(s, offset + t);
      }
    }
  }
}

// Validation pass over the keys without a boolean temporary: x - x is 0 for
// finite x and NaN for NaN/Inf, so one sum per chunk detects both.
STREAMMEM_HOT bool chunk_finite(const float* __restrict x, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += x[i] - x[i];
  return acc == 0.f;
}

bool all_finite(carray<float> values) {
  const float* x = values.data();
  const int64_t n = values.size();
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  int bad = 0;
  py::gil_scoped_release nogil;
#pragma omp parallel for schedule(static) reduction(| : bad) if (n >= (int64_t(1) << 20))
  for (int64_t c = 0; c < chunks; ++c)
    if (!chunk_finite(x + c * kChunk, std::min(kChunk, n - c * kChunk))) bad |= 1;
  return bad == 0;
}

}  // namespace
}  // namespace streammem

namespace py = pybind11;

PYBIND11_MODULE(_cpu_tree, m) {
  m.doc() = "Cosine memory tree search and exact cosine top-k (CPU, OpenMP over queries)";
  m.def("greedy", &streammem::greedy, py::arg("emb"), py::arg("child_ptr"), py::arg("child_idx"), py::arg("roots"),
        py::arg("queries"), py::arg("height"), py::arg("from_every_root"));
  m.def("beam", &streammem::beam, py::arg("emb"), py::arg("child_ptr"), py::arg("child_idx"), py::arg("roots"),
        py::arg("level"), py::arg("utility"), py::arg("queries"), py::arg("widths"), py::arg("k"),
        py::arg("min_score"), py::arg("use_utility"));
  m.def("cosine_topk", &streammem::cosine_topk, py::arg("queries"), py::arg("keys"), py::arg("k"),
        py::arg("ranges"));
  m.def("all_finite", &streammem::all_finite, py::arg("values"));
  m.def("row_norms", &streammem::row_norms, py::arg("keys"));
  m.def("topk_merge", &streammem::topk_merge, py::arg("dots"), py::arg("norms"), py::arg("queries"),
        py::arg("keys"), py::arg("offset"), py::arg("ranges"), py::arg("ids"), py::arg("scores"));
}
