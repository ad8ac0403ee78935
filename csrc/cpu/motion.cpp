// Lucas-Kanade motion magnitude, fused CPU kernel.
//
// Contract (see streammem_kernels/motion.py, which is the spec):
//   lk_flow(gray (T,H,W) uint8|float32, window (odd >= 3, or 0 = global),
//           min_eig) -> (flow_px (T-1,) float32, mean_uv (T-1,2) float32)
//
// One pass per (pair, row strip): for each gradient row, the five structure
// products Ix^2, IxIy, Iy^2, IxIt, IyIt are computed once into a ring of
// `window` rows; running column sums over the ring give the vertical box sum,
// a direct w-tap horizontal sum gives the window sum, then the closed-form 2x2
// solve and the reduction.  Nothing of size (H, W) is ever allocated.
// OpenMP runs over (pair, strip) work items; strips only split a pair when
// there are fewer pairs than threads.
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace streammem {
namespace {

constexpr int kLanes = 8;  // independent accumulators so the reductions vectorise

struct PairSums {
  double mag = 0, u = 0, v = 0, count = 0;  // window mode
  double s[5] = {0, 0, 0, 0, 0};            // global mode: summed products
};

template <typename T>
STREAMMEM_HOT void mean_row(const T* __restrict prev, const T* __restrict cur, int64_t W, int64_t r, float half,
                            float* __restrict dst) {
  const T* p = prev + r * W;
  const T* c = cur + r * W;
  for (int64_t x = 0; x < W; ++x) dst[x] = (static_cast<float>(p[x]) + static_cast<float>(c[x])) * half;
}

// Gradient row g (image row g+1) from the mean rows g, g+1, g+2.
template <typename T>
STREAMMEM_HOT void product_row(const T* __restrict prev, const T* __restrict cur, int64_t W, int64_t g,
                               float scale, const float* __restrict m0, const float* __restrict m1,
                               const float* __restrict m2, float* __restrict out) {
  const T* pc = prev + (g + 1) * W + 1;
  const T* cc = cur + (g + 1) * W + 1;
  const int64_t Wg = W - 2;
  float* pxx = out;
  float* pxy = out + Wg;
  float* pyy = out + 2 * Wg;
  float* pxt = out + 3 * Wg;
  float* pyt = out + 4 * Wg;
  for (int64_t x = 0; x < Wg; ++x) {
    // Sobel / 8: intensity change per pixel.
    const float ix = ((m0[x + 2] - m0[x]) + 2.0f * (m1[x + 2] - m1[x]) + (m2[x + 2] - m2[x])) * 0.125f;
    const float iy = ((m2[x] - m0[x]) + 2.0f * (m2[x + 1] - m0[x + 1]) + (m2[x + 2] - m0[x + 2])) * 0.125f;
    const float it = (static_cast<float>(cc[x]) - static_cast<float>(pc[x])) * scale;
    pxx[x] = ix * ix;
    pxy[x] = ix * iy;
    pyy[x] = iy * iy;
    pxt[x] = ix * it;
    pyt[x] = iy * it;
  }
}

STREAMMEM_HOT void add_rows(float* __restrict acc, const float* __restrict row, int64_t n, float sign) {
  for (int64_t x = 0; x < n; ++x) acc[x] += sign * row[x];
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

// Closed-form 2x2 solve of each pixel's window sums.  A separate function with
// plain restrict pointers so the loop vectorises.
STREAMMEM_HOT void solve_pixels(const float* __restrict sa, const float* __restrict sb, const float* __restrict sc,
                                const float* __restrict sx, const float* __restrict sy, float* __restrict mag,
                                float* __restrict us, float* __restrict vs, float* __restrict ns, int64_t Wo,
                                float inv_area, float min_eig) {
  for (int64_t x = 0; x < Wo; ++x) {
    const float a = sa[x] * inv_area, b = sb[x] * inv_area, c = sc[x] * inv_area;
    const float bx = -sx[x] * inv_area, by = -sy[x] * inv_area;
    const float det = a * c - b * b;
    const float lmax = 0.5f * ((a + c) + std::sqrt((a - c) * (a - c) + 4.0f * b * b));
    // Branch-free (float masks) so the loop vectorises; same decisions as the
    // reference: valid iff lambda_max > 0 and det / lambda_max > min_eig.
    const float lmin = det / (lmax > 0.0f ? lmax : 1.0f);
    const float validf = (lmax > 0.0f && lmin > min_eig) ? 1.0f : 0.0f;
    const float inv_det = validf / (validf != 0.0f ? det : 1.0f);
    const float u = (c * bx - b * by) * inv_det;
    const float v = (a * by - b * bx) * inv_det;
    mag[x] = std::sqrt(u * u + v * v);
    us[x] = u;
    vs[x] = v;
    ns[x] = validf;
  }
}

// Window sums of one output row from the column sums, solve, and reduce.
// scratch holds 5 + 4 rows of Wo floats.
STREAMMEM_HOT void solve_row(const float* __restrict col, int64_t Wg, int w, float inv_area, float min_eig,
                             float* __restrict scratch, PairSums& out) {
  const int64_t Wo = Wg - w + 1;
  for (int c = 0; c < 5; ++c) {
    float* __restrict dst = scratch + c * Wo;
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
  float* mag = scratch + 5 * Wo;
  float* us = scratch + 6 * Wo;
  float* vs = scratch + 7 * Wo;
  float* ns = scratch + 8 * Wo;
  solve_pixels(scratch, scratch + Wo, scratch + 2 * Wo, scratch + 3 * Wo, scratch + 4 * Wo, mag, us, vs, ns, Wo,
               inv_area, min_eig);
  out.mag += lane_sum(mag, Wo);
  out.u += lane_sum(us, Wo);
  out.v += lane_sum(vs, Wo);
  out.count += lane_sum(ns, Wo);
}

STREAMMEM_HOT void sum_row(const float* __restrict prod, int64_t Wg, PairSums& out) {
  for (int c = 0; c < 5; ++c) out.s[c] += lane_sum(prod + c * Wg, Wg);
}

// Output rows [r0, r1) of one pair (window-output coordinates; global mode:
// gradient rows).
template <typename T>
void run_strip(const T* prev, const T* cur, int64_t H, int64_t W, int w, float scale, float min_eig, int64_t r0,
               int64_t r1, PairSums& out) {
  const int64_t Wg = W - 2;
  // Ring of the last three mean rows: each image row is converted once per strip.
  std::vector<float> mean_ring(3 * W);
  int64_t next_row = r0;
  auto products = [&](int64_t g, float* out) {
    for (; next_row <= g + 2; ++next_row)
      mean_row(prev, cur, W, next_row, 0.5f * scale, mean_ring.data() + (next_row % 3) * W);
    product_row(prev, cur, W, g, scale, mean_ring.data() + (g % 3) * W, mean_ring.data() + ((g + 1) % 3) * W,
                mean_ring.data() + ((g + 2) % 3) * W, out);
  };
  if (w == 0) {
    std::vector<float> prod(5 * Wg);
    for (int64_t g = r0; g < r1; ++g) {
      products(g, prod.data());
      sum_row(prod.data(), Wg, out);
    }
    return;
  }
  const int64_t Wo = Wg - w + 1;
  std::vector<float> ring(static_cast<size_t>(w) * 5 * Wg);  // the last w product rows
  std::vector<float> col(5 * Wg, 0.0f);                      // vertical box sums
  std::vector<float> scratch(9 * Wo);
  const float inv_area = 1.0f / static_cast<float>(w * w);
  auto slot = [&](int64_t g) { return ring.data() + (g % w) * 5 * Wg; };
  for (int64_t g = r0; g < r0 + w - 1; ++g) {
    products(g, slot(g));
    add_rows(col.data(), slot(g), 5 * Wg, 1.0f);
  }
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t g = r + w - 1;
    products(g, slot(g));
    add_rows(col.data(), slot(g), 5 * Wg, 1.0f);
    solve_row(col.data(), Wg, w, inv_area, min_eig, scratch.data(), out);
    add_rows(col.data(), slot(r), 5 * Wg, -1.0f);
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

template <typename T>
py::tuple lk_flow_impl(const carray<T>& gray, int window, float min_eig, float scale) {
  require(gray.ndim() == 3, "gray must be (T, H, W)");
  const int64_t T_ = gray.shape(0), H = gray.shape(1), W = gray.shape(2);
  require(T_ >= 2, "gray must hold at least 2 frames");
  require(window == 0 || (window >= 3 && window % 2 == 1), "window must be 0 or odd >= 3");
  const int w = window;
  require(H >= (w ? w : 1) + 2 && W >= (w ? w : 1) + 2, "frames too small for the window");
  const int64_t pairs = T_ - 1;
  const int64_t out_rows = w ? (H - 2 - w + 1) : (H - 2);
  const int threads = max_threads();
  const int64_t strips = std::min<int64_t>(out_rows, std::max<int64_t>(1, (2 * threads + pairs - 1) / pairs));
  const int64_t items = pairs * strips;

  carray<float> flow_px(pairs);
  carray<float> mean_uv({pairs, static_cast<int64_t>(2)});
  const T* base = gray.data();
  float* flow = flow_px.mutable_data();
  float* uv = mean_uv.mutable_data();
  {
    py::gil_scoped_release nogil;
    std::vector<PairSums> partial(items);
    // Small clips stay on the calling thread: waking a team costs more than the work.
    const bool parallel = items > 1 && pairs * H * W >= (int64_t{1} << 16);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t p = item / strips, s = item % strips;
      const int64_t r0 = out_rows * s / strips, r1 = out_rows * (s + 1) / strips;
      run_strip<T>(base + p * H * W, base + (p + 1) * H * W, H, W, w, scale, min_eig, r0, r1, partial[item]);
    }
    for (int64_t p = 0; p < pairs; ++p) {
      PairSums total;
      for (int64_t s = 0; s < strips; ++s) {
        const PairSums& q = partial[p * strips + s];
        total.mag += q.mag;
        total.u += q.u;
        total.v += q.v;
        total.count += q.count;
        for (int c = 0; c < 5; ++c) total.s[c] += q.s[c];
      }
      if (w == 0) {
        solve_global(total, static_cast<double>(H - 2) * static_cast<double>(W - 2), min_eig, flow + p, uv + 2 * p);
      } else {
        const double n = std::max(total.count, 1.0);
        flow[p] = static_cast<float>(total.mag / n);
        uv[2 * p] = static_cast<float>(total.u / n);
        uv[2 * p + 1] = static_cast<float>(total.v / n);
      }
    }
  }
  return py::make_tuple(flow_px, mean_uv);
}

py::tuple lk_flow(py::array gray, int window, float min_eig) {
  if (py::isinstance<carray<uint8_t>>(gray) && gray.dtype().is(py::dtype::of<uint8_t>()))
    return lk_flow_impl<uint8_t>(gray.cast<carray<uint8_t>>(), window, min_eig, 1.0f / 255.0f);
  if (gray.dtype().is(py::dtype::of<float>()))
    return lk_flow_impl<float>(gray.cast<carray<float>>(), window, min_eig, 1.0f);
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

carray<float> gray_area(const py::array_t<uint8_t, py::array::c_style>& frames, int64_t oh, int64_t ow) {
  require(frames.ndim() == 3 || (frames.ndim() == 4 && frames.shape(3) == 3), "frames must be (T,H,W) or (T,H,W,3)");
  const int64_t T_ = frames.shape(0), H = frames.shape(1), W = frames.shape(2);
  const int64_t C = frames.ndim() == 4 ? 3 : 1;
  require(oh >= 1 && ow >= 1 && oh <= H && ow <= W, "output size must be within the input size");
  carray<float> out({T_, oh, ow});
  const uint8_t* src = frames.data();
  float* dst = out.mutable_data();
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
  return out;
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_motion, m) {
  namespace py = pybind11;
  m.doc() = "Lucas-Kanade motion magnitude (fused CPU kernel); see streammem_kernels/motion.py";
  m.def("lk_flow", &streammem::lk_flow, py::arg("gray"), py::arg("window"), py::arg("min_eig"),
        "(T,H,W) uint8|float32 gray -> (flow_px (T-1,), mean_uv (T-1,2))");
  m.def("gray_area", &streammem::gray_area, py::arg("frames"), py::arg("out_h"), py::arg("out_w"),
        "uint8 (T,H,W[,3]) -> float32 gray in [0,1] (T,out_h,out_w), area resampling");
}
