// Internal header of the motion module _cpu_motion: what its .cpp files share.
//
//   strip.cpp    one level of one pair, one pass per row strip (warp, products, window sums, 2x2
//                solve), and the smoothing of a level's flow into the next level's guess;
//   pyramid.cpp  the pyramids, the coarsest level's shift search, level 0 over (pair, strip) items,
//                the per-pair summary: lk_flow_into;
//   gray.cpp     uint8 frames to gray at the working size (area resampling): gray_area_into;
//   streamchat.cpp  StreamChat's own gate reading (the "streamchat" statistic): streamchat_flow_into;
//   entries.cpp  the module's entries (the border of tensor_view.h) and its definition.
//
// The spec is streammem_kernels/motion/reference.py; docs/ops/motion.md explains the algorithm.
#pragma once

#include "common.h"

#include <cstdint>
#include <memory>

namespace streammem {
namespace motion {

// An uninitialised buffer: the large scratch arrays here are written before they are read, and
// zero-filling them (std::vector) cost ~10 % of a pyramid pass at 224 px.
template <typename U>
std::unique_ptr<U[]> buffer(int64_t n) {
  return std::unique_ptr<U[]>(new U[static_cast<size_t>(n)]);
}

struct PairSums {
  double mag = 0, u = 0, v = 0, weight = 0;  // window mode: weighted sums
  double s[5] = {0, 0, 0, 0, 0};             // global mode: summed products
};

struct Statistic {
  bool moving = false;
  float lo = 0.25f, hi = 0.5f;
};

// The whole-pixel offsets of a level (the reference's guess_offsets) on a coarser level's
// window-output grid, `factor` (1, 2 or 4) times coarser (1: a further step at the coarsest
// level): a level pixel (y, x) reads grid cell (clamp(y / factor - border), clamp(x / factor - border)).
struct Guess {
  const int32_t* ox = nullptr;
  const int32_t* oy = nullptr;
  int64_t rows = 0, cols = 0;
  int factor = 2;
  explicit operator bool() const { return ox != nullptr; }
};

// One level of one pair: frames (type T, scaled by `scale` to [0, 1]) and the guess.
template <typename T>
struct LevelPair {
  const T* prev;
  const T* cur;
  int64_t H, W;
  float scale;
  Guess guess;
};

// Where a strip's output rows go: level 0 reduces them, coarser levels keep the flow.
struct RowSink {
  Statistic stat;
  PairSums* sums = nullptr;                            // level 0
  float *u = nullptr, *v = nullptr, *valid = nullptr;  // coarser levels: (Ho, Wo) planes
};

// The arguments of lk_flow after the frames, as the Python side validated them.
struct LkParams {
  int window;  // odd >= 3, or 0: the paper's global system (single scale)
  float min_eig;
  int levels;  // >= 1; every level above 0 at least window + 4 pixels a side
  Statistic stat;
  double min_area;     // the "moving" statistic's minimum region, a fraction of the window outputs
  int guess_box;       // odd side of the box that smooths a level's flow into the next level's guess
  int search_radius;   // largest whole-pixel shift per axis of the coarsest level's search
  float search_quant;  // the search counts differences in 1/search_quant of the intensity range
};

// A frame row as [0, 1] floats: float(value) * scale (exact conversion, one rounding).
template <typename T>
STREAMMEM_HOT inline void unit_row(const T* __restrict src, int64_t W, float scale, float* __restrict dst) {
  for (int64_t x = 0; x < W; ++x) dst[x] = static_cast<float>(src[x]) * scale;
}

// strip.cpp.  Output rows [r0, r1) of one level of one pair (window-output coordinates; global
// mode, w == 0: gradient rows, summed into sink.sums->s).  Instantiated for uint8_t and float.
template <typename T>
void run_strip(const LevelPair<T>& lp, int w, float min_eig, int64_t r0, int64_t r1, const RowSink& sink);

// strip.cpp.  A level's flow (Ho, Wo) smoothed into a finer level's whole-pixel offsets (ox, oy).
void smooth_guess(const float* u, const float* v, const float* valid, int64_t Ho, int64_t Wo, int box, int factor,
                  int64_t fine_h, int64_t fine_w, int32_t* ox, int32_t* oy);

// pyramid.cpp.  flow_px (T-1,) and mean_uv (T-1, 2) of the C-contiguous frames (T, H, W), T >= 2,
// type T scaled by `scale` to [0, 1].  Releases the GIL.  Instantiated for uint8_t and float.
template <typename T>
void lk_flow_into(const T* frames, int64_t T_, int64_t H, int64_t W, float scale, const LkParams& p, float* flow_px,
                  float* mean_uv);

// gray.cpp.  (T, oh, ow) float32 gray in [0, 1] of C-contiguous uint8 frames (T, H, W, C), C in
// {1, 3}, area resampled (oh <= H, ow <= W).  Releases the GIL.
void gray_area_into(const uint8_t* frames, int64_t T_, int64_t H, int64_t W, int64_t C, int64_t oh, int64_t ow,
                    float* out);

// streamchat.cpp.  flow_px (T-1,) and mean_uv (T-1, 2) of StreamChat's reading of the C-contiguous
// float32 gray frames (T, H, W), T >= 2, window odd with window <= H, W; eps on the diagonal.
// Releases the GIL.
void streamchat_flow_into(const float* gray, int64_t T_, int64_t H, int64_t W, int window, float eps, float* flow_px,
                          float* mean_uv);

}  // namespace motion
}  // namespace streammem
