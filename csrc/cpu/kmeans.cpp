// Batched Lloyd k-means, CPU kernel.
//
// Entries (the border of csrc/cpu/tensor_view.h; the spec is streammem_kernels/kmeans/reference.py).
// Every tensor is a C-contiguous CPU tensor the caller validated and, for outputs, allocated:
//   lloyd(points (B, N, D) or (N, D) float32, weights (B, N) float32 or None (all 1),
//         lengths (B,) int64 in [k, N] or None (all N), centroids (B, k, D), or (k, D) for (N, D) points,
//         float32 (in: the initial centres, out: the final ones), init_seed, n_local_trials, tol (relative:
//         x the mean feature variance), iters, cosine, labels B * N int64, inertia B float32 or float64,
//         n_iter B int64) -> Status
//       init_seed < 0: Lloyd from the centres given (status 0).  init_seed in [0, 2^32) (batched_kmeans'
//       latency path; unweighted l2 only): the centres are first seeded by greedy k-means++ with
//       n_local_trials candidates per step, on the generator stream of torch.manual_seed(init_seed);
//       1: the points hold NaN or Inf;  2: a problem's largest magnitude lies outside [2^-40, 2^40]
//       (the caller rescales it; nothing is written).
//   seeding_noise(seed (32 bits), exponential (n,) float64, uniform (m,) float64) -> Status (0): torch's
//       CPU exponential_(1) then rand(dtype=float64) draws of one generator (tests).
//
// One Lloyd iteration is ONE pass over the points: each point's scores against
// all centres (||c||^2 - 2 x.c, or -x.c for cosine) are computed, the argmin
// taken, and the point is immediately added (float64) into its cluster's sum
// while it is still in cache, together with its direct float64 distance to
// that centre (needed for empty-cluster re-seeding and the inertia).  Memory
// traffic is one read of the points per iteration, which is what matters for
// the StreamChat shape (N = 40 frames of D = 65,536).
//
// Scores: the register-tiled GEMM micro-kernel of simd.h (6 points x 16 centres,
// or x 8 when k <= 8; centres transposed to (D, kp) so the inner loop is a
// broadcast FMA over 8-lane vectors, AVX2+FMA clone at load time).
//
// Threads: OpenMP over problems when there are at least 2 per thread (each
// problem then runs serially, no synchronisation); otherwise problem by
// problem with the points split in contiguous ranges per thread, each thread
// owning float64 sums that are added in thread order (deterministic for a
// fixed thread count).
#include "common.h"
#include "simd.h"
#include "tensor_view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include <pybind11/stl.h>

