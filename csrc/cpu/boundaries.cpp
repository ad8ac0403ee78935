// Depth-score event boundaries, CPU kernels (OpenMP over streams).
//
// Entries (the border of csrc/cpu/tensor_view.h; the spec is streammem_kernels/boundaries/reference.py).
// Every tensor is a C-contiguous CPU tensor the caller validated and, for outputs, allocated:
//   adjacent_cosine(features (B, T, D) float32, out (B, T-1) float32) -> Status (always 0; NaN marks a pair
//                   holding NaN/Inf, the caller raises)
//   depth_scores(sim (B, M) or (M,) float32, peak, out of sim's shape, float64 or float32 (rounded once))
//                -> Status; 1: sim holds NaN or Inf
//   window_choices(sim (B, M) float32, window, tau, min_depth, peak, out (B, M-window+1) int64, flash = 0)
//                   -> Status (0); a choice is j >= 0 (boundary), -1 (none) or -2 - r (a transient ending at r)
//   scan_events(sims (B, M) float32, choices (B, P) int64, window, max_event, drift, ends (B, M+1) bool)
//                   -> Status (0)
//   event_ends(features (B, T, D) or (T, D) float32, window, tau, min_depth, peak, max_event, drift,
//              ends (B, T) bool, or flat, flash = 0) -> Status
//       the three passes above fused (the offline pass);  1: features hold NaN or Inf.
//   stream_step(last_frame (B, D) float32, last_norm (B,) float64, window_sims (B, window) float32,
//               frames_in_window (B,) int64, last_end (B,) int64, events (2B, 3) int64, num_events (1,) int64,
//               window, tau, min_depth, peak, max_event, drift, flash, frame (B, D) (or (D,)) float32, t) -> Status
//       one push for B streams, the state updated in place, the closed events written as rows
//       (stream, start, end) sorted by stream then start, their number in num_events;
//       1: the frame holds NaN or Inf (nothing is updated).  The state and parameters come first so that
//       the segmenter binds them once.
// peak: 0 = climb, 1 = max; max_event: 0 = none; drift: NaN outside drift mode; flash: 0 = no flash rule
// (the callers pass the resolved value, at most (window - 1) / 2).
//
// adjacent_cosine is one pass over the features: frame t+1's squared norm and
// its dot with frame t are accumulated in the same loop (frame t is still in L1),
// in double with a fixed lane layout, so a pair gives bit-identical results
// whether it comes from an offline (B,T,D) block or a streaming (B,2,D) pair.
// The decisions run in double with FMA contraction off, in the same operation
// order as the torch reference, so backends agree exactly.
#include "common.h"
#include "tensor_view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace streammem {

