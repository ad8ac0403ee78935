// The "streamchat" statistic: StreamChat's gate reading of float32 gray pairs, single scale
// (streammem_kernels/motion/reference.py: streamchat_products, window_average x window^2,
// streamchat_fields, summarise_streamchat).  Every float32 operation is the reference's, in its
// order (row-major window sums from 0, then / w^2 and x w^2 as avg_pool2d(...) * w^2 rounds), so
// the per-window fields are the reference's bit for bit; only the float64 sum over the windows
// runs in another order than torch's (each output row's, then the rows' in order).
//
// Contraction into fused multiply-adds would change the roundings of a*c - b*b and the products:
// it is switched off here (the module is built with -ffp-contract=fast, and -march=native or the
// x86-64-v3 clone of STREAMMEM_HOT offer FMA instructions).
#include "motion.h"

#include <cmath>
#include <cstdint>

#pragma GCC optimize("fp-contract=off")

namespace streammem {
namespace motion {
namespace {

// One row y of the five products Ix^2, IxIy, Iy^2, IxIt, IyIt (planes of H x W) of one pair: the
// unscaled 3x3 Sobel of the zero-padded previous frame `padded` ((H + 2) x (W + 2)), It = cur - prev.
STREAMMEM_HOT void product_row(const float* __restrict padded, const float* __restrict prev,
                               const float* __restrict cur, int64_t H, int64_t W, int64_t y,
                               float* __restrict prods) {
  const int64_t Wp = W + 2, plane = H * W;
  const float* r0 = padded + y * Wp;  // padded rows y, y+1, y+2 are frame rows y-1, y, y+1
  const float* r1 = r0 + Wp;
  const float* r2 = r1 + Wp;
  float* out = prods + y * W;
  for (int64_t x = 0; x < W; ++x) {
    // across: right minus left on each row; down: bottom minus top on each column (reference order).
    const float a0 = r0[x + 2] - r0[x], a1 = r1[x + 2] - r1[x], a2 = r2[x + 2] - r2[x];
    const float d0 = r2[x] - r0[x], d1 = r2[x + 1] - r0[x + 1], d2 = r2[x + 2] - r0[x + 2];
    const float ix = (a0 + 2.0f * a1) + a2;
    const float iy = (d0 + 2.0f * d1) + d2;
    const float it = cur[y * W + x] - prev[y * W + x];
    out[x] = ix * ix;
    out[plane + x] = ix * iy;
    out[2 * plane + x] = iy * iy;
    out[3 * plane + x] = ix * it;
    out[4 * plane + x] = iy * it;
  }
}

// One row i of window outputs: each product summed over its window in row-major order from 0 (a
// vector of Wo sums per plane, one (dy, dx) term at a time, so every sum keeps that order), then the
// regularised solve; row_sums gets the row's float64 sums of the reading, u and v.
STREAMMEM_HOT void reading_row(const float* __restrict prods, int64_t H, int64_t W, int w, float eps, int64_t i,
                               float* __restrict sums, double* __restrict row_sums) {
  const int64_t Wo = W - w + 1, plane = H * W;
  const float area = static_cast<float>(w * w);
  for (int k = 0; k < 5; ++k) {
    float* total = sums + k * Wo;
    for (int64_t j = 0; j < Wo; ++j) total[j] = 0.0f;
    for (int dy = 0; dy < w; ++dy) {
      for (int dx = 0; dx < w; ++dx) {
        const float* src = prods + k * plane + (i + dy) * W + dx;
        for (int64_t j = 0; j < Wo; ++j) total[j] += src[j];
      }
    }
    for (int64_t j = 0; j < Wo; ++j) total[j] = (total[j] / area) * area;  // avg_pool2d(...) * w^2
  }
  double sum_mag = 0.0, sum_u = 0.0, sum_v = 0.0;
  for (int64_t j = 0; j < Wo; ++j) {
    const float a = sums[j] + eps, b = sums[Wo + j], c = sums[2 * Wo + j] + eps;
    const float rx = -sums[3 * Wo + j], ry = -sums[4 * Wo + j];
    const float det = a * c - b * b;
    const float u = (c * rx - b * ry) / det;
    const float v = (a * ry - b * rx) / det;
    const float uu = u * u;
    sum_mag += static_cast<double>(static_cast<float>(std::sqrt(static_cast<double>(uu + uu))));
    sum_u += static_cast<double>(u);
    sum_v += static_cast<double>(v);
  }
  row_sums[0] = sum_mag;
  row_sums[1] = sum_u;
  row_sums[2] = sum_v;
}

}  // namespace

void streamchat_flow_into(const float* gray, int64_t T_, int64_t H, int64_t W, int window, float eps, float* flow_px,
                          float* mean_uv) {
  const int64_t plane = H * W, Ho = H - window + 1, Wo = W - window + 1;
  auto padded = buffer<float>((H + 2) * (W + 2));
  auto prods = buffer<float>(5 * plane);
  auto row_sums = buffer<double>(3 * Ho);
  const bool parallel = plane >= (int64_t{1} << 12);
  py::gil_scoped_release nogil;
  for (int64_t p = 0; p + 1 < T_; ++p) {
    const float* prev = gray + p * plane;
    const float* cur = prev + plane;
    float* pad = padded.get();
    for (int64_t i = 0; i < W + 2; ++i) pad[i] = pad[(H + 1) * (W + 2) + i] = 0.0f;
    for (int64_t y = 0; y < H; ++y) {
      float* row = pad + (y + 1) * (W + 2);
      row[0] = row[W + 1] = 0.0f;
      for (int64_t x = 0; x < W; ++x) row[x + 1] = prev[y * W + x];
    }
    // Rows are independent; each output row's sums are kept apart and added in row order below, so
    // the result does not depend on the number of threads.
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static)
      for (int64_t y = 0; y < H; ++y) product_row(pad, prev, cur, H, W, y, prods.get());
      std::unique_ptr<float[]> sums = buffer<float>(5 * Wo);
#pragma omp for schedule(static)
      for (int64_t i = 0; i < Ho; ++i) reading_row(prods.get(), H, W, window, eps, i, sums.get(), &row_sums[3 * i]);
    }
    double total[3] = {0.0, 0.0, 0.0};
    for (int64_t i = 0; i < Ho; ++i) {
      for (int k = 0; k < 3; ++k) total[k] += row_sums[3 * i + k];
    }
    const double count = static_cast<double>(Ho * Wo);
    flow_px[p] = static_cast<float>(total[0] / count);
    mean_uv[2 * p] = static_cast<float>(total[1] / count);
    mean_uv[2 * p + 1] = static_cast<float>(total[2] / count);
  }
}

}  // namespace motion
}  // namespace streammem