namespace streammem {
namespace {

using simd::v8f;
constexpr int kTilePoints = simd::kTileRows;  // 6 points x 2 vectors of 8 centres (simd::fma_tile)

struct Centres {
  const float* c;   // (k, D)
  const double* sq; // (k,) ||c||^2 (float64)
  const float* ct;  // (D, kp) transposed, zero-padded to kp (a multiple of 8)
  int64_t kp;
};

// Features per float32 partial dot product.  Each block's partial sums are
// added into float64 totals, so a long dot (D = 65,536 frame features) carries
// the rounding of a 256-term float32 sum, not of a 65,536-term one; without
// this the scores of near-boundary frames drift by more than their gap and
// Lloyd can settle in a different fixed point than a float64 computation.
constexpr int64_t kAccumBlock = 256;
// Multiply-adds of one assignment pass each thread should get before a pass takes a second
// thread (threads_for, common.h): about 0.1 ms on one core.
constexpr int64_t kPassWorkPerThread = int64_t(1) << 18;
// Features per block of the distance + centre-sum update (2 KB of floats).
constexpr int64_t kSumBlock = 512;

// scores[p * kp + j] = rows[p] . c_j (float64) for 6 point rows and all
// centres: a GEMM micro-kernel, NV vectors of 8 centres per tile, broadcast of
// one feature of each point against a row of the transposed centres.
template <int NV>
STREAMMEM_HOT void scores_tile(const float* const* rows, int64_t D, const Centres& cs, double* scores) {
  for (int64_t e = 0; e < kTilePoints * cs.kp; ++e) scores[e] = 0.0;
  for (int64_t j0 = 0; j0 < cs.kp; j0 += 8 * NV) {
    const float* col = cs.ct + j0;
    for (int64_t d0 = 0; d0 < D; d0 += kAccumBlock) {
      const int64_t d1 = std::min(D, d0 + kAccumBlock);
      v8f acc[kTilePoints][NV];
      for (int p = 0; p < kTilePoints; ++p)
        for (int v = 0; v < NV; ++v) acc[p][v] = v8f{};
      simd::fma_tile<NV>([rows](int p, int64_t d) { return rows[p][d]; }, col, cs.kp, d0, d1, acc);
      for (int p = 0; p < kTilePoints; ++p)
        for (int v = 0; v < NV; ++v) {
          float part[8];
          simd::store8(part, acc[p][v]);
          double* out = scores + p * cs.kp + j0 + 8 * v;
          for (int l = 0; l < 8; ++l) out[l] += part[l];
        }
    }
  }
}

// Partial direct distance of x to centre c over `len` features, float64
// (l2: sum of squared differences; cosine: the dot product, turned into
// 1 - x.c by the caller), and when `sums` is given, sums += w * x (float64).
STREAMMEM_HOT double own_distance_accumulate(const float* __restrict x, const float* __restrict c, int64_t len,
                                             bool cosine, double w, double* __restrict sums) {
  double acc = 0.0;
  if (cosine) {
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < len; ++d) acc += static_cast<double>(x[d]) * static_cast<double>(c[d]);
  } else {
#pragma omp simd reduction(+ : acc)
    for (int64_t d = 0; d < len; ++d) {
      const double diff = static_cast<double>(x[d]) - static_cast<double>(c[d]);
      acc += diff * diff;
    }
  }
  if (sums) {
#pragma omp simd
    for (int64_t d = 0; d < len; ++d) sums[d] += w * static_cast<double>(x[d]);
  }
  return acc;
}

// Nearest centre: the first index reaching the minimum score (ties go to the
// lowest centre index, as torch.argmin/argmax).  Two vectorisable passes (a min
// reduction, then the first match) instead of one dependent compare chain.
STREAMMEM_HOT int64_t best_centre(const double* __restrict dots, int64_t k, const double* __restrict sq,
                                  bool cosine, double* __restrict score) {
  double best = std::numeric_limits<double>::infinity();
  if (cosine) {
#pragma omp simd reduction(min : best)
    for (int64_t j = 0; j < k; ++j) {
      score[j] = -dots[j];
      best = std::min(best, score[j]);
    }
  } else {
#pragma omp simd reduction(min : best)
    for (int64_t j = 0; j < k; ++j) {
      score[j] = sq[j] - 2.0 * dots[j];
      best = std::min(best, score[j]);
    }
  }
  for (int64_t j = 0; j < k; ++j)
    if (score[j] == best) return j;
  return 0;
}

// Assign points [i0, i1) of one problem; accumulate into sums/mass when given.
void assign_range(const float* x, const float* w, int64_t i0, int64_t i1, int64_t D, int64_t k,
                  const Centres& cs, bool cosine, int64_t* labels, double* pdist, double* sums, double* mass) {
  std::vector<double> scores(static_cast<size_t>(kTilePoints * cs.kp));
  std::vector<double> score_row(static_cast<size_t>(cs.kp));
  const bool wide = cs.kp > 8;
  for (int64_t i = i0; i < i1; i += kTilePoints) {
    const int64_t np = std::min<int64_t>(kTilePoints, i1 - i);
    const float* rows[kTilePoints];
    // A short last tile repeats its last row (its scores are simply not used).
    for (int p = 0; p < kTilePoints; ++p) rows[p] = x + (i + std::min<int64_t>(p, np - 1)) * D;
    if (wide)
      scores_tile<2>(rows, D, cs, scores.data());
    else
      scores_tile<1>(rows, D, cs, scores.data());
    int64_t tile_labels[kTilePoints];
    double tile_dist[kTilePoints];
    for (int64_t p = 0; p < np; ++p) {
      tile_labels[p] = best_centre(scores.data() + p * cs.kp, k, cs.sq, cosine, score_row.data());
      labels[i + p] = tile_labels[p];
      tile_dist[p] = 0.0;
      if (mass) mass[tile_labels[p]] += w[i + p];
    }
    // Distances and sums feature block by feature block: for long rows the
    // float64 sum rows of the tile's clusters (often one or two: neighbouring
    // frames share a cluster) stay in L1/L2 across the tile's points.
    for (int64_t d0 = 0; d0 < D; d0 += kSumBlock) {
      const int64_t len = std::min(kSumBlock, D - d0);
      for (int64_t p = 0; p < np; ++p) {
        const int64_t lab = tile_labels[p];
        tile_dist[p] += own_distance_accumulate(x + (i + p) * D + d0, cs.c + lab * D + d0, len, cosine, w[i + p],
                                                sums ? sums + lab * D + d0 : nullptr);
      }
    }
    for (int64_t p = 0; p < np; ++p) pdist[i + p] = cosine ? 1.0 - tile_dist[p] : tile_dist[p];
  }
}

struct Workspace {
  std::vector<float> ct, next;
  std::vector<double> sq, sums, mass, pdist;
  std::vector<int64_t> order;
};

void prepare_centres(const float* c, int64_t k, int64_t D, Workspace& ws, Centres& cs) {
  ws.sq.assign(k, 0.0);
  for (int64_t j = 0; j < k; ++j) {
    double s = 0.0;
    for (int64_t d = 0; d < D; ++d) s += static_cast<double>(c[j * D + d]) * c[j * D + d];
    ws.sq[j] = s;
  }
  cs.c = c;
  cs.sq = ws.sq.data();
  const int64_t tile = k > 8 ? 16 : 8;
  const int64_t kp = (k + tile - 1) / tile * tile;
  ws.ct.assign(static_cast<size_t>(D * kp), 0.0f);
  // Feature-major walk: each (D, kp) row is written once, the k centre rows are read as k streams.
  for (int64_t d = 0; d < D; ++d)
    for (int64_t j = 0; j < k; ++j) ws.ct[d * kp + j] = c[j * D + d];
  cs.ct = ws.ct.data();
  cs.kp = kp;
}

// One pass over the n valid points with `threads` threads (1 = serial).
void run_pass(const float* x, const float* w, int64_t n, int64_t D, int64_t k, const Centres& cs, bool cosine,
              bool accumulate, int threads, int64_t* labels, Workspace& ws) {
  if (accumulate) {
    ws.sums.assign(static_cast<size_t>(threads * k * D), 0.0);
    ws.mass.assign(static_cast<size_t>(threads * k), 0.0);
  }
  auto range = [&](int t) {
    const int64_t i0 = n * t / threads, i1 = n * (t + 1) / threads;
    assign_range(x, w, i0, i1, D, k, cs, cosine, labels, ws.pdist.data(),
                 accumulate ? ws.sums.data() + t * k * D : nullptr, accumulate ? ws.mass.data() + t * k : nullptr);
  };
  if (threads == 1) {
    range(0);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) range(t);
  if (accumulate) {
    for (int t = 1; t < threads; ++t) {
      const double* s = ws.sums.data() + t * k * D;
      for (int64_t e = 0; e < k * D; ++e) ws.sums[e] += s[e];
      for (int64_t j = 0; j < k; ++j) ws.mass[j] += ws.mass[t * k + j];
    }
  }
}

// New centres from the float64 sums, empty clusters re-seeded; returns the total squared shift.
double update_centres(const float* x, int64_t n, int64_t D, int64_t k, bool cosine, float* centres, Workspace& ws) {
  ws.next.resize(static_cast<size_t>(k * D));
  std::vector<int64_t> empty;
  for (int64_t j = 0; j < k; ++j) {
    const double* s = ws.sums.data() + j * D;
    double scale = 0.0;
    if (cosine) {
      double norm2 = 0.0;
      for (int64_t d = 0; d < D; ++d) norm2 += s[d] * s[d];
      if (ws.mass[j] > 0.0 && norm2 > 0.0) scale = 1.0 / std::sqrt(norm2);
    } else if (ws.mass[j] > 0.0) {
      scale = 1.0 / ws.mass[j];
    }
    if (scale == 0.0) {
      empty.push_back(j);
      continue;
    }
    float* out = ws.next.data() + j * D;
    for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(s[d] * scale);
  }
  if (!empty.empty()) {
    // Farthest points from their own centre, decreasing distance, ties by lowest index.
    ws.order.resize(n);
    std::iota(ws.order.begin(), ws.order.end(), int64_t{0});
    const double* dist = ws.pdist.data();
    const size_t m = empty.size();
    std::partial_sort(ws.order.begin(), ws.order.begin() + m, ws.order.end(), [dist](int64_t a, int64_t b) {
      return dist[a] > dist[b] || (dist[a] == dist[b] && a < b);
    });
    for (size_t e = 0; e < m; ++e)
      std::memcpy(ws.next.data() + empty[e] * D, x + ws.order[e] * D, sizeof(float) * D);
  }
  double shift = 0.0;
  for (int64_t e = 0; e < k * D; ++e) {
    const double diff = static_cast<double>(ws.next[e]) - static_cast<double>(centres[e]);
    shift += diff * diff;
  }
  std::memcpy(centres, ws.next.data(), sizeof(float) * k * D);
  return shift;
}

// Mean over features of the (unweighted, ddof 0) variance of the n points:
// one float64 pass of per-feature sums and sums of squares.
double mean_feature_variance(const float* x, int64_t n, int64_t D) {
  std::vector<double> s1(D, 0.0), s2(D, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x + i * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) {
      const double v = row[d];
      s1[d] += v;
      s2[d] += v * v;
    }
  }
  double total = 0.0;
  for (int64_t d = 0; d < D; ++d) {
    const double mean = s1[d] / n;
    total += std::max(0.0, s2[d] / n - mean * mean);
  }
  return total / D;
}

