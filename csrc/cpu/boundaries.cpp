// Depth-score event boundaries, CPU kernels (OpenMP over streams).
//
// Contract (streammem_kernels/boundaries.py is the spec):
//   adjacent_cosine(x (B,T,D) float32)                       -> (B,T-1) float32
//   depth_scores(sim (B,M) float32, peak)                     -> (B,M) float64
//   window_choices(sim (B,M), window, tau, min_depth, peak)   -> (B,M-window+1) int64
//   scan_events(sims (B,M), choices (B,P), window, max_event, drift) -> (B,M+1) uint8
//
// adjacent_cosine is one pass over the features: frame t+1's squared norm and
// its dot with frame t are accumulated in the same loop (frame t is still in L1),
// in double with a fixed lane layout, so a pair gives bit-identical results
// whether it comes from an offline (B,T,D) block or a streaming (B,2,D) pair.
// The decisions run in double with FMA contraction off, in the same operation
// order as the torch reference, so backends agree exactly.
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace streammem {

// Largest analysis window (boundaries.MAX_WINDOW in Python).
constexpr int64_t kMaxWindow = int64_t{1} << 16;
namespace {

constexpr int kLanes = 16;  // floats per step of the similarity pass (four 4-wide double accumulators)
// Below this much work (multiply-adds, window steps or scan steps) a parallel
// region costs more than it saves: waking the thread team takes microseconds
// on an idle machine and milliseconds on a busy one, which would dominate a
// streaming push of one frame or the cheap decision and scan passes.
constexpr int64_t kParallelWork = int64_t(1) << 18;

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
#pragma omp parallel for schedule(static) if (B * M * D >= kParallelWork)
  for (int64_t item = 0; item < B * chunks; ++item) {
    const int64_t s = item / chunks, c = item % chunks;
    const int64_t t0 = c * per, t1 = std::min(M, t0 + per);
    if (t0 < t1) cosine_run(x + s * T * D, D, t0, t1, o + s * M);
  }
}

py::array_t<float> adjacent_cosine(carray<float> features) {
  require(features.ndim() == 3, "features must be (B, T, D)");
  const int64_t B = features.shape(0), T = features.shape(1), D = features.shape(2);
  const int64_t M = std::max<int64_t>(T - 1, 0);
  py::array_t<float> out({B, M});
  adjacent_cosine_into(features.data(), B, T, D, out.mutable_data());
  return out;
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

// The window rule on one full window of `w` similarities: relative index or -1.
int64_t window_choice(const float* s, int64_t w, double tau, double min_depth, int peak, double* scratch) {
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
  return best;
}

py::array_t<double> depth_scores(carray<float> sim, int peak) {
  require(sim.ndim() == 2, "sim must be (B, M)");
  require(peak == 0 || peak == 1, "peak must be 0 (climb) or 1 (max)");
  const int64_t B = sim.shape(0), M = sim.shape(1);
  py::array_t<double> out({B, M});
  const float* s = sim.data();
  double* o = out.mutable_data();
  if (M == 0) return out;
  py::gil_scoped_release release;
#pragma omp parallel if (B * M >= kParallelWork)
  {
    std::vector<double> scratch(2 * M);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; ++b) depth_row(s + b * M, M, peak, scratch.data(), scratch.data() + M, o + b * M);
  }
  return out;
}

// Window choices of every full window of (B, M) similarities into `o` (B, M - window + 1).
void window_choices_into(const float* s, int64_t B, int64_t M, int64_t window, double tau, double min_depth,
                         int peak, int64_t* o) {
  const int64_t P = std::max<int64_t>(M - window + 1, 0);
  if (P == 0 || B == 0) return;
  py::gil_scoped_release release;
#pragma omp parallel if (B * P * window >= kParallelWork)
  {
    std::vector<double> scratch(3 * window);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < B * P; ++item) {
      const int64_t b = item / P, p = item % P;
      o[item] = window_choice(s + b * M + p, window, tau, min_depth, peak, scratch.data());
    }
  }
}

