// Pyramidal Lucas-Kanade motion magnitude, fused CPU kernel.
//
// Contract (see streammem_kernels/motion.py, which is the spec):
//   lk_flow(gray (T,H,W) uint8|float32, window (odd >= 3, or 0 = global),
//           min_eig, levels, moving, floor_lo, floor_hi, min_area, guess_box, search_radius)
//     -> (flow_px (T-1,) float32, mean_uv (T-1,2) float32)
//
// One level of one pair is one pass per row strip: for each image row, the
// previous frame's row, the current frame's row moved by the coarser level's
// whole-pixel offsets (a copy), their mean and the [1 2 1] row sum of their
// difference go into rings of three rows; each gradient row's five structure
// products go into a ring of `window` rows; running column sums over that ring
// give the vertical box sum, a direct w-tap horizontal sum the window sum, then
// the closed-form 2x2 solve, the composition with the offsets, and either the
// frame's weighted sums (level 0) or the level's flow (coarser levels, which
// are small).  Nothing of size (H, W) is allocated per pair.
//
// Work: the pyramids of a chunk of frames (OpenMP over frames), the coarsest
// level's whole-pixel shift search (integer sums: the reference's shift exactly)
// and the coarse levels of each pair with their guess smoothing (OpenMP over
// pairs), then
// level 0 over (pair, strip) items (strips split a pair only when there are
// fewer pairs than threads).  Sums of windows run in another order than the
// reference's (float32 rounding; tolerance declared in motion.py).
#include "common.h"

#include <algorithm>
#include <tuple>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>
#include <memory>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace streammem {
namespace {

constexpr int kLanes = 8;         // independent accumulators so the reductions vectorise
constexpr int64_t kChunkPairs = 64;  // pairs whose pyramids and guesses are held at once
constexpr float kSearchQuant = 4096.0f;  // motion.SEARCH_QUANT

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
// window-output grid, `factor` (1, 2 or 4) times coarser (1: a further step at the coarsest level): a level pixel (y, x) reads grid cell
// (clamp(y / factor - border), clamp(x / factor - border)).
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

// floor(x) clamped to [-limit, limit], NaN -> -limit (branch-free, so loops over it vectorise).
inline int32_t floor_clamped(float x, float limit) {
  x = x >= -limit ? (x <= limit ? x : limit) : -limit;
  const int32_t t = static_cast<int32_t>(x);
  return t - (x < static_cast<float>(t) ? 1 : 0);
}

// Four values of a frame as [0, 1] floats: float(value) * scale, as unit_row (exact conversions,
// one rounding), in one vector move.
template <typename T>
__attribute__((always_inline)) inline void cell4(const T* __restrict from, float scale, float* __restrict dst) {
#if defined(__SSE2__)
  if constexpr (std::is_same<T, uint8_t>::value) {
    int32_t bits;
    std::memcpy(&bits, from, sizeof(bits));
    const __m128i zero = _mm_setzero_si128();
    const __m128i b = _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(bits), zero), zero);
    _mm_storeu_ps(dst, _mm_mul_ps(_mm_cvtepi32_ps(b), _mm_set1_ps(scale)));
    return;
  }
#endif
  for (int k = 0; k < 4; ++k) dst[k] = static_cast<float>(from[k]) * scale;
}

// One row of a warp: base is the row in the frame, cell j covers columns [start[j], start[j+1])
// and reads base + off[j], off[j] = dy[j] * W + gx[j] (dy[j]: the cell's row offset, already
// clamped to the frame's rows by the caller); kind[j] 0: exactly 4 columns read inside the row,
// 1: any width inside, 2: clamped columns.
template <typename T>
STREAMMEM_HOT void warp_cells(const T* __restrict base, float scale, int64_t W, int64_t cols,
                              const int64_t* __restrict start, const int64_t* __restrict off,
                              const uint8_t* __restrict kind, const int32_t* __restrict gx,
                              const int32_t* __restrict dy, float* __restrict dst) {
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t x0 = start[j], x1 = start[j + 1];
    const T* from = base + off[j];
    if (kind[j] == 0) {
      cell4<T>(from + x0, scale, dst + x0);
    } else if (kind[j] == 1) {
      for (int64_t x = x0; x < x1; ++x) dst[x] = static_cast<float>(from[x]) * scale;
    } else {
      const T* row = base + static_cast<int64_t>(dy[j]) * W;
      for (int64_t x = x0; x < x1; ++x)
        dst[x] = static_cast<float>(row[std::min<int64_t>(std::max<int64_t>(x + gx[j], 0), W - 1)]) * scale;
    }
  }
}

// A grid row's warp plan (GuessRows::warp_row): each cell's kind (see warp_cells; `cell` is the
// width of kind 0) and source offset dy * W + dx, and the vertical offsets' range.  Separate
// simple loops, so that they vectorise.  (Merging runs of cells with the same offset into one
// piece was slower on bikes.mp4: its level-0 guess changes every cell or two.)
STREAMMEM_HOT void plan_cells(const int32_t* __restrict gx, const int32_t* __restrict gy,
                              const int64_t* __restrict start, int64_t cols, int64_t W, int64_t cell,
                              uint8_t* __restrict kind, int64_t* __restrict off, int32_t* dy_lo, int32_t* dy_hi) {
  int32_t lo = gy[0], hi = gy[0];
  for (int64_t j = 0; j < cols; ++j) {
    lo = std::min(lo, gy[j]);
    hi = std::max(hi, gy[j]);
  }
  *dy_lo = lo;
  *dy_hi = hi;
  for (int64_t j = 0; j < cols; ++j) {
    const bool inside = start[j] + gx[j] >= 0 && start[j + 1] + gx[j] <= W;
    kind[j] = inside ? (start[j + 1] - start[j] == cell ? 0 : 1) : 2;
    off[j] = static_cast<int64_t>(gy[j]) * W + gx[j];
  }
}

// Image row y's cells whose rows y + gy[j] leave the frame's H rows: the clamped row offsets
// dy[j] = clamp(y + gy[j]) - y and source offsets dy[j] * W + gx[j] for warp_cells.
STREAMMEM_HOT void clamp_cell_rows(const int32_t* __restrict gx, const int32_t* __restrict gy, int64_t cols,
                                   int64_t y, int64_t H, int64_t W, int32_t* __restrict dy, int64_t* __restrict off) {
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t d = std::min<int64_t>(std::max<int64_t>(y + gy[j], 0), H - 1) - y;
    dy[j] = static_cast<int32_t>(d);
    off[j] = d * W + gx[j];
  }
}

