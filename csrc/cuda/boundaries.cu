// Depth-score event boundaries: the fused streaming step in CUDA
// (contract: streammem_kernels/boundaries.py, "Semantics").
//
// Why CUDA here: a streaming push is tiny per stream (one adjacent cosine over
// D features, one decision over `window` similarities, three counters), so
// the tensor formulation of the torch/Triton step is about fifteen small
// launches per push and is launch-bound on a GPU.  This kernel is the C++
// backend's stream_step as one launch: one warp per stream reduces the dot
// product and both squared norms in float64 (lanes over the features), then
// lane 0 updates the window, decides, applies max_event and writes the
// stream's state and the events the push closed.
//
// Decisions are identical to the reference's: the similarity is summed in
// float64 and rounded once to float32, depth scores, mu and sigma are float64
// with the reference's left-to-right sums, no FMA contraction, IEEE sqrt and
// division.
// streammem-nvcc: --fmad=false
#include "common.cuh"

STREAMMEM_CUDA_MODULE_COMMON()

namespace streammem {

constexpr int kWarpsPerBlock = 4;

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// The window rule on one stream's `window` similarities (float32, oldest first), encoded as
// window_choices_torch does: j >= 0 a boundary, -1 none, -2 - r a transient whose last edge is r.
// `depth` is float64 scratch of `window`.  Not inlined: inlined into the kernel, ptxas spilled
// registers around the float64 division and square root (sm_80), and a spill-free build is the rule here.
__device__ __noinline__ int64_t window_choice(const float* __restrict__ s32, int window, double tau, double min_depth,
                                 int peak_code, int flash, double* __restrict__ depth) {
  // Left peaks into depth[], then the right sweep turns them into depth scores.
  double peak = static_cast<double>(s32[0]);
  double prev = peak;
  depth[0] = peak;
  for (int i = 1; i < window; ++i) {
    const double s = static_cast<double>(s32[i]);
    if (peak_code == 0)
      peak = (prev >= s) ? peak : s;  // climb: keep walking while the neighbour does not drop
    else
      peak = peak > s ? peak : s;
    prev = s;
    depth[i] = peak;
  }
  peak = static_cast<double>(s32[window - 1]);
  double next = peak;
  for (int i = window - 1; i >= 0; --i) {
    const double s = static_cast<double>(s32[i]);
    if (peak_code == 0)
      peak = (next >= s) ? peak : s;
    else
      peak = peak > s ? peak : s;
    next = s;
    depth[i] = 0.5 * ((depth[i] - s) + (peak - s));
  }
  double total = 0.0, hi = -INFINITY, lo = INFINITY;
  for (int i = 0; i < window; ++i) {
    total = total + depth[i];
    hi = depth[i] > hi ? depth[i] : hi;
    lo = depth[i] < lo ? depth[i] : lo;
  }
  const double mu = total / window;
  double sq = 0.0;
  for (int i = 0; i < window; ++i) sq = sq + (depth[i] - mu) * (depth[i] - mu);
  const double threshold = mu + tau * sqrt(sq / window);
  if (!(hi > lo)) return -1;  // sigma = 0: every depth equal, no candidate
  int64_t best_i = -1;
  double best = -1.0;
  for (int i = 0; i < window; ++i) {
    const double d = depth[i];
    if (d > threshold && d > min_depth && (best_i < 0 || d > best)) {  // strict: earliest on ties
      best = d;
      best_i = i;
    }
  }
  if (best_i < 0 || flash == 0) return best_i;
  // The flash rule: decided once `flash` similarities follow the best candidate; a drop within
  // `flash` of it at least half as deep (below s_j + d_j / 2) makes it an edge of a transient.
  if (best_i > window - 1 - flash) return -1;
  const double level = static_cast<double>(s32[best_i]) + 0.5 * best;
  int64_t last_edge = best_i;
  bool transient = false;
  const int lo_i = best_i - flash > 0 ? static_cast<int>(best_i) - flash : 0;
  const int hi_i = best_i + flash < window - 1 ? static_cast<int>(best_i) + flash : window - 1;
  for (int i = lo_i; i <= hi_i; ++i) {
    if (i != best_i && static_cast<double>(s32[i]) < level) {
      transient = true;
      last_edge = i > last_edge ? i : last_edge;
    }
  }
  return transient ? -2 - last_edge : best_i;
}

__global__ void __launch_bounds__(kWarpsPerBlock * 32) stream_step_kernel(
    const float* __restrict__ x, float* __restrict__ last_frame, float* __restrict__ window_sims,
    double* __restrict__ scratch, int64_t* __restrict__ frames_in_window, int64_t* __restrict__ last_end,
    int64_t* __restrict__ out_start, int64_t* __restrict__ out_end, int64_t B, int64_t D, int64_t t, int window,
    double tau, double min_depth, int peak_code, int64_t max_event, double drift, int drift_mode, int flash,
    int has_last) {
  const int64_t stream = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (stream >= B) return;
  const float* xs = x + stream * D;
  float* last = last_frame + stream * D;
  double dot = 0.0, na = 0.0, nb = 0.0;
  for (int64_t d = lane; d < D; d += 32) {
    const double a = static_cast<double>(last[d]);
    const double b = static_cast<double>(xs[d]);
    dot += a * b;
    na += a * a;
    nb += b * b;
    last[d] = xs[d];  // each lane reads its own elements before writing them
  }
  dot = warp_sum_f64(dot);
  na = warp_sum_f64(na);
  nb = warp_sum_f64(nb);
  if (lane != 0) return;

  int64_t fiw = frames_in_window[stream] + 1;
  if (fiw > window + 1) fiw = window + 1;
  int64_t le = last_end[stream];
  int64_t rule_start = -1, rule_end = -1, cap_start = -1, cap_end = -1;
  if (has_last) {
    const double norm_a = sqrt(na), norm_b = sqrt(nb);
    const bool nonzero = norm_a > 0.0 && norm_b > 0.0;
    double cos = dot / (nonzero ? norm_a * norm_b : 1.0);
    cos = nonzero ? (cos < -1.0 ? -1.0 : (cos > 1.0 ? 1.0 : cos)) : 0.0;
    const bool finite = isfinite(dot) && isfinite(norm_a) && isfinite(norm_b);
    const float sim = finite ? static_cast<float>(cos) : NAN;
    const bool in_window = fiw >= 2;  // frame t-1 is after the last boundary
    bool cut = false, restarts = false;
    int64_t boundary = -1, restart = -1;
    if (!drift_mode) {
      float* row = window_sims + stream * window;
      if (in_window) {
        for (int i = 0; i + 1 < window; ++i) row[i] = row[i + 1];
        row[window - 1] = sim;
      }
      const int64_t choice =
          window_choice(row, window, tau, min_depth, peak_code, flash, scratch + stream * window);
      cut = fiw == window + 1 && choice >= 0;
      boundary = t - window + choice;  // left frame of the chosen similarity
      // A transient (choice -2 - r) restarts the window after its last edge r, closing nothing.
      restarts = fiw == window + 1 && choice != -1;
      restart = choice <= -2 ? t - window + (-2 - choice) : boundary;
    } else {
      cut = in_window && static_cast<double>(sim) < drift;
      boundary = t - 1;
      restarts = cut;
      restart = boundary;
    }
    if (cut) {
      rule_start = le + 1;
      rule_end = boundary;
      le = boundary;
    }
    if (restarts) fiw = t - restart;
  }
  if (max_event > 0 && t - le >= max_event) {
    cap_start = le + 1;
    cap_end = t;
    le = t;
    fiw = 0;
  }
  frames_in_window[stream] = fiw;
  last_end[stream] = le;
  out_start[2 * stream] = rule_start;
  out_start[2 * stream + 1] = cap_start;
  out_end[2 * stream] = rule_end;
  out_end[2 * stream + 1] = cap_end;
}

}  // namespace streammem

