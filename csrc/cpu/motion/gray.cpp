// uint8 frames (T, H, W) or (T, H, W, 3) to float32 gray in [0, 1] at the working size (T, oh, ow):
// area resampling with torch's adaptive_avg_pool2d bins [floor(i H / oh), ceil((i + 1) H / oh))
// (what F.interpolate(mode="area") uses).  Gray and area averaging are both linear, so each bin
// is averaged in gray.
#include "motion.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace streammem {
namespace motion {
namespace {

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

}  // namespace

void gray_area_into(const uint8_t* src, int64_t T_, int64_t H, int64_t W, int64_t C, int64_t oh, int64_t ow,
                    float* dst) {
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
    // Two frames of 224 x 168 (a single pair) stay on the calling thread; larger inputs (a pair at
    // 640 x 480 resized to 224) and clips use the team.
#pragma omp parallel if (T_ * H * W >= (int64_t{1} << 17))
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

}  // namespace motion
}  // namespace streammem