// A grid row's offsets at the window outputs (GuessRows::output_row): cell j covers outputs
// [lo[j], hi[j]) (empty for the cells right of the last output); ox/oy its offsets as floats (whole
// numbers, exact), in[x] 1 where output x's displaced column x + ox[x] stays inside [0, right]
// (a whole number), else 0.  Returns whether every in[x] is 1.  *dy_lo, *dy_hi: the range of gy over cell 0 and
// the non-empty cells.
STREAMMEM_HOT bool output_offsets(const int32_t* __restrict gx, const int32_t* __restrict gy,
                                  const int32_t* __restrict lo, const int32_t* __restrict hi, int64_t cols,
                                  int64_t Wo, float right, float* __restrict ox, float* __restrict oy,
                                  float* __restrict in, int32_t* dy_lo, int32_t* dy_hi) {
  // Per non-empty cell: its vertical offset's range, and whether its displaced columns
  // lo + dx .. hi - 1 + dx all stay inside [0, right] (the columns of a cell are consecutive).
  const int32_t last = static_cast<int32_t>(right);  // int32: the loop vectorises (frames < 2^31 columns)
  int32_t dlo = gy[0], dhi = gy[0], inside = 1;
  for (int64_t j = 0; j < cols; ++j) {
    const int32_t used = lo[j] < hi[j];
    dlo = std::min(dlo, used ? gy[j] : dlo);
    dhi = std::max(dhi, used ? gy[j] : dhi);
    inside &= (!used) | ((lo[j] + gx[j] >= 0) & (hi[j] - 1 + gx[j] <= last));
  }
  *dy_lo = dlo;
  *dy_hi = dhi;
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t x0 = lo[j], x1 = hi[j];
    const float fx = static_cast<float>(gx[j]), fy = static_cast<float>(gy[j]);
#if defined(__SSE2__)
    if (x1 - x0 == 4) {  // level 0's cells (factor 4): one vector store each
      _mm_storeu_ps(ox + x0, _mm_set1_ps(fx));
      _mm_storeu_ps(oy + x0, _mm_set1_ps(fy));
      continue;
    }
#endif
    for (int64_t x = x0; x < x1; ++x) {
      ox[x] = fx;
      oy[x] = fy;
    }
  }
  // Output x reads column x + ox[x] (floats: whole numbers, exact; its own loop, so that it
  // vectorises).
  for (int64_t x = 0; x < Wo; ++x) {
    const float xs = static_cast<float>(static_cast<int32_t>(x)) + ox[x];
    in[x] = (xs >= 0.0f) & (xs <= right) ? 1.0f : 0.0f;
  }
  return inside != 0;
}

// A guess seen from its level: grid cell j covers the image columns [start(j), start(j+1))
// (runs of `factor` columns, the clamped ones at both edges), so the offsets of an image row
// are constant over runs and warping is a contiguous copy per run.
class GuessRows {
 public:
  GuessRows(const Guess& g, int64_t H, int64_t W, int64_t border) : g_(g), H_(H), W_(W), border_(border) {
    if (!g) return;
    start_.resize(g.cols + 1);
    start_[0] = 0;
    for (int64_t j = 1; j < g.cols; ++j) start_[j] = std::min<int64_t>(g.factor * (j + border), W);
    start_[g.cols] = W;
    out_lo_.resize(g.cols);
    out_hi_.resize(g.cols);
    const int64_t Wo = W - 2 * border;  // window outputs per row (output x is image column x + border)
    for (int64_t j = 0; j < g.cols; ++j) {
      out_lo_[j] = static_cast<int32_t>(std::max<int64_t>(start_[j] - border, 0));
      out_hi_[j] = static_cast<int32_t>(std::max<int64_t>(out_lo_[j], std::min<int64_t>(start_[j + 1] - border, Wo)));
    }
    nonzero_.assign(g.rows, -1);
    off_.resize(g.cols);
    kind_.resize(g.cols);
    clamped_off_.resize(g.cols);
    clamped_dy_.resize(g.cols);
  }
  int64_t grid_row(int64_t y) const { return std::min(std::max<int64_t>(y / g_.factor - border_, 0), g_.rows - 1); }
  // Whether any offset of grid row ci is nonzero (zero offsets: no warp, no composition).
  bool nonzero(int64_t ci) {
    if (nonzero_[ci] < 0) {
      int32_t any = 0;
      for (int64_t j = 0; j < g_.cols; ++j) any |= g_.ox[ci * g_.cols + j] | g_.oy[ci * g_.cols + j];
      nonzero_[ci] = any != 0;
    }
    return nonzero_[ci] != 0;
  }
  // The offsets of the window outputs of image row y (output x is image column x + border).
  // As floats (whole numbers), with whether every displaced column stays inside [border, W-1-border]
  // and the vertical offsets' range, so that rows whose windows all stay inside skip the check.
  struct Extent {
    bool columns_inside = true;
    int32_t dy_lo = 0, dy_hi = 0;
  };
  // in[x]: 1 where output x's displaced column stays inside, else 0.
  Extent output_row(int64_t ci, int64_t Wo, float* __restrict ox, float* __restrict oy, float* __restrict in) const {
    Extent e;
    e.columns_inside = output_offsets(g_.ox + ci * g_.cols, g_.oy + ci * g_.cols, out_lo_.data(), out_hi_.data(),
                                      g_.cols, Wo, static_cast<float>(W_ - 1 - 2 * border_), ox, oy, in, &e.dy_lo,
                                      &e.dy_hi);
    return e;
  }
  // Image row y of `src` (the frame, type T, times `scale`: [0, 1] floats) moved by grid row ci's
  // offsets into dst (W floats): dst[x] = src[clamp(y + oy), clamp(x + ox)] * scale.  Per grid row, each cell's source offset
  // dy * W + dx, its kind (0: exactly kCell columns and reading inside the frame's columns,
  // 1: reading inside, 2: clamped) and the vertical offsets' range are found once; each kind-0
  // cell is converted as one fixed-size block (level 0: 4 values, no branch, no library call; a
  // real clip's guess changes every few cells), also on the rows whose cells read outside the
  // frame's rows (then each cell's row is clamped first).
  template <typename T>
  void warp_row(const T* __restrict src, float scale, int64_t y, int64_t ci, float* __restrict dst) {
    const int64_t cols = g_.cols;
    const int32_t* gx = g_.ox + ci * cols;
    const int32_t* gy = g_.oy + ci * cols;
    if (ci != cells_row_) {
      cells_row_ = ci;
      plan_cells(gx, gy, start_.data(), cols, W_, kCell, kind_.data(), off_.data(), &cells_dy_lo_, &cells_dy_hi_);
    }
    if (y + cells_dy_lo_ >= 0 && y + cells_dy_hi_ <= H_ - 1) {
      warp_cells<T>(src + y * W_, scale, W_, cols, start_.data(), off_.data(), kind_.data(), gx, gy, dst);
      return;
    }
    clamp_cell_rows(gx, gy, cols, y, H_, W_, clamped_dy_.data(), clamped_off_.data());
    warp_cells<T>(src + y * W_, scale, W_, cols, start_.data(), clamped_off_.data(), kind_.data(), gx,
                  clamped_dy_.data(), dst);
  }

 private:
  Guess g_;
  int64_t H_, W_, border_;
  std::vector<int64_t> start_;
  std::vector<int32_t> out_lo_, out_hi_;  // each cell's window outputs [lo, hi) (empty right of the last)
  std::vector<int8_t> nonzero_;
  static constexpr int64_t kCell = 4;  // level 0's cell width (factor 4)
  std::vector<int64_t> off_;           // grid row cells_row_: each cell's source offset dy * W + dx
  std::vector<uint8_t> kind_;          // grid row cells_row_: each cell's copy (see warp_row)
  std::vector<int64_t> clamped_off_;   // a row reading outside the frame's rows: off_ with clamped rows
  std::vector<int32_t> clamped_dy_;    // ... and each cell's clamped row offset
  int32_t cells_dy_lo_ = 0, cells_dy_hi_ = 0;
  int64_t cells_row_ = -1;
};

template <typename T>
STREAMMEM_HOT void unit_row(const T* __restrict src, int64_t W, float scale, float* __restrict dst) {
  for (int64_t x = 0; x < W; ++x) dst[x] = static_cast<float>(src[x]) * scale;
}

// Mean row and [1 2 1] row sum of It = cur - prev, from unit rows.
STREAMMEM_HOT void mean_and_it_row(const float* __restrict p, const float* __restrict c, int64_t W,
                                   float* __restrict mean, float* __restrict it_row) {
  for (int64_t x = 0; x < W; ++x) mean[x] = 0.5f * (p[x] + c[x]);
  for (int64_t x = 0; x + 2 < W; ++x)
    it_row[x] = ((c[x] - p[x]) + 2.0f * (c[x + 1] - p[x + 1])) + (c[x + 2] - p[x + 2]);
}