// One push of B streams.  x (B, D) float32; state, updated in place: last_frame (B, D) float32,
// window_sims (B, window) float32, frames_in_window (B,) int64, last_end (B,) int64; scratch (B, window)
// float64.  Outputs: start, end (B, 2) int64 (slot 0: window/drift rule, slot 1: max_event; -1: none).
// t is the frame index of this push; max_event 0 means none; drift_mode 0 ignores `drift`; flash 0 turns the
// flash rule off (else at most (window - 1) / 2).
STREAMMEM_EXPORT int streammem_boundaries_stream_step(const float* x, float* last_frame, float* window_sims,
                                                      double* scratch, int64_t* frames_in_window, int64_t* last_end,
                                                      int64_t* out_start, int64_t* out_end, int64_t B, int64_t D,
                                                      int64_t t, int64_t window, double tau, double min_depth,
                                                      int peak_code, int64_t max_event, double drift, int drift_mode,
                                                      int flash, int has_last, void* stream) {
  if (B <= 0) return 0;
  const int64_t blocks = (B + streammem::kWarpsPerBlock - 1) / streammem::kWarpsPerBlock;
  if (blocks > 0x7fffffffLL || window < 2 || window > 0x7fffffffLL || flash < 0 || flash > (window - 1) / 2)
    return static_cast<int>(cudaErrorInvalidConfiguration);
  streammem::stream_step_kernel<<<static_cast<unsigned>(blocks), streammem::kWarpsPerBlock * 32, 0,
                                  static_cast<cudaStream_t>(stream)>>>(
      x, last_frame, window_sims, scratch, frames_in_window, last_end, out_start, out_end, B, D, t,
      static_cast<int>(window), tau, min_depth, peak_code, max_event, drift, drift_mode, flash, has_last);
  return static_cast<int>(cudaGetLastError());
}