// Largest analysis window (MAX_WINDOW in streammem_kernels/boundaries/reference.py).
constexpr int64_t kMaxWindow = int64_t{1} << 16;
namespace {

constexpr int kLanes = 16;  // floats per step of the similarity pass (four 4-wide double accumulators)
// Below this much work (multiply-adds, window steps or scan steps) a parallel
// region costs more than it saves: waking the thread team takes microseconds
// on an idle machine and milliseconds on a busy one, which would dominate a
// streaming push of one frame or the cheap decision and scan passes.
constexpr int64_t kParallelWork = int64_t(1) << 18;
// depth_scores of at most this many similarities run inline on the caller's stack.
constexpr int64_t kSmallDepth = 256;

// `view` is a C-contiguous CPU tensor of `dtype` with exactly the sizes `sizes` (the caller's promise).
void expect_sizes(const TensorView& view, DType dtype, std::initializer_list<int64_t> sizes, const char* entry,
                  const char* name) {
  expect_tensor(view, dtype, static_cast<int>(sizes.size()), entry, name);
  int d = 0;
  for (int64_t size : sizes) {
    if (view.size(d) != size)
      broken_contract(entry, std::string(name) + " has the wrong size in dimension " + std::to_string(d));
    ++d;
  }
}

// The default (pre-AVX) clone passes these 32-byte vectors differently; they
// never cross a translation unit, so the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float f32x4 __attribute__((vector_size(16), aligned(4), may_alias));  // unaligned loads
typedef double f64x4 __attribute__((vector_size(32)));

inline f64x4 widen(const float* p) { return __builtin_convertvector(*reinterpret_cast<const f32x4*>(p), f64x4); }

inline double lanes_sum(f64x4 v0, f64x4 v1, f64x4 v2, f64x4 v3) {
  const f64x4 v = (v0 + v1) + (v2 + v3);  // fixed order, independent of the caller
  return (v[0] + v[1]) + (v[2] + v[3]);
}

// dot(a, b) and |b|^2 accumulated in double: four 4-wide accumulators each
// (kLanes = 16 floats per step) held in registers, so the FMA latency is
// hidden; the tail goes through a zero-padded copy so every pair, whatever its
// context (offline block or streaming pair), runs the same instructions.
STREAMMEM_HOT __attribute__((noinline)) void pair_terms(const float* __restrict a, const float* __restrict b,
                                                        int64_t D, double* dot_out, double* nb_out) {
  f64x4 d0 = {}, d1 = {}, d2 = {}, d3 = {}, n0 = {}, n1 = {}, n2 = {}, n3 = {};
  auto step = [&](const float* pa, const float* pb) __attribute__((always_inline)) {
    const f64x4 x0 = widen(pa), x1 = widen(pa + 4), x2 = widen(pa + 8), x3 = widen(pa + 12);
    const f64x4 y0 = widen(pb), y1 = widen(pb + 4), y2 = widen(pb + 8), y3 = widen(pb + 12);
    d0 += x0 * y0;
    d1 += x1 * y1;
    d2 += x2 * y2;
    d3 += x3 * y3;
    n0 += y0 * y0;
    n1 += y1 * y1;
    n2 += y2 * y2;
    n3 += y3 * y3;
  };
  const int64_t body = D - D % kLanes;
  for (int64_t d = 0; d < body; d += kLanes) step(a + d, b + d);
  if (body < D) {  // zero-padded tail
    float ta[kLanes] = {}, tb[kLanes] = {};
    for (int64_t k = body; k < D; ++k) {
      ta[k - body] = a[k];
      tb[k - body] = b[k];
    }
    step(ta, tb);
  }
  *dot_out = lanes_sum(d0, d1, d2, d3);
  *nb_out = lanes_sum(n0, n1, n2, n3);
}

inline float cosine_from_terms(double dot, double na, double nb) {
  // Squares of float32 values cannot overflow a double sum, so a non-finite
  // term means a NaN/Inf input: report it as NaN (the caller raises).
  if (!std::isfinite(dot) || !std::isfinite(na) || !std::isfinite(nb)) return std::nanf("");
  if (!(na > 0.0) || !(nb > 0.0)) return 0.0f;
  const double c = dot / (std::sqrt(na) * std::sqrt(nb));
  return static_cast<float>(std::min(1.0, std::max(-1.0, c)));
}

// Cosines of the pairs (t, t+1) for t in [t0, t1) of one stream.
void cosine_run(const float* x, int64_t D, int64_t t0, int64_t t1, float* out) {
  double unused, na, nb, dot;
  pair_terms(x + t0 * D, x + t0 * D, D, &unused, &na);
  for (int64_t t = t0; t < t1; ++t) {
    pair_terms(x + t * D, x + (t + 1) * D, D, &dot, &nb);
    out[t] = cosine_from_terms(dot, na, nb);
    na = nb;
  }
}

// (B, T, D) contiguous features -> (B, T-1) cosines into `o`.
void adjacent_cosine_into(const float* x, int64_t B, int64_t T, int64_t D, float* o) {
  const int64_t M = std::max<int64_t>(T - 1, 0);
  if (M == 0) return;
  // Work items: (stream, time chunk); chunks only split a stream when there
  // are fewer streams than threads (each chunk recomputes one norm).
  const int64_t threads = max_threads();
  const int64_t chunks = B >= threads ? 1 : std::min<int64_t>(M, (threads + B - 1) / B);
  const int64_t per = (M + chunks - 1) / chunks;
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) num_threads(threads_for(B * M * D, kParallelWork))
  for (int64_t item = 0; item < B * chunks; ++item) {
    const int64_t s = item / chunks, c = item % chunks;
    const int64_t t0 = c * per, t1 = std::min(M, t0 + per);
    if (t0 < t1) cosine_run(x + s * T * D, D, t0, t1, o + s * M);
  }
}