// Gradient row g (image row g+1) from the mean rows and It row sums g, g+1, g+2, into `out`
// (5 planes of Wg).  kSlide: `col` holds the vertical window sums and the new row replaces,
// in them, the one `out` held w rows earlier (zero at first): one pass instead of an add and
// a subtract.
template <bool kSlide>
STREAMMEM_HOT void product_row(int64_t Wg, const float* __restrict m0, const float* __restrict m1,
                               const float* __restrict m2, const float* __restrict t0,
                               const float* __restrict t1, const float* __restrict t2, float* __restrict out,
                               float* __restrict col) {
  float* __restrict pxx = out;
  float* __restrict pxy = out + Wg;
  float* __restrict pyy = out + 2 * Wg;
  float* __restrict pxt = out + 3 * Wg;
  float* __restrict pyt = out + 4 * Wg;
  float* __restrict cxx = col;
  float* __restrict cxy = col + Wg;
  float* __restrict cyy = col + 2 * Wg;
  float* __restrict cxt = col + 3 * Wg;
  float* __restrict cyt = col + 4 * Wg;
#pragma GCC ivdep
  for (int64_t x = 0; x < Wg; ++x) {
    // Sobel / 8: intensity change per pixel; It smoothed by [1 2 1] x [1 2 1] / 16.
    const float ix = ((m0[x + 2] - m0[x]) + 2.0f * (m1[x + 2] - m1[x]) + (m2[x + 2] - m2[x])) * 0.125f;
    const float iy = ((m2[x] - m0[x]) + 2.0f * (m2[x + 1] - m0[x + 1]) + (m2[x + 2] - m0[x + 2])) * 0.125f;
    const float it = ((t0[x] + 2.0f * t1[x]) + t2[x]) * 0.0625f;
    const float xx = ix * ix, xy = ix * iy, yy = iy * iy, xt = ix * it, yt = iy * it;
    if (kSlide) {
      cxx[x] += xx - pxx[x];
      cxy[x] += xy - pxy[x];
      cyy[x] += yy - pyy[x];
      cxt[x] += xt - pxt[x];
      cyt[x] += yt - pyt[x];
    }
    pxx[x] = xx;
    pxy[x] = xy;
    pyy[x] = yy;
    pxt[x] = xt;
    pyt[x] = yt;
  }
}

STREAMMEM_HOT double lane_sum(const float* __restrict v, int64_t n) {
  float acc[kLanes] = {0};
  int64_t x = 0;
  for (; x + kLanes <= n; x += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += v[x + l];
  double total = 0;
  for (; x < n; ++x) total += v[x];
  for (int l = 0; l < kLanes; ++l) total += acc[l];
  return total;
}

template <int W>
STREAMMEM_HOT void box_row(const float* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t x = 0; x < n; ++x) {
    float acc = src[x];
    for (int k = 1; k < W; ++k) acc += src[x + k];
    dst[x] = acc;
  }
}

// One output row from its window sums (5 planes of Wo, not yet divided by w*w): the
// closed-form 2x2 solve; with kCompose, the composition with the guess's offsets gx/gy (flow =
// offsets + solution where valid -- textured and the displaced window inside the frame --,
// the offsets elsewhere; output x is image column border + x of image row y); then either
// the flow stored (kMode 0: coarser levels) or the statistic's weighted sums (kMode 1:
// textured, 2: moving) in kLanes float accumulators, so that the loop vectorises.  One pass
// instead of four: the row's values stay in registers.
template <int kCompose, int kMode>
STREAMMEM_HOT void finish_row(const float* __restrict box, int64_t Wo, float area, float min_eig,
                              const float* __restrict gx, const float* __restrict gy, const float* __restrict inside,
                              float lo, float hi, float* __restrict u_out,
                              float* __restrict v_out, float* __restrict n_out, PairSums* sums) {
  const float* __restrict sa = box;
  const float* __restrict sb = box + Wo;
  const float* __restrict sc = box + 2 * Wo;
  const float* __restrict sx = box + 3 * Wo;
  const float* __restrict sy = box + 4 * Wo;
  const float slope = 1.0f / (hi - lo);
  const float me = min_eig * area;
  float acc[4][kLanes] = {};
  // The solution of pixel x (the flow, composed) and whether it is valid.
  auto solve = [&](int64_t x, float& u_px, float& v_px, float& valid_px) {
    // On the window sums, not divided by the area w*w (five products less): the solution is the
    // same ratio, the eigenvalues scale by the area, so min_eig does.
    const float a = sa[x], bb = sb[x], c = sc[x], bx = -sx[x], by = -sy[x];
    const float det = a * c - bb * bb;
    // Branch-free (float masks).  The reference's test det / lambda_max > min_eig as
    // det > min_eig * lambda_max (lambda_max > 0): one division less, the same decision up to the
    // rounding of the sums.  (A square-root-free form of it, q = 2 det / min_eig - (a + c) with
    // q > 0 and q^2 > disc, rounds differently at the threshold: pixels there changed side, and
    // through the coarse guesses bikes.mp4's readings moved by up to 8 % from the reference's.)
    const float lmax = 0.5f * ((a + c) + std::sqrt((a - c) * (a - c) + 4.0f * bb * bb));
    const bool ok = lmax > 0.0f && det > me * lmax;
    float valid = ok ? 1.0f : 0.0f;
    const float inv_det = valid / (valid != 0.0f ? det : 1.0f);
    float u = (c * bx - bb * by) * inv_det;
    float v = (a * by - bb * bx) * inv_det;
    if (kCompose == 2) valid *= inside[x];  // the displaced window inside the frame (0 or 1)
    if (kCompose != 0) {
      // valid is 0 or 1 and the solution finite: g + valid * d is the reference's select.
      u = gx[x] + valid * u;
      v = gy[x] + valid * v;
    }
    u_px = u;
    v_px = v;
    valid_px = valid;
  };
  // A pixel's share of the statistic's weighted sums, in lane l.
  auto reduce = [&](float u, float v, float valid, int l) {
    const float m = std::sqrt(u * u + v * v);
    float w = valid;
    if (kMode == 2) w *= std::min(std::max((m - lo) * slope, 0.0f), 1.0f);
    acc[0][l] += w * m;
    acc[1][l] += w * u;
    acc[2][l] += w * v;
    acc[3][l] += w;
  };
  int64_t x = 0;
  if (kMode == 0) {
    for (; x < Wo; ++x) solve(x, u_out[x], v_out[x], n_out[x]);
    return;
  }
  if (kMode == 1) {
    auto pixel = [&](int64_t px, int l) {
      float u, v, valid;
      solve(px, u, v, valid);
      reduce(u, v, valid, l);
    };
    for (; x + kLanes <= Wo; x += kLanes)
      for (int l = 0; l < kLanes; ++l) pixel(x + l, l);
  }
  // "moving": two passes over chunks of kChunk pixels, the solve (a square root and a division)
  // then the statistic (a square root, the weights that depend on it, the sums): ~1.5 % of the
  // pyramid's cost at 224 px.  The same operations on the same values, in the same lanes.  (The
  // textured statistic, whose weights do not wait for the magnitude, got slower this way.)
  constexpr int64_t kChunk = 64;
  float cu[kChunk], cv[kChunk], cn[kChunk];
  while (kMode == 2 && x + kLanes <= Wo) {
    const int64_t n = std::min<int64_t>(kChunk, (Wo - x) / kLanes * kLanes);
    for (int64_t i = 0; i < n; ++i) solve(x + i, cu[i], cv[i], cn[i]);
    for (int64_t i = 0; i < n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) reduce(cu[i + l], cv[i + l], cn[i + l], l);
    x += n;
  }
  for (; x < Wo; ++x) {
    float u, v, valid;
    solve(x, u, v, valid);
    reduce(u, v, valid, 0);
  }
  if (kMode != 0) {
    double total[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < kLanes; ++l) total[k] += acc[k][l];
    sums->mag += total[0];
    sums->u += total[1];
    sums->v += total[2];
    sums->weight += total[3];
  }
}