void solve_problem(const float* x, const float* w, int64_t n, int64_t N, int64_t D, int64_t k, double tol,
                   int iters, bool cosine, int threads, float* centres, int64_t* labels, float* inertia,
                   int64_t* n_iter) {
  Workspace ws;
  ws.pdist.assign(n, 0.0);
  // tol = 0 (stop only at a fixed point) needs no variance: skip that pass over the points.
  if (tol > 0.0) tol *= mean_feature_variance(x, n, D);
  Centres cs{};
  int64_t done = 0;
  for (int it = 0; it < iters; ++it) {
    prepare_centres(centres, k, D, ws, cs);
    run_pass(x, w, n, D, k, cs, cosine, true, threads, labels, ws);
    const double shift = update_centres(x, n, D, k, cosine, centres, ws);
    ++done;
    if (shift <= tol) break;
  }
  // Final assignment so labels match the returned centres; inertia from direct distances.
  prepare_centres(centres, k, D, ws, cs);
  run_pass(x, w, n, D, k, cs, cosine, false, threads, labels, ws);
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += static_cast<double>(w[i]) * ws.pdist[i];
  for (int64_t i = n; i < N; ++i) labels[i] = -1;
  *inertia = static_cast<float>(total);
  *n_iter = done;
}

// Lloyd on B problems (x (B,N,D), w (B,N), len (B,)), centres holding the initial (B,k,D) on entry.
void solve_all(const float* x, const float* w, const int64_t* len, int64_t B, int64_t N, int64_t D, int64_t k,
               double tol, int iters, bool cosine, float* c, int64_t* lab, float* inr, int64_t* nit) {
  // One assignment pass costs about N x k x D multiply-adds per problem.
  const int threads = threads_for(B * N * D * k, kPassWorkPerThread);
  if (threads > 1 && B >= 2 * threads) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t b = 0; b < B; ++b)
      solve_problem(x + b * N * D, w + b * N, len[b], N, D, k, tol, iters, cosine, 1, c + b * k * D, lab + b * N,
                    inr + b, nit + b);
  } else {
    for (int64_t b = 0; b < B; ++b) {
      // Split points across threads only when each thread gets a useful share.
      const int inner = threads_for(len[b] * D * k, kPassWorkPerThread);
      solve_problem(x + b * N * D, w + b * N, len[b], N, D, k, tol, iters, cosine, inner, c + b * k * D, lab + b * N,
                    inr + b, nit + b);
    }
  }
}