Status adjacent_cosine(TensorView features, TensorView out) {
  constexpr const char* entry = "adjacent_cosine";
  expect_tensor(features, DType::kFloat32, 3, entry, "features");
  const int64_t B = features.size(0), T = features.size(1), D = features.size(2);
  expect_sizes(out, DType::kFloat32, {B, std::max<int64_t>(T - 1, 0)}, entry, "out");
  adjacent_cosine_into(features.ptr<const float>(), B, T, D, out.ptr<float>());
  return kOk;
}

}  // namespace

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

namespace {

// Depth scores of s[0..M-1] with peaks searched inside it; left/right are scratch.
void depth_row(const float* s, int64_t M, int peak, double* left, double* right, double* depth) {
  left[0] = s[0];
  for (int64_t i = 1; i < M; ++i) {
    const double v = s[i];
    if (peak == 0) left[i] = (static_cast<double>(s[i - 1]) >= v) ? left[i - 1] : v;
    else left[i] = std::max(left[i - 1], v);
  }
  right[M - 1] = s[M - 1];
  for (int64_t i = M - 2; i >= 0; --i) {
    const double v = s[i];
    if (peak == 0) right[i] = (static_cast<double>(s[i + 1]) >= v) ? right[i + 1] : v;
    else right[i] = std::max(right[i + 1], v);
  }
  for (int64_t i = 0; i < M; ++i) {
    const double v = s[i];
    depth[i] = 0.5 * ((left[i] - v) + (right[i] - v));
  }
}

// The window rule on one full window of `w` similarities: the decision as window_choices_torch encodes
// it (j >= 0 a boundary, -1 none, -2 - r a transient whose last edge is r).
int64_t window_choice(const float* s, int64_t w, double tau, double min_depth, int peak, int64_t flash,
                      double* scratch) {
  double* left = scratch;
  double* right = scratch + w;
  double* d = scratch + 2 * w;
  depth_row(s, w, peak, left, right, d);
  double total = 0.0, lo = d[0], hi = d[0];
  for (int64_t i = 0; i < w; ++i) {
    total = total + d[i];
    lo = std::min(lo, d[i]);
    hi = std::max(hi, d[i]);
  }
  if (!(hi > lo)) return -1;  // sigma = 0: every depth is equal
  const double mu = total / static_cast<double>(w);
  double sq = 0.0;
  for (int64_t i = 0; i < w; ++i) {
    const double diff = d[i] - mu;
    const double term = diff * diff;
    sq = sq + term;
  }
  const double sigma = std::sqrt(sq / static_cast<double>(w));
  const double spread = tau * sigma;
  const double threshold = mu + spread;
  int64_t best = -1;
  for (int64_t i = 0; i < w; ++i) {
    if (d[i] > threshold && d[i] > min_depth && (best < 0 || d[i] > d[best])) best = i;
  }
  if (best < 0 || flash == 0) return best;
  // The flash rule: decided once `flash` similarities follow the best candidate; a drop within
  // `flash` of it at least half as deep (below s_j + d_j / 2) makes it an edge of a transient.
  if (best > w - 1 - flash) return -1;
  const double half = 0.5 * d[best];
  const double level = static_cast<double>(s[best]) + half;
  int64_t last_edge = best;
  bool transient = false;
  for (int64_t i = std::max<int64_t>(0, best - flash); i <= std::min<int64_t>(w - 1, best + flash); ++i) {
    if (i != best && static_cast<double>(s[i]) < level) {
      transient = true;
      last_edge = std::max(last_edge, i);
    }
  }
  return transient ? -2 - last_edge : best;
}

Status depth_scores(TensorView sim, int64_t peak, TensorView out) {
  constexpr const char* entry = "depth_scores";
  expect(sim.ndim == 1 || sim.ndim == 2, entry, "sim must be (M,) or (B, M)");
  expect_tensor(sim, DType::kFloat32, sim.ndim, entry, "sim");
  expect(peak == 0 || peak == 1, entry, "peak must be 0 (climb) or 1 (max)");
  const int64_t B = sim.ndim == 2 ? sim.size(0) : 1, M = sim.size(sim.ndim - 1);
  const bool single = out.dtype == DType::kFloat32;  // the float64 depths rounded once, as .to(float32)
  const DType out_dtype = single ? DType::kFloat32 : DType::kFloat64;
  if (sim.ndim == 2)
    expect_sizes(out, out_dtype, {B, M}, entry, "out");
  else
    expect_sizes(out, out_dtype, {M}, entry, "out");
  const float* s = sim.ptr<const float>();
  if (M == 0) return kOk;
  // The values are checked in a pass of their own, so that a latency path can hand its input over
  // unchecked: x - x is 0 for finite x and NaN for NaN/Inf.
  float spread = 0.f;
  for (int64_t i = 0; i < B * M; ++i) spread += s[i] - s[i];
  if (!(spread == 0.f)) return 1;
  auto row = [&](int64_t b, double* left, double* right, double* depth) {
    double* o = single ? depth : out.ptr<double>() + b * M;
    depth_row(s + b * M, M, static_cast<int>(peak), left, right, o);
    if (single)
      for (int64_t i = 0; i < M; ++i) out.ptr<float>()[b * M + i] = static_cast<float>(depth[i]);
  };
  if (B * M <= kSmallDepth) {
    // A segmenter's window: no thread, no GIL hand-over, no allocation.
    double left[kSmallDepth], right[kSmallDepth], depth[kSmallDepth];
    for (int64_t b = 0; b < B; ++b) row(b, left, right, depth);
    return kOk;
  }
  py::gil_scoped_release release;
#pragma omp parallel num_threads(threads_for(B * M, kParallelWork))
  {
    std::vector<double> scratch(3 * M);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; ++b) row(b, scratch.data(), scratch.data() + M, scratch.data() + 2 * M);
  }
  return kOk;
}