// Where a strip's output rows go: level 0 reduces them, coarser levels keep the flow.
struct RowSink {
  Statistic stat;
  PairSums* sums = nullptr;                                   // level 0
  float* u = nullptr, *v = nullptr, *valid = nullptr;         // coarser levels: (Ho, Wo) planes
};

// Output rows [r0, r1) of one level of one pair (window-output coordinates; global mode:
// gradient rows, summed into sink.sums->s).
template <typename T>
void run_strip(const LevelPair<T>& lp, int w, float min_eig, int64_t r0, int64_t r1, const RowSink& sink) {
  const int64_t H = lp.H, W = lp.W, Wg = W - 2;
  const int64_t border = 1 + w / 2;
  std::vector<float> prow(W), crow(W);
  std::vector<float> mean_ring(3 * W), it_ring(3 * Wg);  // each image row is converted once per strip
  GuessRows guess(lp.guess, H, W, border);
  std::vector<float> out_ox(lp.guess ? W : 0), out_oy(lp.guess ? W : 0), out_in(lp.guess ? W : 0),
      row_in(lp.guess ? W : 0);
  typename GuessRows::Extent extent;
  // The warp reads the current frame itself and converts the cells it moves (the same
  // float(value) * scale as unit_row): no converted copy of the frame.
  int64_t next_row = r0;
  float* col = nullptr;  // the window's vertical sums (window mode)
  auto products = [&](int64_t g, float* out) {
    for (; next_row <= g + 2; ++next_row) {
      const int64_t y = next_row;
      unit_row(lp.prev + y * W, W, lp.scale, prow.data());
      const float* cur_row = crow.data();
      if (lp.guess && guess.nonzero(guess.grid_row(y))) {
        guess.warp_row<T>(lp.cur, lp.scale, y, guess.grid_row(y), crow.data());
      } else if (std::is_same<T, float>::value && lp.scale == 1.0f) {
        cur_row = reinterpret_cast<const float*>(lp.cur) + y * W;  // already [0, 1] floats
      } else {
        unit_row(lp.cur + y * W, W, lp.scale, crow.data());
      }
      mean_and_it_row(prow.data(), cur_row, W, mean_ring.data() + (y % 3) * W, it_ring.data() + (y % 3) * Wg);
    }
    const float* m[3] = {mean_ring.data() + (g % 3) * W, mean_ring.data() + ((g + 1) % 3) * W,
                         mean_ring.data() + ((g + 2) % 3) * W};
    const float* t[3] = {it_ring.data() + (g % 3) * Wg, it_ring.data() + ((g + 1) % 3) * Wg,
                         it_ring.data() + ((g + 2) % 3) * Wg};
    if (col != nullptr)
      product_row<true>(Wg, m[0], m[1], m[2], t[0], t[1], t[2], out, col);
    else
      product_row<false>(Wg, m[0], m[1], m[2], t[0], t[1], t[2], out, nullptr);
  };
  if (w == 0) {
    std::vector<float> prod(5 * Wg);
    for (int64_t g = r0; g < r1; ++g) {
      products(g, prod.data());
      for (int c = 0; c < 5; ++c) sink.sums->s[c] += lane_sum(prod.data() + c * Wg, Wg);
    }
    return;
  }
  const int64_t Wo = Wg - w + 1;
  std::vector<float> ring(static_cast<size_t>(w) * 5 * Wg, 0.0f);  // the last w product rows
  std::vector<float> col_sums(5 * Wg, 0.0f);                       // vertical box sums
  col = col_sums.data();
  std::vector<float> scratch(5 * Wo);
  const float area = static_cast<float>(w * w);
  auto slot = [&](int64_t g) { return ring.data() + (g % w) * 5 * Wg; };
  for (int64_t g = r0; g < r0 + w - 1; ++g) products(g, slot(g));
  int64_t offsets_row = -1;  // the grid row whose output offsets out_ox/out_oy hold
  float* box = scratch.data();  // 5 rows of window sums
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r + w - 1;
    products(g, slot(g));
    for (int c = 0; c < 5; ++c) {
      float* __restrict dst = box + c * Wo;
      const float* __restrict src = col + c * Wg;
      switch (w) {  // fixed tap counts unroll into straight vector code
        case 3: box_row<3>(src, dst, Wo); break;
        case 5: box_row<5>(src, dst, Wo); break;
        case 7: box_row<7>(src, dst, Wo); break;
        case 9: box_row<9>(src, dst, Wo); break;
        default:
          for (int64_t x = 0; x < Wo; ++x) dst[x] = src[x];
          for (int k = 1; k < w; ++k)
            for (int64_t x = 0; x < Wo; ++x) dst[x] += src[x + k];
      }
    }
    const int64_t y = r + border;
    // Zero offsets keep every output window inside the frame: the composition is the identity.
    const bool compose = lp.guess && guess.nonzero(guess.grid_row(y));
    if (compose && guess.grid_row(y) != offsets_row) {
      offsets_row = guess.grid_row(y);
      extent = guess.output_row(offsets_row, Wo, out_ox.data(), out_oy.data(), out_in.data());
    }
    // Whether some displaced window leaves the frame: its columns (out_in, per grid row) or, on
    // the rows near the top and bottom, its rows (row_in).
    const bool rows_inside = y + extent.dy_lo >= border && y + extent.dy_hi <= H - 1 - border;
    const bool checked = !(extent.columns_inside && rows_inside);
    const float* inside = out_in.data();
    if (compose && !rows_inside) {
      const float top = static_cast<float>(border - y), bottom = static_cast<float>(H - 1 - border - y);
      for (int64_t x = 0; x < Wo; ++x) row_in[x] = out_in[x] * (out_oy[x] >= top && out_oy[x] <= bottom ? 1.0f : 0.0f);
      inside = row_in.data();
    }
    const int mode = sink.sums == nullptr ? 0 : (sink.stat.moving ? 2 : 1);
    float* u = sink.u + r * Wo;
    float* v = sink.v + r * Wo;
    float* n = sink.valid + r * Wo;
    if (mode == 0) {
      u = sink.u + r * Wo;
    } else {
      u = v = n = nullptr;
    }
    const auto args = std::make_tuple(box, Wo, area, min_eig, out_ox.data(), out_oy.data(), inside,
                                      sink.stat.lo, sink.stat.hi, u, v, n, sink.sums);
    if (compose && checked) {
      if (mode == 0) std::apply(finish_row<2, 0>, args);
      else if (mode == 1) std::apply(finish_row<2, 1>, args);
      else std::apply(finish_row<2, 2>, args);
    } else if (compose) {
      if (mode == 0) std::apply(finish_row<1, 0>, args);
      else if (mode == 1) std::apply(finish_row<1, 1>, args);
      else std::apply(finish_row<1, 2>, args);
    } else {
      if (mode == 0) std::apply(finish_row<0, 0>, args);
      else if (mode == 1) std::apply(finish_row<0, 1>, args);
      else std::apply(finish_row<0, 2>, args);
    }
  }
}