// ---- greedy k-means++ seeding (batched_kmeans' latency path) ---------------------------------------
//
// The reference (reference.kmeans_plus_plus) draws from one torch CPU generator: the first centre by
// torch.multinomial(w, 1) over the (B, N) weights, which draws q = empty_like(w).exponential_(1) and
// returns argmax(w / q); then each next step draws torch.rand((B, trials), float64).  Both are serial
// loops over 64-bit draws (two mt19937 outputs, the first the high word) of the mt19937 that
// manual_seed(seed) seeds with the low 32 bits of the seed, keeping the low 53 bits x 2^-53 = u:
// exponential_ returns -log1p(-u), rand returns u.  Drawing the same counts here in the same order gives
// the same values bit for bit (the kmeans tests check it against torch), so the picks follow the
// reference's generator.
uint64_t draw64(std::mt19937& engine) {
  const uint64_t hi = engine(), lo = engine();
  return ((hi << 32) | lo) & ((uint64_t{1} << 53) - 1);
}

void seeding_noise(uint32_t seed, int64_t n_exponential, double* exponential, int64_t n_uniform, double* uniform) {
  std::mt19937 engine(seed);
  for (int64_t i = 0; i < n_exponential; ++i)
    exponential[i] = -std::log1p(-static_cast<double>(draw64(engine)) * 0x1p-53);
  for (int64_t i = 0; i < n_uniform; ++i) uniform[i] = static_cast<double>(draw64(engine)) * 0x1p-53;
}

