// The "streamchat" statistic: StreamChat's gate reading of float32 gray pairs, single scale
// (streammem_kernels/motion/reference.py: streamchat_products, window_average x window^2,
// streamchat_fields, summarise_streamchat).  Every float32 operation is the reference's, in its
// order (row-major window sums from 0, then / w^2 and x w^2 as avg_pool2d(...) * w^2 rounds), so
// the per-window fields are the reference's bit for bit; only the float64 sum over the windows
// runs in another order than torch's.
//
// Contraction into fused multiply-adds would change the roundings of a*c - b*b and the products:
// it is switched off here (the module is built with -ffp-contract=fast, and -march=native or a
// target clone may offer FMA instructions).
#include "motion.h"

#include <cmath>
#include <cstdint>

#pragma GCC optimize("fp-contract=off")

namespace streammem {
namespace motion {
namespace {

// The five products Ix^2, IxIy, Iy^2, IxIt, IyIt (planes of H x W) of one pair: the unscaled
// 3x3 Sobel of the zero-padded previous frame, It = cur - prev.
void pair_products(const float* prev, const float* cur, int64_t H, int64_t W, float* padded, float* prods) {
  const int64_t Wp = W + 2, plane = H * W;
  for (int64_t i = 0; i < (H + 2) * Wp; ++i) padded[i] = 0.0f;
  for (int64_t y = 0; y < H; ++y) {
    for (int64_t x = 0; x < W; ++x) padded[(y + 1) * Wp + x + 1] = prev[y * W + x];
  }
  for (int64_t y = 0; y < H; ++y) {
    const float* r0 = padded + y * Wp;  // padded rows y, y+1, y+2 are frame rows y-1, y, y+1
    const float* r1 = r0 + Wp;
    const float* r2 = r1 + Wp;
    for (int64_t x = 0; x < W; ++x) {
      // across: right minus left on each row; down: bottom minus top on each column (reference order).
      const float a0 = r0[x + 2] - r0[x], a1 = r1[x + 2] - r1[x], a2 = r2[x + 2] - r2[x];
      const float d0 = r2[x] - r0[x], d1 = r2[x + 1] - r0[x + 1], d2 = r2[x + 2] - r0[x + 2];
      const float ix = (a0 + 2.0f * a1) + a2;
      const float iy = (d0 + 2.0f * d1) + d2;
      const int64_t at = y * W + x;
      const float it = cur[at] - prev[at];
      prods[at] = ix * ix;
      prods[plane + at] = ix * iy;
      prods[2 * plane + at] = iy * iy;
      prods[3 * plane + at] = ix * it;
      prods[4 * plane + at] = iy * it;
    }
  }
}

// One pair's mean reading, u and v over every valid window (float64 sums, row-major).
void pair_reading(const float* prods, int64_t H, int64_t W, int w, float eps, float* flow_px, float* mean_uv) {
  const int64_t Ho = H - w + 1, Wo = W - w + 1, plane = H * W;
  const float area = static_cast<float>(w * w);
  double sum_mag = 0.0, sum_u = 0.0, sum_v = 0.0;
  for (int64_t i = 0; i < Ho; ++i) {
    for (int64_t j = 0; j < Wo; ++j) {
      float s[5];
      for (int k = 0; k < 5; ++k) {
        const float* p = prods + k * plane + i * W + j;
        float total = 0.0f;
        for (int dy = 0; dy < w; ++dy) {
          for (int dx = 0; dx < w; ++dx) total += p[dy * W + dx];
        }
        s[k] = (total / area) * area;  // avg_pool2d(...) * w^2, rounded twice as in StreamChat
      }
      const float a = s[0] + eps, b = s[1], c = s[2] + eps, rx = -s[3], ry = -s[4];
      const float det = a * c - b * b;
      const float u = (c * rx - b * ry) / det;
      const float v = (a * ry - b * rx) / det;
      const float uu = u * u;
      sum_mag += static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(uu + uu))));
      sum_u += static_cast<double>(u);
      sum_v += static_cast<double>(v);
    }
  }
  const double count = static_cast<double>(Ho * Wo);
  *flow_px = static_cast<float>(sum_mag / count);
  mean_uv[0] = static_cast<float>(sum_u / count);
  mean_uv[1] = static_cast<float>(sum_v / count);
}

}  // namespace

void streamchat_flow_into(const float* gray, int64_t T_, int64_t H, int64_t W, int window, float eps, float* flow_px,
                          float* mean_uv) {
  const int64_t pairs = T_ - 1, plane = H * W;
  py::gil_scoped_release nogil;
#pragma omp parallel if (pairs > 1 && pairs * plane >= (int64_t{1} << 16))
  {
    auto padded = buffer<float>((H + 2) * (W + 2));
    auto prods = buffer<float>(5 * plane);
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < pairs; ++p) {
      pair_products(gray + p * plane, gray + (p + 1) * plane, H, W, padded.get(), prods.get());
      pair_reading(prods.get(), H, W, window, eps, flow_px + p, mean_uv + 2 * p);
    }
  }
}

}  // namespace motion
}  // namespace streammem