// A level's flow (Ho, Wo) smoothed into a finer level's offsets: the mean of (u, v) over the
// valid pixels of each box x box neighbourhood (zero padded; no valid neighbour: the pixel's own
// flow), times `factor`, rounded down after + 0.5, clamped to the finer level's (W, H).
STREAMMEM_HOT void smooth_guess(const float* __restrict u, const float* __restrict v, const float* __restrict valid,
                                int64_t Ho, int64_t Wo, int box, int factor, int64_t fine_h, int64_t fine_w,
                                int32_t* __restrict ox, int32_t* __restrict oy) {
  const int64_t half = box / 2, Wp = Wo + 2 * half;
  // Zero-padded rows of u*valid, v*valid, valid and their horizontal box sums (3 planes each).
  std::vector<float> padded(3 * Wp, 0.0f);
  const auto rows = buffer<float>(3 * Ho * Wo);
  for (int64_t i = 0; i < Ho; ++i) {
    float* pu = padded.data() + half;
    float* pv = pu + Wp;
    float* pw = pv + Wp;
    const float* ui = u + i * Wo;
    const float* vi = v + i * Wo;
    const float* wi = valid + i * Wo;
    for (int64_t j = 0; j < Wo; ++j) {
      pu[j] = ui[j] * wi[j];
      pv[j] = vi[j] * wi[j];
      pw[j] = wi[j];
    }
    for (int c = 0; c < 3; ++c) {
      const float* src = padded.data() + c * Wp;
      float* dst = rows.get() + (c * Ho + i) * Wo;
      if (box == 5) {  // the default: one pass, the same sums in the same order
        box_row<5>(src, dst, Wo);
        continue;
      }
      for (int64_t j = 0; j < Wo; ++j) dst[j] = src[j];
      for (int64_t k = 1; k < box; ++k)
        for (int64_t j = 0; j < Wo; ++j) dst[j] += src[j + k];
    }
  }
  std::vector<float> acc(3 * Wo);
  const float lim_x = static_cast<float>(fine_w), lim_y = static_cast<float>(fine_h);
  const float f = static_cast<float>(factor);
  for (int64_t i = 0; i < Ho; ++i) {
    const int64_t r_lo = std::max<int64_t>(i - half, 0), r_hi = std::min(i + half, Ho - 1);
    const float* __restrict ui = u + i * Wo;
    const float* __restrict vi = v + i * Wo;
    int32_t* __restrict oxi = ox + i * Wo;
    int32_t* __restrict oyi = oy + i * Wo;
    // The offsets from the box sums (branch-free, so that the loops vectorise).
    auto emit = [&](int64_t j, float su, float sv, float sw) {
      const bool has = sw > 0.0f;
      const float d = has ? sw : 1.0f;
      const float qu = su / d, qv = sv / d;
      const float gu = has ? qu : ui[j];
      const float gv = has ? qv : vi[j];
      oxi[j] = floor_clamped(f * gu + 0.5f, lim_x);  // f * g is exact: a contracted fma rounds alike
      oyi[j] = floor_clamped(f * gv + 0.5f, lim_y);
    };
    if (r_hi - r_lo == 4) {
      // Five rows (the default box away from the edges): the vertical sums and the offsets in
      // one pass, the same sums in the same order (from 0, row by row) as below.
      const float* p[3][5];
      for (int c = 0; c < 3; ++c)
        for (int k = 0; k < 5; ++k) p[c][k] = rows.get() + (c * Ho + r_lo + k) * Wo;
      for (int64_t j = 0; j < Wo; ++j) {
        float s3[3];
        for (int c = 0; c < 3; ++c) s3[c] = ((((0.0f + p[c][0][j]) + p[c][1][j]) + p[c][2][j]) + p[c][3][j]) + p[c][4][j];
        emit(j, s3[0], s3[1], s3[2]);
      }
      continue;
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t r = r_lo; r <= r_hi; ++r)
      for (int c = 0; c < 3; ++c) {
        const float* src = rows.get() + (c * Ho + r) * Wo;
        float* dst = acc.data() + c * Wo;
        for (int64_t j = 0; j < Wo; ++j) dst[j] += src[j];
      }
    for (int64_t j = 0; j < Wo; ++j) emit(j, acc[j], acc[Wo + j], acc[2 * Wo + j]);
  }
}

// [1 2 1] / 4 at every second pixel of one row already in [0, 1] floats, edges replicated:
// h[j] = ((s[2j-1] + 2 s[2j]) + s[2j+1]) / 4 (the reference's order; 2 s is exact, so an FMA
// rounds it the same way).  Four outputs per step from de-interleaved loads (odd, even and the
// next odd samples).
STREAMMEM_HOT void reduce_row_pass(const float* __restrict s, int64_t W, float* __restrict h) {
  const int64_t Wn = (W + 1) / 2;
  h[0] = ((s[0] + 2.0f * s[0]) + s[std::min<int64_t>(1, W - 1)]) * 0.25f;
  int64_t j = 1;
#if defined(__SSE2__)
  // Outputs j..j+3 read s[2j-1 .. 2j+8]: inside the row while 2j + 9 <= W, and interior while
  // j + 4 < Wn.
  const __m128 quarter = _mm_set1_ps(0.25f);
  for (; 2 * j + 9 <= W && j + 4 < Wn; j += 4) {
    const float* p = s + 2 * j - 1;
    const __m128 a = _mm_loadu_ps(p), b = _mm_loadu_ps(p + 4), c = _mm_loadu_ps(p + 2), d = _mm_loadu_ps(p + 6);
    const __m128 left = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));   // s[2j-1], s[2j+1], ...
    const __m128 mid = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));    // s[2j], s[2j+2], ...
    const __m128 right = _mm_shuffle_ps(c, d, _MM_SHUFFLE(2, 0, 2, 0));  // s[2j+1], s[2j+3], ...
    _mm_storeu_ps(h + j, _mm_mul_ps(_mm_add_ps(_mm_add_ps(left, _mm_add_ps(mid, mid)), right), quarter));
  }
#endif
  for (; j + 1 < Wn; ++j) h[j] = ((s[2 * j - 1] + 2.0f * s[2 * j]) + s[2 * j + 1]) * 0.25f;
  if (Wn > 1) h[Wn - 1] = ((s[2 * Wn - 3] + 2.0f * s[2 * Wn - 2]) + s[std::min<int64_t>(2 * Wn - 1, W - 1)]) * 0.25f;
}

STREAMMEM_HOT void reduce_column_pass(const float* __restrict up, const float* __restrict mid,
                                      const float* __restrict down, int64_t n, float* __restrict out) {
  for (int64_t j = 0; j < n; ++j) out[j] = ((up[j] + 2.0f * mid[j]) + down[j]) * 0.25f;
}

// Next pyramid level of one frame: [1 2 1] / 4 along rows then columns, every second pixel,
// edges replicated.  tmp: H * ((W+1)/2) + W floats.
template <typename T>
void reduce_frame(const T* src, int64_t H, int64_t W, float scale, float* dst, float* tmp) {
  const int64_t Hn = (H + 1) / 2, Wn = (W + 1) / 2;
  float* unit = tmp + H * Wn;
  for (int64_t y = 0; y < H; ++y) {
    unit_row<T>(src + y * W, W, scale, unit);
    reduce_row_pass(unit, W, tmp + y * Wn);
  }
  for (int64_t i = 0; i < Hn; ++i)
    reduce_column_pass(tmp + std::max<int64_t>(2 * i - 1, 0) * Wn, tmp + (2 * i) * Wn,
                       tmp + std::min<int64_t>(2 * i + 1, H - 1) * Wn, Wn, dst + i * Wn);
}

