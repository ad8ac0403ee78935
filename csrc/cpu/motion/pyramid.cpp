// The levels of the pyramidal Lucas-Kanade motion of every consecutive frame pair: lk_flow_into.
//
// Work: the pyramids of a chunk of frames (OpenMP over frames), the coarsest level's whole-pixel
// shift search (integer sums: the reference's shift exactly) and the coarse levels of each pair
// with their guess smoothing (OpenMP over pairs), then level 0 over (pair, strip) items (strips
// split a pair only when there are fewer pairs than threads), and each pair's summary.
#include "motion.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace streammem {
namespace motion {
namespace {

constexpr int64_t kChunkPairs = 64;  // pairs whose pyramids and guesses are held at once

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

}  // namespace

template <typename T>
void lk_flow_into(const T* frames, int64_t T_, int64_t H, int64_t W, float scale, const LkParams& params, float* flow,
                  float* uv) {
  const int w = params.window, levels = params.levels;
  const float min_eig = params.min_eig;
  const Statistic stat = params.stat;
  std::vector<int64_t> lh{H}, lw{W};  // the level sizes, finest first (reference.level_shapes)
  for (int l = 1; l < levels; ++l) {
    lh.push_back((lh.back() + 1) / 2);
    lw.push_back((lw.back() + 1) / 2);
  }
  const int64_t pairs = T_ - 1;
  const T* base = frames;
  {
    py::gil_scoped_release nogil;
    std::vector<PairSums> totals(pairs);
    auto no_guess = [](int64_t) { return Guess{}; };
    if (levels == 1) {
      level0_sums<T>(base, 0, pairs, H, W, w, scale, min_eig, stat, no_guess, totals);
    } else {
      // The levels LK runs on, coarsest first: all but level 1 when there are three or more
      // (reference.solved_levels); level 0's guess comes from `last` (1 or 2), factor 2^last.
      // The coarsest level starts from the searched shift (factor 1).
      std::vector<int> solved{levels - 1};
      const int top = levels - 1;
      const int ry = static_cast<int>(std::min<int64_t>(lh[top] / 4, params.search_radius));
      const int rx = static_cast<int>(std::min<int64_t>(lw[top] / 4, params.search_radius));
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
        // The rule of level 0's sums (pixels of the pairs, not of the frames): a single 224 x 168 pair
        // stays on the calling thread, where a second thread's wake-up and barrier cost about what it
        // saves on an idle machine and more when another process holds a core.
        const bool parallel = n * H * W >= (int64_t{1} << 16);
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
            search_shift(prev, prev + lh[top] * lw[top], lh[top], lw[top], ry, rx, params.search_quant, shift,
                         shift + 1);
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
            smooth_guess(sink.u, sink.v, sink.valid, ho, wo, params.guess_box, factor, lh[finer], lw[finer], gx,
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
    const double floor = stat.moving ? std::max(1.0, params.min_area * static_cast<double>((H - 1 - w) * (W - 1 - w)))
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
}

template void lk_flow_into<uint8_t>(const uint8_t*, int64_t, int64_t, int64_t, float, const LkParams&, float*, float*);
template void lk_flow_into<float>(const float*, int64_t, int64_t, int64_t, float, const LkParams&, float*, float*);

}  // namespace motion
}  // namespace streammem