// Largest |x| of n floats into *amax; false when one is NaN or +-Inf.  One branch-free pass.
STREAMMEM_HOT bool largest_magnitude(const float* __restrict x, int64_t n, float* amax) {
  float top = 0.0f;
  int nonfinite = 0;
#pragma omp simd reduction(max : top) reduction(| : nonfinite)
  for (int64_t e = 0; e < n; ++e) {
    const float a = std::fabs(x[e]);
    nonfinite |= !(a <= std::numeric_limits<float>::max());
    top = a > top ? a : top;
  }
  *amax = top;
  return nonfinite == 0;
}

// torch.argmax of 1 / q over n entries (multinomial by equal weights): the first maximum.
int64_t first_draw(const double* q, int64_t n) {
  int64_t best = 0;
  double top = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    const double v = 1.0 / q[i];
    if (std::isnan(v)) return i;
    if (v > top || i == 0) {
      top = v;
      best = i;
    }
  }
  return best;
}

// ||a - b||^2 over n features: float32 differences and squares in four 8-lane accumulators per block of
// kAccumBlock features, the blocks added in float64.  Exactly 0 for a duplicate (the reference's
// expanded float32 form leaves rounding noise there); elsewhere within float32 rounding of it.
STREAMMEM_HOT double squared_distance(const float* __restrict a, const float* __restrict b, int64_t n) {
  double total = 0.0;
  for (int64_t d0 = 0; d0 < n; d0 += kAccumBlock) {
    const int64_t d1 = std::min(n, d0 + kAccumBlock);
    v8f s0 = {}, s1 = {}, s2 = {}, s3 = {};
    int64_t d = d0;
    for (; d + 32 <= d1; d += 32) {
      const v8f e0 = simd::load8(a + d) - simd::load8(b + d), e1 = simd::load8(a + d + 8) - simd::load8(b + d + 8);
      const v8f e2 = simd::load8(a + d + 16) - simd::load8(b + d + 16);
      const v8f e3 = simd::load8(a + d + 24) - simd::load8(b + d + 24);
      s0 += e0 * e0;
      s1 += e1 * e1;
      s2 += e2 * e2;
      s3 += e3 * e3;
    }
    float block = simd::lanes_sum((s0 + s1) + (s2 + s3));
    for (; d < d1; ++d) {
      const float e = a[d] - b[d];
      block += e * e;
    }
    total += block;
  }
  return total;
}

// The first index whose running sum exceeds target (std::upper_bound), at most n - 1.
int64_t inverse_cdf(const std::vector<double>& running, double target) {
  const auto it = std::upper_bound(running.begin(), running.end(), target);
  return std::min<int64_t>(it - running.begin(), static_cast<int64_t>(running.size()) - 1);
}