// The coarsest level's start (the reference's search_shift): the whole-pixel shift (dx, dy) in
// [-rx, rx] x [-ry, ry] whose sum of quantised absolute differences over prev's central region
// [ry, H - ry) x [rx, W - rx) against cur at (y + dy, x + dx) is smallest; ties go to no shift,
// then to the first in row-major order.  Integer sums: the same shift as every backend.
STREAMMEM_HOT void search_shift(const float* __restrict prev, const float* __restrict cur, int64_t H, int64_t W,
                                int ry, int rx, float quant, int32_t* sx, int32_t* sy) {
  int64_t best = -1;
  *sx = *sy = 0;
  const int64_t n = W - 2 * rx;
  for (int dy = -ry; dy <= ry; ++dy)
    for (int dx = -rx; dx <= rx; ++dx) {
      int64_t sad = 0;
      for (int64_t y = ry; y < H - ry; ++y) {
        const float* __restrict a = prev + y * W + rx;
        const float* __restrict b = cur + (y + dy) * W + rx + dx;
        int32_t row = 0;
        for (int64_t x = 0; x < n; ++x) row += static_cast<int32_t>(std::fabs(std::floor((b[x] - a[x]) * quant + 0.5f)));
        sad += row;
      }
      const int64_t key = 2 * sad + ((dx != 0 || dy != 0) ? 1 : 0);
      if (best < 0 || key < best) {
        best = key;
        *sx = dx;
        *sy = dy;
      }
    }
}

void solve_global(const PairSums& s, double npix, float min_eig, float* flow, float* uv) {
  const float a = static_cast<float>(s.s[0] / npix), b = static_cast<float>(s.s[1] / npix);
  const float c = static_cast<float>(s.s[2] / npix);
  const float bx = static_cast<float>(-s.s[3] / npix), by = static_cast<float>(-s.s[4] / npix);
  const float det = a * c - b * b;
  const float lmax = 0.5f * ((a + c) + std::sqrt((a - c) * (a - c) + 4.0f * b * b));
  const float lmin = lmax > 0.0f ? det / lmax : 0.0f;
  float u = 0.0f, v = 0.0f;
  if (lmin > min_eig) {
    u = (c * bx - b * by) / det;
    v = (a * by - b * bx) / det;
  }
  *flow = std::sqrt(u * u + v * v);
  uv[0] = u;
  uv[1] = v;
}

// Level 0 of pairs [p0, p0 + n) over (pair, strip) items; guess(k) is pair k's guess or none.
template <typename T, typename GuessOf>
void level0_sums(const T* base, int64_t p0, int64_t n, int64_t H, int64_t W, int w, float scale, float min_eig,
                 Statistic stat, GuessOf guess_of, std::vector<PairSums>& totals) {
  const int64_t out_rows = w ? (H - 2 - w + 1) : (H - 2);
  // Strips depend on the frame size only: each strip restarts its running window sums, so its
  // boundaries change the float rounding, and a pair must read the same in any batch (a stream
  // gate fed frame by frame against the same frames in one call) and with any thread count.
  // Two strips (so a single pair still uses two threads) from 32 output rows, one more per 128
  // rows of large frames; restarting a strip costs window + 1 rows (~3 % at 224 px).
  const int64_t strips = std::max<int64_t>(1, std::min<int64_t>(out_rows / 16, std::max<int64_t>(2, out_rows / 128)));
  const int64_t items = n * strips;
  std::vector<PairSums> partial(items);
  // Small clips stay on the calling thread: waking a team costs more than the work.
  const bool parallel = items > 1 && n * H * W >= (int64_t{1} << 16);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t k = item / strips, s = item % strips;
    const int64_t r0 = out_rows * s / strips, r1 = out_rows * (s + 1) / strips;
    const T* prev = base + (p0 + k) * H * W;
    const LevelPair<T> lp{prev, prev + H * W, H, W, scale, guess_of(k)};
    RowSink sink;
    sink.stat = stat;
    sink.sums = &partial[item];
    run_strip<T>(lp, w, min_eig, r0, r1, sink);
  }
  for (int64_t k = 0; k < n; ++k) {
    PairSums& total = totals[p0 + k];
    for (int64_t s = 0; s < strips; ++s) {
      const PairSums& q = partial[k * strips + s];
      total.mag += q.mag;
      total.u += q.u;
      total.v += q.v;
      total.weight += q.weight;
      for (int c = 0; c < 5; ++c) total.s[c] += q.s[c];
    }
  }
}

template <typename T>
py::tuple lk_flow_impl(const carray<T>& gray, int window, float min_eig, int levels, Statistic stat,
                       double min_area, int guess_box, int search_radius, float scale) {
  require(gray.ndim() == 3, "gray must be (T, H, W)");
  const int64_t T_ = gray.shape(0), H = gray.shape(1), W = gray.shape(2);
  require(T_ >= 2, "gray must hold at least 2 frames");
  require(window == 0 || (window >= 3 && window % 2 == 1), "window must be 0 or odd >= 3");
  const int w = window;
  require(H >= (w ? w : 1) + 2 && W >= (w ? w : 1) + 2, "frames too small for the window");
  require(levels >= 1 && (w != 0 || levels == 1), "levels must be >= 1 (1 for the global mode)");
  require(guess_box >= 1 && guess_box % 2 == 1, "guess_box must be odd >= 1");
  require(search_radius >= 0, "search_radius must be >= 0");
  std::vector<int64_t> lh{H}, lw{W};
  for (int l = 1; l < levels; ++l) {
    lh.push_back((lh.back() + 1) / 2);
    lw.push_back((lw.back() + 1) / 2);
    require(lh.back() >= w + 4 && lw.back() >= w + 4, "every pyramid level must be at least window + 4 a side");
  }
  const int64_t pairs = T_ - 1;
  carray<float> flow_px(pairs);
  carray<float> mean_uv({pairs, static_cast<int64_t>(2)});
  const T* base = gray.data();
  float* flow = flow_px.mutable_data();
  float* uv = mean_uv.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::vector<PairSums> totals(pairs);
    auto no_guess = [](int64_t) { return Guess{}; };
    if (levels == 1) {
      level0_sums<T>(base, 0, pairs, H, W, w, scale, min_eig, stat, no_guess, totals);
    } else {
      // The levels LK runs on, coarsest first: all but level 1 when there are three or more
      // (motion.solved_levels); level 0's guess comes from `last` (1 or 2), factor 2^last.
      // The coarsest level starts from the searched shift (factor 1).
      std::vector<int> solved{levels - 1};
      const int top = levels - 1;
      const int ry = static_cast<int>(std::min<int64_t>(lh[top] / 4, search_radius));
      const int rx = static_cast<int>(std::min<int64_t>(lw[top] / 4, search_radius));
      for (int l = levels - 2; l >= 1; --l)
        if (!(l == 1 && levels >= 3)) solved.push_back(l);
      const int last = solved.back();
      const int64_t hol = lh[last] - 1 - w, wol = lw[last] - 1 - w;  // its output grid
      const int64_t grid = hol * wol;  // the largest coarse grid
      for (int64_t p0 = 0; p0 < pairs; p0 += kChunkPairs) {
        const int64_t n = std::min(kChunkPairs, pairs - p0), nf = n + 1;
        // The pyramids of frames p0 .. p0 + n above level 0 (the input); level 1 is kept only
        // when it is solved (two levels).
        std::vector<std::vector<float>> pyr(levels);
        for (int l = 1; l < levels; ++l)
          if (l > 1 || levels == 2) pyr[l].resize(static_cast<size_t>(nf * lh[l] * lw[l]));
        const bool parallel = nf * H * W >= (int64_t{1} << 16);
#pragma omp parallel if (parallel)
        {
          const auto tmp = buffer<float>(H * lw[1] + W);  // per thread
          const auto level1 = buffer<float>(levels == 2 ? 0 : lh[1] * lw[1]);
#pragma omp for schedule(static)
          for (int64_t f = 0; f < nf; ++f) {
            float* l1 = levels == 2 ? pyr[1].data() + f * lh[1] * lw[1] : level1.get();
            reduce_frame<T>(base + (p0 + f) * H * W, H, W, scale, l1, tmp.get());
            const float* src = l1;
            for (int l = 2; l < levels; ++l) {
              float* dst = pyr[l].data() + f * lh[l] * lw[l];
              reduce_frame<float>(src, lh[l - 1], lw[l - 1], 1.0f, dst, tmp.get());
              src = dst;
            }
          }
        }
        // The solved coarse levels of each pair, down to the offsets for level 0.
        const auto guess0 = buffer<int32_t>(n * 2 * grid);
#pragma omp parallel for schedule(dynamic, 1) if (parallel && n > 1)
        for (int64_t k = 0; k < n; ++k) {
          const auto fields = buffer<float>(3 * grid);
          const std::unique_ptr<int32_t[]> offsets[2] = {buffer<int32_t>(2 * grid), buffer<int32_t>(2 * grid)};
          int32_t shift[2];
          {
            const float* prev = pyr[top].data() + k * lh[top] * lw[top];
            search_shift(prev, prev + lh[top] * lw[top], lh[top], lw[top], ry, rx, kSearchQuant, shift, shift + 1);
          }
          Guess g{shift, shift + 1, 1, 1, 1};
          for (size_t i = 0; i < solved.size(); ++i) {
            const int l = solved[i];
            const int64_t hl = lh[l], wl = lw[l], ho = hl - 1 - w, wo = wl - 1 - w;
            const float* prev = pyr[l].data() + k * hl * wl;
            const LevelPair<float> lp{prev, prev + hl * wl, hl, wl, 1.0f, g};
            RowSink sink;
            sink.u = fields.get();
            sink.v = fields.get() + ho * wo;
            sink.valid = fields.get() + 2 * ho * wo;
            run_strip<float>(lp, w, min_eig, 0, ho, sink);
            const int finer = i + 1 < solved.size() ? solved[i + 1] : 0;
            const int factor = 1 << (l - finer);
            // Two buffers: this level's offsets are written while the previous ones are read.
            int32_t* gx = finer == 0 ? guess0.get() + k * 2 * grid : offsets[i % 2].get();
            smooth_guess(sink.u, sink.v, sink.valid, ho, wo, guess_box, factor, lh[finer], lw[finer], gx,
                         gx + ho * wo);
            g = Guess{gx, gx + ho * wo, ho, wo, factor};
          }
        }
        const int factor0 = 1 << last;
        auto guess_of = [&](int64_t k) {
          const int32_t* gx = guess0.get() + k * 2 * grid;
          return Guess{gx, gx + grid, hol, wol, factor0};
        };
        level0_sums<T>(base, p0, n, H, W, w, scale, min_eig, stat, guess_of, totals);
      }
    }
    const double floor = stat.moving ? std::max(1.0, min_area * static_cast<double>((H - 1 - w) * (W - 1 - w)))
                                     : 1.0;
    for (int64_t p = 0; p < pairs; ++p) {
      const PairSums& total = totals[p];
      if (w == 0) {
        solve_global(total, static_cast<double>(H - 2) * static_cast<double>(W - 2), min_eig, flow + p, uv + 2 * p);
      } else {
        const double n = std::max(total.weight, floor);
        flow[p] = static_cast<float>(total.mag / n);
        uv[2 * p] = static_cast<float>(total.u / n);
        uv[2 * p + 1] = static_cast<float>(total.v / n);
      }
    }
  }
  return py::make_tuple(flow_px, mean_uv);
}