// Window choices of every full window of (B, M) similarities into `o` (B, M - window + 1).
void window_choices_into(const float* s, int64_t B, int64_t M, int64_t window, double tau, double min_depth,
                         int peak, int64_t flash, int64_t* o) {
  const int64_t P = std::max<int64_t>(M - window + 1, 0);
  if (P == 0 || B == 0) return;
  py::gil_scoped_release release;
#pragma omp parallel num_threads(threads_for(B * P * window, kParallelWork))
  {
    std::vector<double> scratch(3 * window);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < B * P; ++item) {
      const int64_t b = item / P, p = item % P;
      o[item] = window_choice(s + b * M + p, window, tau, min_depth, peak, flash, scratch.data());
    }
  }
}

Status window_choices(TensorView sim, int64_t window, double tau, double min_depth, int64_t peak, TensorView out,
                      int64_t flash) {
  constexpr const char* entry = "window_choices";
  expect_tensor(sim, DType::kFloat32, 2, entry, "sim");
  // Bounded before the per-thread scratch is allocated: an allocation failure inside an OpenMP
  // region cannot be caught and aborts the process.
  expect(window >= 2 && window <= kMaxWindow, entry, "window must lie in [2, 65536]");
  expect(peak == 0 || peak == 1, entry, "peak must be 0 (climb) or 1 (max)");
  expect(flash >= 0 && flash <= (window - 1) / 2, entry, "flash must lie in [0, (window - 1) / 2]");
  const int64_t B = sim.size(0), M = sim.size(1);
  expect_sizes(out, DType::kInt64, {B, std::max<int64_t>(M - window + 1, 0)}, entry, "out");
  window_choices_into(sim.ptr<const float>(), B, M, window, tau, min_depth, static_cast<int>(peak), flash,
                      out.ptr<int64_t>());
  return kOk;
}