py::array_t<int64_t> window_choices(carray<float> sim, int64_t window, double tau, double min_depth, int peak) {
  require(sim.ndim() == 2, "sim must be (B, M)");
  require(window >= 2 && window <= kMaxWindow, "window must lie in [2, 65536]");
  require(peak == 0 || peak == 1, "peak must be 0 (climb) or 1 (max)");
  const int64_t B = sim.shape(0), M = sim.shape(1);
  const int64_t P = std::max<int64_t>(M - window + 1, 0);
  py::array_t<int64_t> out({B, P});
  window_choices_into(sim.data(), B, M, window, tau, min_depth, peak, out.mutable_data());
  return out;
}

// One streaming push for B streams, updating the segmenter's state in place
// (boundaries.py's StreamingSegmenter.push is the spec).  The similarity comes
// from pair_terms like the offline pass (same bits); the window rule is
// window_choice on the window's similarities, oldest first.  Returns the closed
// events as (K, 3) int64 rows (stream, start, end), sorted by stream then start.
// One streaming push for B streams (the fused form of StreamingSegmenter._step): the state
// arrays are updated in place.  Checks the frames first: a frame's squared norm, summed in
// double, is finite exactly when the frame holds no NaN/Inf (squares of float32 values cannot
// overflow a double sum), so the check is the norm pass the similarity needs anyway; on a
// non-finite frame nothing is updated and ValueError names `features`.
py::array_t<int64_t> stream_step_core(const float* x, int64_t B, int64_t D, float* last, double* norm, float* sims,
                                      int64_t* in_window, int64_t* ends, int64_t t, int64_t window, double tau,
                                      double min_depth, int peak, int64_t max_event, double drift) {
  require(B >= 1 && D >= 1 && window >= 2, "stream_step: bad sizes");
  const bool drift_mode = drift == drift;
  // Up to two events per stream: a window/drift cut and a max_event close.
  std::vector<int64_t> found(B * 6, -1);
  std::vector<double> terms(2 * B);
  int bad = 0;
  {
    py::gil_scoped_release release;
#pragma omp parallel if (B * D >= kParallelWork)
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
          int64_t* ev = found.data() + b * 6;
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
                  const int64_t c = window_choice(buf, window, tau, min_depth, peak, scratch.data());
                  if (c >= 0) {
                    const int64_t boundary = t - window + c;
                    ev[0] = ends[b] + 1;
                    ev[1] = boundary;
                    ends[b] = boundary;
                    fiw = t - boundary;
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
  require(!bad, "features must be finite, found NaN or Inf");
  int64_t K = 0;
  for (int64_t b = 0; b < B; ++b) K += (found[b * 6] >= 0) + (found[b * 6 + 2] >= 0);
  py::array_t<int64_t> out({K, int64_t(3)});
  int64_t* o = out.mutable_data();
  for (int64_t b = 0; b < B; ++b) {
    for (int k = 0; k < 2; ++k) {
      if (found[b * 6 + 2 * k] >= 0) {
        *o++ = b;
        *o++ = found[b * 6 + 2 * k];
        *o++ = found[b * 6 + 2 * k + 1];
      }
    }
  }
  return out;
}

py::array_t<int64_t> stream_step(carray<float> frame, carray<float> last_frame, carray<double> last_norm,
                                 carray<float> window_sims, carray<int64_t> frames_in_window,
                                 carray<int64_t> last_end, int64_t t, int64_t window, double tau, double min_depth,
                                 int peak, int64_t max_event, double drift) {
  require(frame.ndim() == 2 && last_frame.ndim() == 2, "frames must be (B, D)");
  // Bounded before the per-thread scratch below is allocated: an allocation failure inside an
  // OpenMP region cannot be caught and aborts the process.
  require(window >= 2 && window <= kMaxWindow, "window must lie in [2, 65536]");
  const int64_t B = frame.shape(0), D = frame.shape(1);
  require(last_frame.shape(0) == B && last_frame.shape(1) == D && last_norm.shape(0) == B &&
              frames_in_window.shape(0) == B && last_end.shape(0) == B,
          "stream_step: state must match the frames' (B, D)");
  require(window_sims.shape(0) == B && window_sims.shape(1) == window, "window_sims must be (B, window)");
  return stream_step_core(frame.data(), B, D, last_frame.mutable_data(), last_norm.mutable_data(),
                          window_sims.mutable_data(), frames_in_window.mutable_data(), last_end.mutable_data(), t,
                          window, tau, min_depth, peak, max_event, drift);
}

// The per-push fast path of StreamingSegmenter.push: the state's data pointers (C-contiguous CPU
// tensors the segmenter owns and keeps alive, laid out as stream_step's) and parameters come
// first so that Python binds them once (functools.partial); each push passes the frame's
// pointer ((B, D) float32, C-contiguous) and the frame index.
py::array_t<int64_t> stream_step_ptr(std::uintptr_t last, std::uintptr_t norm, std::uintptr_t sims,
                                     std::uintptr_t in_window, std::uintptr_t ends, int64_t B, int64_t D,
                                     int64_t window, double tau, double min_depth, int peak, int64_t max_event,
                                     double drift, std::uintptr_t frame, int64_t t) {
  return stream_step_core(in_ptr<float>(frame), B, D, reinterpret_cast<float*>(last),
                          reinterpret_cast<double*>(norm), reinterpret_cast<float*>(sims),
                          reinterpret_cast<int64_t*>(in_window), reinterpret_cast<int64_t*>(ends), t, window, tau,
                          min_depth, peak, max_event, drift);
}

}  // namespace

#pragma GCC pop_options

namespace {

// The streaming state machine over all frames of each stream (boundaries.py's
// _scan_events_torch is the spec).  drift is NaN outside drift mode.
// (B, T) event-end flags from (B, T-1) similarities and (B, P) window choices (P unused in drift mode).
void scan_events_into(const float* s, const int64_t* ch, int64_t B, int64_t M, int64_t P, int64_t window,
                      int64_t max_event, double drift, uint8_t* o) {
  const int64_t T = M + 1;
  const bool drift_mode = drift == drift;
  py::gil_scoped_release release;
#pragma omp parallel for schedule(static) if (B * T >= kParallelWork)
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

// The streaming state machine over all frames of each stream (boundaries.py's
// _scan_events_torch is the spec).  drift is NaN outside drift mode.
py::array_t<uint8_t> scan_events(carray<float> sims, carray<int64_t> choices, int64_t window, int64_t max_event,
                                 double drift) {
  require(sims.ndim() == 2 && choices.ndim() == 2, "sims and choices must be 2-d");
  const int64_t B = sims.shape(0), M = sims.shape(1), T = M + 1;
  const int64_t P = choices.shape(1);
  const bool drift_mode = drift == drift;
  require(drift_mode || P == std::max<int64_t>(M - window + 1, 0), "choices must be (B, M - window + 1)");
  py::array_t<uint8_t> out({B, T});
  scan_events_into(sims.data(), choices.data(), B, M, P, window, max_event, drift, out.mutable_data());
  return out;
}

// The whole offline pass (detect_boundaries' fast path on C-contiguous float32 CPU features): the
// cosines, the finiteness check, the window choices and the scan of adjacent_cosine, window_choices
// and scan_events above, so the events are those of the three calls.  A non-finite frame raises
// ValueError naming `features` (a NaN/Inf input makes its pair's cosine NaN; a single frame is
// scanned).  Returns the events as (K, 3) int64 rows (stream, start, end) sorted by (stream, start).
py::array_t<int64_t> detect_events_ptr(std::uintptr_t features, int64_t B, int64_t T, int64_t D, int64_t window,
                                       double tau, double min_depth, int peak, int64_t max_event, double drift) {
  require(B >= 1 && T >= 1 && D >= 1, "features must be a non-empty (B, T, D) block");
  require(window >= 2 && window <= kMaxWindow, "window must lie in [2, 65536]");
  require(peak == 0 || peak == 1, "peak must be 0 (climb) or 1 (max)");
  const float* x = in_ptr<float>(features);
  const int64_t M = T - 1;
  const bool drift_mode = drift == drift;
  const int64_t P = drift_mode ? 0 : std::max<int64_t>(M - window + 1, 0);
  std::vector<float> sims(B * M);
  std::vector<int64_t> choices(B * P);
  std::vector<uint8_t> ends(B * T);
  bool finite = true;
  if (M == 0) {
    for (int64_t i = 0; i < B * D; ++i) finite &= std::isfinite(x[i]);
  } else {
    adjacent_cosine_into(x, B, T, D, sims.data());
    for (float v : sims) finite &= std::isfinite(v);
  }
  require(finite, "features must be finite, found NaN or Inf");
  if (!drift_mode) window_choices_into(sims.data(), B, M, window, tau, min_depth, peak, choices.data());
  scan_events_into(sims.data(), choices.data(), B, M, P, window, max_event, drift, ends.data());
  int64_t K = 0;
  for (uint8_t e : ends) K += e;
  py::array_t<int64_t> out({K, int64_t{3}});
  int64_t* o = out.mutable_data();
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (!ends[b * T + t]) continue;
      o[0] = b;
      o[1] = start;
      o[2] = t;
      o += 3;
      start = t + 1;
    }
  }
  return out;
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_boundaries, m) {
  namespace py = pybind11;
  m.doc() = "Depth-score event boundaries (CPU kernels); see streammem_kernels/boundaries.py";
  m.def("adjacent_cosine", &streammem::adjacent_cosine, py::arg("features"),
        "(B,T,D) float32 -> (B,T-1) float32 adjacent cosine similarities");
  m.def("depth_scores", &streammem::depth_scores, py::arg("sim"), py::arg("peak"),
        "(B,M) float32 -> (B,M) float64 depth scores (peak 0 = climb, 1 = max)");
  m.def("window_choices", &streammem::window_choices, py::arg("sim"), py::arg("window"), py::arg("tau"),
        py::arg("min_depth"), py::arg("peak"), "(B,M) -> (B,M-window+1) int64 window-relative choice or -1");
  m.def("stream_step", &streammem::stream_step, py::arg("frame"), py::arg("last_frame"), py::arg("last_norm"),
        py::arg("window_sims"), py::arg("frames_in_window"), py::arg("last_end"), py::arg("t"), py::arg("window"),
        py::arg("tau"), py::arg("min_depth"), py::arg("peak"), py::arg("max_event"), py::arg("drift"),
        "one streaming push for B streams, state updated in place -> (K,3) int64 (stream, start, end)");
  m.def("stream_step_ptr", &streammem::stream_step_ptr, py::arg("last_frame"), py::arg("last_norm"),
        py::arg("window_sims"), py::arg("frames_in_window"), py::arg("last_end"), py::arg("num_streams"),
        py::arg("dim"), py::arg("window"), py::arg("tau"), py::arg("min_depth"), py::arg("peak"),
        py::arg("max_event"), py::arg("drift"), py::arg("frame"), py::arg("t"),
        "stream_step on raw pointers (state first, then the frame's pointer and t) -> (K,3) int64");
  m.def("scan_events", &streammem::scan_events, py::arg("sims"), py::arg("choices"), py::arg("window"),
        py::arg("max_event"), py::arg("drift"), "sequential event scan -> (B,M+1) uint8 event ends");
  m.def("detect_events_ptr", &streammem::detect_events_ptr, py::arg("features"), py::arg("num_streams"),
        py::arg("num_frames"), py::arg("dim"), py::arg("window"), py::arg("tau"), py::arg("min_depth"),
        py::arg("peak"), py::arg("max_event"), py::arg("drift"),
        "the offline pass on a C-contiguous (B,T,D) float32 pointer, features checked -> (K,3) int64 events");
}