py::tuple lk_flow(py::array gray, int window, float min_eig, int levels, bool moving, float floor_lo,
                  float floor_hi, double min_area, int guess_box, int search_radius) {
  require(floor_hi > floor_lo, "floor_hi must exceed floor_lo");
  const Statistic stat{moving, floor_lo, floor_hi};
  if (py::isinstance<carray<uint8_t>>(gray) && gray.dtype().is(py::dtype::of<uint8_t>()))
    return lk_flow_impl<uint8_t>(gray.cast<carray<uint8_t>>(), window, min_eig, levels, stat, min_area, guess_box,
                                 search_radius, 1.0f / 255.0f);
  if (gray.dtype().is(py::dtype::of<float>()))
    return lk_flow_impl<float>(gray.cast<carray<float>>(), window, min_eig, levels, stat, min_area, guess_box,
                               search_radius, 1.0f);
  throw std::invalid_argument("gray must be uint8 or float32");
}

// uint8 frames (T,H,W) or (T,H,W,3) -> float32 gray in [0,1] (T,oh,ow), with
// area resampling identical to torch's adaptive_avg_pool2d bins
// [floor(i*H/oh), ceil((i+1)*H/oh)) (what F.interpolate(mode="area") uses).
// Gray and area averaging are both linear, so each bin is averaged in gray.
// One input row to gray float (RGB: ITU-R BT.601 luma weights; gray: a copy).
STREAMMEM_HOT void gray_row(const uint8_t* __restrict p, int64_t W, int64_t C, float* __restrict out) {
  if (C == 3) {
    for (int64_t x = 0; x < W; ++x) out[x] = 0.299f * p[3 * x] + 0.587f * p[3 * x + 1] + 0.114f * p[3 * x + 2];
  } else {
    for (int64_t x = 0; x < W; ++x) out[x] = static_cast<float>(p[x]);
  }
}

STREAMMEM_HOT void add_row(float* __restrict acc, const float* __restrict row, int64_t W) {
  for (int64_t x = 0; x < W; ++x) acc[x] += row[x];
}

void check_gray_area(const carray<uint8_t>& frames, int64_t oh, int64_t ow) {
  require(frames.ndim() == 3 || (frames.ndim() == 4 && frames.shape(3) == 3), "frames must be (T,H,W) or (T,H,W,3)");
  require(oh >= 1 && ow >= 1 && oh <= frames.shape(1) && ow <= frames.shape(2),
          "output size must be within the input size");
}

// gray_area written into dst ((T, oh, ow) floats; checked by check_gray_area).
void gray_area_into(const carray<uint8_t>& frames, int64_t oh, int64_t ow, float* dst) {
  const int64_t T_ = frames.shape(0), H = frames.shape(1), W = frames.shape(2);
  const int64_t C = frames.ndim() == 4 ? 3 : 1;
  const uint8_t* src = frames.data();
  std::vector<int64_t> c0(ow), c1(ow);
  for (int64_t j = 0; j < ow; ++j) {
    c0[j] = (j * W) / ow;
    c1[j] = ((j + 1) * W + ow - 1) / ow;
  }
  {
    py::gil_scoped_release nogil;
    // Work items are (frame, band of output rows).  Each input row is converted to gray
    // once per band and kept in a small ring, so rows shared by two output rows (the
    // bins overlap when H is not a multiple of oh) are not converted twice.
    const int64_t bands_per_frame = std::max<int64_t>(1, std::min<int64_t>(oh, 8));
    const int64_t items = T_ * bands_per_frame;
#pragma omp parallel if (T_ * H * W >= (int64_t{1} << 16))
    {
      std::vector<float> acc(W);
      std::vector<float> gray;  // rows [have_lo, have_hi) of the current frame, W floats each
      int64_t have_lo = 0, have_hi = 0, have_t = -1;
#pragma omp for schedule(static)
      for (int64_t item = 0; item < items; ++item) {
        const int64_t t = item / bands_per_frame, band = item % bands_per_frame;
        const int64_t i_lo = oh * band / bands_per_frame, i_hi = oh * (band + 1) / bands_per_frame;
        for (int64_t i = i_lo; i < i_hi; ++i) {
          const int64_t r0 = (i * H) / oh, r1 = ((i + 1) * H + oh - 1) / oh;
          if (have_t != t || r0 < have_lo || r0 > have_hi) {  // start a fresh window at r0
            have_t = t;
            have_lo = have_hi = r0;
            gray.clear();
          }
          // Drop rows before r0, convert rows up to r1.
          if (r0 > have_lo) {
            gray.erase(gray.begin(), gray.begin() + (r0 - have_lo) * W);
            have_lo = r0;
          }
          for (int64_t r = have_hi; r < r1; ++r) {
            gray.resize(static_cast<size_t>((r - have_lo + 1) * W));
            gray_row(src + ((t * H + r) * W) * C, W, C, gray.data() + (r - have_lo) * W);
          }
          have_hi = std::max(have_hi, r1);
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t r = r0; r < r1; ++r) add_row(acc.data(), gray.data() + (r - have_lo) * W, W);
          float* o = dst + (t * oh + i) * ow;
          const float rows = static_cast<float>(r1 - r0);
          for (int64_t j = 0; j < ow; ++j) {
            float s = 0.0f;
            for (int64_t x = c0[j]; x < c1[j]; ++x) s += acc[x];
            o[j] = s / (rows * static_cast<float>(c1[j] - c0[j]) * 255.0f);
          }
        }
      }
    }
  }
}