// One streaming push for B streams (the fused form of StreamingSegmenter._step, the spec): the
// similarity comes from pair_terms like the offline pass (same bits); the window rule is
// window_choice on the window's similarities, oldest first; the state is updated in place.  The
// frame is checked first: its squared norm, summed in double, is finite exactly when it holds no
// NaN/Inf (squares of float32 values cannot overflow a double sum), so the check is the norm pass
// the similarity needs anyway; on a non-finite frame nothing is updated (status 1).
Status stream_step(TensorView last_frame, TensorView last_norm, TensorView window_sims, TensorView frames_in_window,
                   TensorView last_end, TensorView events, TensorView num_events, int64_t window, double tau,
                   double min_depth, int64_t peak, int64_t max_event, double drift, int64_t flash, TensorView frame,
                   int64_t t) {
  constexpr const char* entry = "stream_step";
  expect_tensor(last_frame, DType::kFloat32, 2, entry, "last_frame");
  // Bounded before the per-thread scratch below is allocated: an allocation failure inside an
  // OpenMP region cannot be caught and aborts the process.
  expect(window >= 2 && window <= kMaxWindow, entry, "window must lie in [2, 65536]");
  expect(peak == 0 || peak == 1, entry, "peak must be 0 (climb) or 1 (max)");
  expect(flash >= 0 && flash <= (window - 1) / 2, entry, "flash must lie in [0, (window - 1) / 2]");
  const int64_t B = last_frame.size(0), D = last_frame.size(1);
  expect(B >= 1 && D >= 1 && t >= 0, entry, "the state must hold a non-empty (B, D) frame and t >= 0");
  // (B, D), or (D,) for a single stream.
  expect(frame.on_cpu && frame.dtype == DType::kFloat32 && frame.contiguous() && frame.numel() == B * D &&
             frame.ndim >= 1 && frame.size(frame.ndim - 1) == D,
         entry, "frame must be a C-contiguous float32 CPU (B, D) block like last_frame");
  expect_sizes(last_norm, DType::kFloat64, {B}, entry, "last_norm");
  expect_sizes(window_sims, DType::kFloat32, {B, window}, entry, "window_sims");
  expect_sizes(frames_in_window, DType::kInt64, {B}, entry, "frames_in_window");
  expect_sizes(last_end, DType::kInt64, {B}, entry, "last_end");
  expect_sizes(events, DType::kInt64, {2 * B, 3}, entry, "events");
  expect_sizes(num_events, DType::kInt64, {1}, entry, "num_events");
  const float* x = frame.ptr<const float>();
  float* last = last_frame.ptr<float>();
  double* norm = last_norm.ptr<double>();
  float* sims = window_sims.ptr<float>();
  int64_t* in_window = frames_in_window.ptr<int64_t>();
  int64_t* ends = last_end.ptr<int64_t>();
  const bool drift_mode = drift == drift;
  // Up to two events per stream: a window/drift cut and a max_event close.
  std::vector<int64_t> found(B * 4, -1);
  std::vector<double> terms(2 * B);
  int bad = 0;
  {
    py::gil_scoped_release release;
#pragma omp parallel num_threads(threads_for(B * D, kParallelWork))
    {
      std::vector<double> scratch(3 * window);
#pragma omp for schedule(static) reduction(| : bad)
      for (int64_t b = 0; b < B; ++b) {
        const float* v = x + b * D;
        pair_terms(t == 0 ? v : last + b * D, v, D, &terms[2 * b], &terms[2 * b + 1]);
        if (!std::isfinite(terms[2 * b + 1])) bad |= 1;
      }
      if (!bad) {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < B; ++b) {
          const float* v = x + b * D;
          float* prev = last + b * D;
          float* buf = sims + b * window;
          int64_t* ev = found.data() + b * 4;
          const double dot = terms[2 * b], nv = terms[2 * b + 1];
          int64_t fiw = std::min(in_window[b] + 1, window + 1);
          if (t > 0) {
            const float sim = cosine_from_terms(dot, norm[b], nv);
            if (fiw >= 2) {  // frame t-1 is after the last boundary
              if (drift_mode) {
                if (static_cast<double>(sim) < drift) {
                  ev[0] = ends[b] + 1;
                  ev[1] = t - 1;
                  ends[b] = t - 1;
                  fiw = 1;
                }
              } else {
                std::memmove(buf, buf + 1, sizeof(float) * (window - 1));
                buf[window - 1] = sim;
                if (fiw == window + 1) {
                  const int64_t c =
                      window_choice(buf, window, tau, min_depth, static_cast<int>(peak), flash, scratch.data());
                  if (c >= 0) {
                    const int64_t boundary = t - window + c;
                    ev[0] = ends[b] + 1;
                    ev[1] = boundary;
                    ends[b] = boundary;
                    fiw = t - boundary;
                  } else if (c <= -2) {  // a transient: the window restarts after its last edge, no event
                    fiw = t - (t - window + (-2 - c));
                  }
                }
              }
            }
          }
          if (max_event > 0 && t - ends[b] >= max_event) {
            ev[2] = ends[b] + 1;
            ev[3] = t;
            ends[b] = t;
            fiw = 0;
          }
          in_window[b] = fiw;
          norm[b] = nv;
          std::memcpy(prev, v, sizeof(float) * D);
        }
      }
    }
  }
  if (bad) return 1;
  // Up to two events per stream, slot 0 (window or drift rule) before slot 1 (max_event).
  int64_t* o = events.ptr<int64_t>();
  int64_t K = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int k = 0; k < 2; ++k) {
      if (found[b * 4 + 2 * k] >= 0) {
        o[3 * K] = b;
        o[3 * K + 1] = found[b * 4 + 2 * k];
        o[3 * K + 2] = found[b * 4 + 2 * k + 1];
        ++K;
      }
    }
  }
  *num_events.ptr<int64_t>() = K;
  return kOk;
}

}  // namespace

