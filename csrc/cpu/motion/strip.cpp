// One level of one pair, one pass per row strip, and the guess it hands the next finer level.
//
// For each image row: the previous frame's row, the current frame's row moved by the coarser
// level's whole-pixel offsets (a copy), their mean and the [1 2 1] row sum of their difference go
// into rings of three rows; each gradient row's five structure products go into a ring of
// `window` rows; running column sums over that ring give the vertical box sum, a direct w-tap
// horizontal sum the window sum, then the closed-form 2x2 solve, the composition with the
// offsets, and either the frame's weighted sums (level 0) or the level's flow (coarser levels,
// which are small).  Nothing of size (H, W) is allocated per pair.  Windows are summed in
// another order than the reference's (float32 rounding; the tolerance is declared on LK_FLOW).
#include "motion.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace streammem {
namespace motion {
namespace {

constexpr int kLanes = 8;  // independent accumulators so the reductions vectorise

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

}  // namespace

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

template void run_strip<uint8_t>(const LevelPair<uint8_t>&, int, float, int64_t, int64_t, const RowSink&);
template void run_strip<float>(const LevelPair<float>&, int, float, int64_t, int64_t, const RowSink&);

}  // namespace motion
}  // namespace streammem