carray<float> gray_area(const carray<uint8_t>& frames, int64_t oh, int64_t ow) {
  check_gray_area(frames, oh, ow);
  carray<float> out({frames.shape(0), oh, ow});
  gray_area_into(frames, oh, ow, out.mutable_data());
  return out;
}

// score = flow_px / (1 + flow_px), the float32 division of motion.py's MotionResult.
carray<float> score_of(const carray<float>& flow_px) {
  const int64_t pairs = flow_px.shape(0);
  carray<float> score(pairs);
  const float* f = flow_px.data();
  float* s = score.mutable_data();
  for (int64_t p = 0; p < pairs; ++p) s[p] = f[p] / (1.0f + f[p]);
  return score;
}

// The public function's fused CPU path for uint8 frames: gray (and area resize) when needed,
// lk_flow, and score = flow_px / (1 + flow_px), in one call.  A single pair at 224 px is a
// ~0.5 ms kernel, and each Python-side step between the two native calls (tensor wrapping,
// the score's float32 division, dispatch) cost microseconds; this returns every output of
// motion_magnitude.  frames: (T,H,W) or (T,H,W,3) uint8, C-contiguous (the Python side has
// validated shapes and arguments with the same rules as the general path, which this
// reproduces bit for bit: the same gray_area and lk_flow, and the score's one float32
// division). (out_h, out_w) == (H, W) with (T,H,W) frames: LK reads the uint8 frames directly.
py::tuple motion_u8(const carray<uint8_t>& frames, int64_t out_h, int64_t out_w, int window, float min_eig,
                    int levels, bool moving, float floor_lo, float floor_hi, double min_area, int guess_box,
                    int search_radius) {
  require(floor_hi > floor_lo, "floor_hi must exceed floor_lo");
  require(frames.ndim() == 3 || (frames.ndim() == 4 && frames.shape(3) == 3), "frames must be (T,H,W) or (T,H,W,3)");
  const Statistic stat{moving, floor_lo, floor_hi};
  const bool direct = frames.ndim() == 3 && out_h == frames.shape(1) && out_w == frames.shape(2);
  const py::tuple flow = direct ? lk_flow_impl<uint8_t>(frames, window, min_eig, levels, stat, min_area, guess_box,
                                                        search_radius, 1.0f / 255.0f)
                                : lk_flow_impl<float>(gray_area(frames, out_h, out_w), window, min_eig, levels, stat,
                                                      min_area, guess_box, search_radius, 1.0f);
  const auto flow_px = flow[0].cast<carray<float>>();
  return py::make_tuple(flow_px, score_of(flow_px), flow[1]);
}

// The streaming gate's step (python/streammem/gate.py, MotionGate.push) for uint8 frames:
// one (m, out_h, out_w) float32 stack holding the reference frame's gray `anchor` ((out_h, out_w)
// float32, or None at a stream's start) followed by the gray of `frames` ((n,H,W) or (n,H,W,3),
// C-contiguous; gray_area written in place, so no concatenation), and the score of each
// consecutive pair of the stack (m - 1 of them; none when m == 1).  Returns (stack, score).
// The values are the general path's (gray_area, then lk_flow on the concatenated grays) bit
// for bit; the Python side has validated the frames and arguments.
py::tuple gate_u8(const carray<uint8_t>& frames, const py::object& anchor, int64_t out_h, int64_t out_w, int window,
                  float min_eig, int levels, bool moving, float floor_lo, float floor_hi, double min_area,
                  int guess_box, int search_radius) {
  require(floor_hi > floor_lo, "floor_hi must exceed floor_lo");
  check_gray_area(frames, out_h, out_w);
  const int64_t first = anchor.is_none() ? 0 : 1, m = first + frames.shape(0), plane = out_h * out_w;
  carray<float> stack({m, out_h, out_w});
  float* dst = stack.mutable_data();
  if (first) {
    const auto ref = anchor.cast<carray<float>>();
    require(ref.ndim() == 2 && ref.shape(0) == out_h && ref.shape(1) == out_w, "anchor must be (out_h, out_w)");
    std::copy(ref.data(), ref.data() + plane, dst);
  }
  gray_area_into(frames, out_h, out_w, dst + first * plane);
  if (m < 2) return py::make_tuple(stack, carray<float>(0));
  const py::tuple flow = lk_flow_impl<float>(stack, window, min_eig, levels, Statistic{moving, floor_lo, floor_hi},
                                             min_area, guess_box, search_radius, 1.0f);
  return py::make_tuple(stack, score_of(flow[0].cast<carray<float>>()));
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_motion, m) {
  namespace py = pybind11;
  m.doc() = "Pyramidal Lucas-Kanade motion magnitude (fused CPU kernel); see streammem_kernels/motion.py";
  m.def("lk_flow", &streammem::lk_flow, py::arg("gray"), py::arg("window"), py::arg("min_eig"), py::arg("levels"),
        py::arg("moving"), py::arg("floor_lo"), py::arg("floor_hi"), py::arg("min_area"), py::arg("guess_box"),
        py::arg("search_radius"),
        "(T,H,W) uint8|float32 gray -> (flow_px (T-1,), mean_uv (T-1,2))");
  m.def("gray_area", &streammem::gray_area, py::arg("frames"), py::arg("out_h"), py::arg("out_w"),
        "uint8 (T,H,W[,3]) -> float32 gray in [0,1] (T,out_h,out_w), area resampling");
  m.def("motion_u8", &streammem::motion_u8, py::arg("frames"), py::arg("out_h"), py::arg("out_w"), py::arg("window"),
        py::arg("min_eig"), py::arg("levels"), py::arg("moving"), py::arg("floor_lo"), py::arg("floor_hi"),
        py::arg("min_area"), py::arg("guess_box"), py::arg("search_radius"),
        "uint8 (T,H,W[,3]) frames -> (flow_px (T-1,), score (T-1,), mean_uv (T-1,2)): gray, resize and lk_flow");
  m.def("gate_u8", &streammem::gate_u8, py::arg("frames"), py::arg("anchor"), py::arg("out_h"), py::arg("out_w"),
        py::arg("window"), py::arg("min_eig"), py::arg("levels"), py::arg("moving"), py::arg("floor_lo"),
        py::arg("floor_hi"), py::arg("min_area"), py::arg("guess_box"), py::arg("search_radius"),
        "uint8 (n,H,W[,3]) frames after the reference gray anchor (out_h,out_w) or None -> (gray stack (m,out_h,out_w), "
        "score (m-1,))");
}