// Greedy k-means++ of one unweighted problem (reference.kmeans_plus_plus, metric l2): the first pick
// from the N exponentials at `first`, step s's `trials` uniforms at uniform[(s - 1) * stride].  Running
// sums and potentials are float64, summed in point order.  Scratch: three rows of N (the nearest distances,
// the best candidate's and the current candidate's), whatever the number of trials.
void seed_problem(const float* x, int64_t N, int64_t D, int64_t k, int64_t trials, const double* first,
                  const double* uniform, int64_t stride, float* centres) {
  std::vector<double> nearest(static_cast<size_t>(N)), running(static_cast<size_t>(N));
  std::vector<double> best_row(static_cast<size_t>(N)), row(static_cast<size_t>(N));
  const int64_t pick = first_draw(first, N);
  std::memcpy(centres, x + pick * D, sizeof(float) * D);
  for (int64_t i = 0; i < N; ++i) nearest[i] = squared_distance(x + i * D, centres, D);
  for (int64_t s = 1; s < k; ++s) {
    double total = 0.0;
    for (int64_t i = 0; i < N; ++i) running[i] = total += nearest[i];
    if (!(total > 0.0)) {  // every point on a chosen centre: draw by weight (all 1) again
      for (int64_t i = 0; i < N; ++i) running[i] = static_cast<double>(i + 1);
      total = static_cast<double>(N);
    }
    const double* u = uniform + (s - 1) * stride;
    int64_t best = -1;
    double best_potential = 0.0;
    for (int64_t t = 0; t < trials; ++t) {
      const int64_t candidate = inverse_cdf(running, u[t] * total);
      const float* c = x + candidate * D;
      double potential = 0.0;
      for (int64_t i = 0; i < N; ++i) {
        row[i] = std::min(nearest[i], squared_distance(x + i * D, c, D));
        potential += row[i];
      }
      if (best < 0 || potential < best_potential) {  // the first candidate on ties, as torch.argmin
        best_potential = potential;
        best = candidate;
        best_row.swap(row);
      }
    }
    nearest.swap(best_row);
    std::memcpy(centres + s * D, x + best * D, sizeof(float) * D);
  }
}

// (B, N, D) of a points view of rank 2 (one problem) or 3.
void points_shape(const TensorView& points, const char* entry, int64_t* B, int64_t* N, int64_t* D) {
  expect(points.ndim == 2 || points.ndim == 3, entry, "points must be (N, D) or (B, N, D)");
  expect_tensor(points, DType::kFloat32, points.ndim, entry, "points");
  *B = points.ndim == 3 ? points.size(0) : 1;
  *N = points.size(points.ndim - 2);
  *D = points.size(points.ndim - 1);
  expect(*B >= 1 && *N >= 1 && *D >= 1, entry, "points must be a non-empty block");
}

// `view` is a C-contiguous CPU tensor of `dtype` holding exactly `count` elements.
void expect_elements(const TensorView& view, DType dtype, int64_t count, const char* entry, const char* name) {
  if (view.on_cpu && view.dtype == dtype && view.contiguous() && view.numel() == count) return;
  broken_contract(entry, std::string(name) + " must be a C-contiguous CPU " + dtype_name(dtype) + " tensor of " +
                             std::to_string(count) + " elements");
}

// Greedy k-means++ seeds of every unweighted l2 problem into c (B, k, D): 1 when the points hold NaN/Inf, 2
// when a problem's largest magnitude lies outside [2^-40, 2^40] (the caller rescales it), nothing written then.
Status seed_all(const float* x, int64_t B, int64_t N, int64_t D, int64_t k, int64_t trials, uint32_t seed, float* c) {
  bool finite = true, in_range = true;
  for (int64_t b = 0; b < B && finite; ++b) {
    float amax = 0.0f;
    finite = largest_magnitude(x + b * N * D, N * D, &amax);
    if (amax != 0.0f && (amax < 0x1p-40f || amax > 0x1p40f)) in_range = false;
  }
  if (!finite) return 1;
  if (!in_range) return 2;
  // The reference's draws, in its order: (B, N) exponentials, then (B, trials) uniforms per step.
  std::vector<double> exponential(static_cast<size_t>(B * N)), uniform(static_cast<size_t>((k - 1) * B * trials));
  seeding_noise(seed, B * N, exponential.data(), (k - 1) * B * trials, uniform.data());
  for (int64_t b = 0; b < B; ++b)
    seed_problem(x + b * N * D, N, D, k, trials, exponential.data() + b * N, uniform.data() + b * trials, B * trials,
                 c + b * k * D);
  return kOk;
}