#pragma GCC pop_options

namespace {

// The streaming state machine over all frames of each stream, drift NaN outside drift mode:
// (B, T) event-end flags from (B, T-1) similarities and (B, P) window choices (P unused in drift mode).
void scan_events_into(const float* s, const int64_t* ch, int64_t B, int64_t M, int64_t P, int64_t window,
                      int64_t max_event, double drift, uint8_t* o) {
  const int64_t T = M + 1;
  const bool drift_mode = drift == drift;
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) num_threads(threads_for(B * T, kParallelWork))
  for (int64_t b = 0; b < B; ++b) {
    uint8_t* ends = o + b * T;
    const float* row = s + b * M;
    std::fill(ends, ends + T, 0);
    int64_t last_end = -1, in_window = 0;
    for (int64_t t = 0; t < T; ++t) {
      in_window = std::min(in_window + 1, window + 1);
      if (drift_mode) {
        if (t >= 1 && in_window >= 2 && static_cast<double>(row[t - 1]) < drift) {
          ends[t - 1] = 1;
          last_end = t - 1;
          in_window = 1;
        }
      } else if (t >= window && in_window == window + 1) {
        const int64_t c = ch[b * P + (t - window)];
        if (c >= 0) {
          const int64_t boundary = t - window + c;
          ends[boundary] = 1;
          last_end = boundary;
          in_window = t - boundary;
        } else if (c <= -2) {  // a transient: the window restarts after its last edge, no event
          in_window = t - (t - window + (-2 - c));
        }
      }
      if (max_event > 0 && t - last_end >= max_event) {
        ends[t] = 1;
        last_end = t;
        in_window = 0;
      }
    }
    if (T > 0) ends[T - 1] = 1;
  }
}

// The streaming state machine over all frames of each stream (scan_events_torch is the spec).
Status scan_events(TensorView sims, TensorView choices, int64_t window, int64_t max_event, double drift,
                   TensorView ends) {
  constexpr const char* entry = "scan_events";
  expect_tensor(sims, DType::kFloat32, 2, entry, "sims");
  expect_tensor(choices, DType::kInt64, 2, entry, "choices");
  const int64_t B = sims.size(0), M = sims.size(1), P = choices.size(1);
  const bool drift_mode = drift == drift;
  expect(choices.size(0) == B && (drift_mode || P == std::max<int64_t>(M - window + 1, 0)), entry,
         "choices must be (B, M - window + 1)");
  expect_sizes(ends, DType::kBool, {B, M + 1}, entry, "ends");
  scan_events_into(sims.ptr<const float>(), choices.ptr<const int64_t>(), B, M, P, window, max_event, drift,
                   ends.ptr<uint8_t>());
  return kOk;
}