Status lloyd(TensorView points, std::optional<TensorView> weights, std::optional<TensorView> lengths,
             TensorView centroids, int64_t init_seed, int64_t n_local_trials, double tol, int64_t iters, bool cosine,
             TensorView labels, TensorView inertia, TensorView n_iter) {
  constexpr const char* entry = "lloyd";
  int64_t B, N, D;
  points_shape(points, entry, &B, &N, &D);
  // (B, k, D) centres, or (k, D) for the points of one problem given as (N, D).
  expect_tensor(centroids, DType::kFloat32, points.ndim, entry, "centroids");
  const int64_t k = centroids.size(centroids.ndim - 2);
  expect((points.ndim == 2 || centroids.size(0) == B) && centroids.size(centroids.ndim - 1) == D && k >= 1 && k <= N,
         entry, "centroids must be (B, k, D) (or (k, D) for (N, D) points) with 1 <= k <= N");
  expect(iters >= 1 && iters <= std::numeric_limits<int>::max() && tol >= 0.0, entry, "iters >= 1 and tol >= 0");
  expect(init_seed <= 0xFFFFFFFFLL, entry, "init_seed must be a 32-bit generator seed, or negative");
  expect(init_seed < 0 || (!weights && !lengths && !cosine), entry,
         "k-means++ seeding here is for unweighted l2 problems of N points each");
  expect(init_seed < 0 || (n_local_trials >= 1 && n_local_trials <= std::numeric_limits<int32_t>::max()), entry,
         "n_local_trials must be >= 1");
  expect_elements(labels, DType::kInt64, B * N, entry, "labels");
  expect_elements(n_iter, DType::kInt64, B, entry, "n_iter");
  const bool inertia64 = inertia.dtype == DType::kFloat64;
  expect_elements(inertia, inertia64 ? DType::kFloat64 : DType::kFloat32, B, entry, "inertia");
  std::vector<float> ones;
  const float* w;
  if (weights) {
    expect_elements(*weights, DType::kFloat32, B * N, entry, "weights");
    w = weights->ptr<const float>();
  } else {
    ones.assign(static_cast<size_t>(B * N), 1.0f);
    w = ones.data();
  }
  std::vector<int64_t> all;
  const int64_t* len;
  if (lengths) {
    expect_elements(*lengths, DType::kInt64, B, entry, "lengths");
    len = lengths->ptr<const int64_t>();
  } else {
    all.assign(static_cast<size_t>(B), N);
    len = all.data();
  }
  const float* x = points.ptr<const float>();
  float* c = centroids.ptr<float>();
  std::vector<float> inertia32(static_cast<size_t>(B));
  {
    py::gil_scoped_release nogil;
    if (init_seed >= 0) {
      const Status seeded = seed_all(x, B, N, D, k, n_local_trials, static_cast<uint32_t>(init_seed), c);
      if (seeded != kOk) return seeded;
    }
    solve_all(x, w, len, B, N, D, k, tol, static_cast<int>(iters), cosine, c, labels.ptr<int64_t>(), inertia32.data(),
              n_iter.ptr<int64_t>());
  }
  // The inertia is the float32 rounding of the float64 sum (the custom op's float32 result); a float64
  // output holds that value widened, which is what batched_kmeans returns.
  for (int64_t b = 0; b < B; ++b) {
    if (inertia64)
      inertia.ptr<double>()[b] = inertia32[b];
    else
      inertia.ptr<float>()[b] = inertia32[b];
  }
  return kOk;
}

Status seeding_noise_entry(int64_t seed, TensorView exponential, TensorView uniform) {
  constexpr const char* entry = "seeding_noise";
  expect_tensor(exponential, DType::kFloat64, 1, entry, "exponential");
  expect_tensor(uniform, DType::kFloat64, 1, entry, "uniform");
  expect(seed >= 0 && seed <= 0xFFFFFFFFLL, entry, "seed must be a 32-bit generator seed");
  seeding_noise(static_cast<uint32_t>(seed), exponential.size(0), exponential.ptr<double>(), uniform.size(0),
                uniform.ptr<double>());
  return kOk;
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_kmeans, m) {
  namespace py = pybind11;
  m.doc() = "Batched Lloyd k-means (fused assign + accumulate CPU kernel); see streammem_kernels/kmeans/reference.py";
  m.def("lloyd", &streammem::lloyd, py::arg("points"), py::arg("weights"), py::arg("lengths"), py::arg("centroids"),
        py::arg("init_seed"), py::arg("n_local_trials"), py::arg("tol"), py::arg("iters"), py::arg("cosine"),
        py::arg("labels"), py::arg("inertia"), py::arg("n_iter"),
        "Lloyd from the centroids given (init_seed < 0) or from greedy k-means++ seeds (init_seed >= 0), centroids "
        "updated in place -> labels, inertia, n_iter; status 1: NaN/Inf points, 2: a problem needs rescaling "
        "(seeding only)");
  m.def("seeding_noise", &streammem::seeding_noise_entry, py::arg("seed"), py::arg("exponential"), py::arg("uniform"),
        "torch's CPU exponential_(1), then rand(float64), draws of a generator seeded with seed (tests); status 0");
}