// The whole offline pass: the cosines, their finiteness check, the window choices and the scan of
// adjacent_cosine, window_choices and scan_events above, so the ends are those of the three
// calls.  A NaN/Inf input makes its pair's cosine NaN (status 1); a single frame is scanned.
Status event_ends(TensorView features, int64_t window, double tau, double min_depth, int64_t peak, int64_t max_event,
                  double drift, TensorView ends, int64_t flash) {
  constexpr const char* entry = "event_ends";
  expect(features.ndim == 2 || features.ndim == 3, entry, "features must be (T, D) or (B, T, D)");
  expect_tensor(features, DType::kFloat32, features.ndim, entry, "features");
  expect(window >= 2 && window <= kMaxWindow, entry, "window must lie in [2, 65536]");
  expect(peak == 0 || peak == 1, entry, "peak must be 0 (climb) or 1 (max)");
  expect(flash >= 0 && flash <= (window - 1) / 2, entry, "flash must lie in [0, (window - 1) / 2]");
  const int64_t B = features.ndim == 3 ? features.size(0) : 1;
  const int64_t T = features.size(features.ndim - 2), D = features.size(features.ndim - 1);
  expect(B >= 1 && T >= 1 && D >= 1, entry, "features must be a non-empty block");
  expect(ends.on_cpu && ends.dtype == DType::kBool && ends.contiguous() && ends.numel() == B * T, entry,
         "ends must hold B * T contiguous bools");
  const float* x = features.ptr<const float>();
  const int64_t M = T - 1;
  const bool drift_mode = drift == drift;
  const int64_t P = drift_mode ? 0 : std::max<int64_t>(M - window + 1, 0);
  std::vector<float> sims(B * M);
  std::vector<int64_t> choices(B * P);
  bool finite = true;
  if (M == 0) {
    for (int64_t i = 0; i < B * D; ++i) finite &= std::isfinite(x[i]);
  } else {
    adjacent_cosine_into(x, B, T, D, sims.data());
    for (float v : sims) finite &= std::isfinite(v);
  }
  if (!finite) return 1;
  if (!drift_mode)
    window_choices_into(sims.data(), B, M, window, tau, min_depth, static_cast<int>(peak), flash, choices.data());
  scan_events_into(sims.data(), choices.data(), B, M, P, window, max_event, drift, ends.ptr<uint8_t>());
  return kOk;
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_boundaries, m) {
  namespace py = pybind11;
  m.doc() = "Depth-score event boundaries (CPU kernels); see streammem_kernels/boundaries/reference.py";
  m.def("adjacent_cosine", &streammem::adjacent_cosine, py::arg("features"), py::arg("out"),
        "(B,T,D) float32 -> out (B,T-1) float32 adjacent cosine similarities; status 0");
  m.def("depth_scores", &streammem::depth_scores, py::arg("sim"), py::arg("peak"), py::arg("out"),
        "(B,M) float32 -> out (B,M) float64 depth scores (peak 0 = climb, 1 = max); status 0");
  m.def("window_choices", &streammem::window_choices, py::arg("sim"), py::arg("window"), py::arg("tau"),
        py::arg("min_depth"), py::arg("peak"), py::arg("out"), py::arg("flash") = 0,
        "(B,M) -> out (B,M-window+1) int64 window-relative choice: j boundary, -1 none, -2-r transient; status 0");
  m.def("scan_events", &streammem::scan_events, py::arg("sims"), py::arg("choices"), py::arg("window"),
        py::arg("max_event"), py::arg("drift"), py::arg("ends"),
        "sequential event scan -> ends (B,M+1) bool; status 0");
  m.def("event_ends", &streammem::event_ends, py::arg("features"), py::arg("window"), py::arg("tau"),
        py::arg("min_depth"), py::arg("peak"), py::arg("max_event"), py::arg("drift"), py::arg("ends"),
        py::arg("flash") = 0, "the offline pass on (B,T,D) or (T,D) float32 features -> ends (B,T) bool; status 1: NaN/Inf features");
  m.def("stream_step", &streammem::stream_step, py::arg("last_frame"), py::arg("last_norm"), py::arg("window_sims"),
        py::arg("frames_in_window"), py::arg("last_end"), py::arg("events"), py::arg("num_events"), py::arg("window"),
        py::arg("tau"), py::arg("min_depth"), py::arg("peak"), py::arg("max_event"), py::arg("drift"),
        py::arg("flash"), py::arg("frame"), py::arg("t"),
        "one streaming push for B streams, state updated in place -> events (2B,3) int64 rows (stream, start, "
        "end), num_events (1,); status 1: NaN/Inf frame");
}
