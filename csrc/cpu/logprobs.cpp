// Gathered token log-probabilities and the caption divergence point, CPU kernels.
//
// Contract (see streammem_kernels/logprobs.py, which is the spec):
//   token_logprobs(logits (N,V) float32|raw fp16/bf16 bits, unit column stride,
//                  dtype code, targets (N,) int64) -> (N,) float32
//   linear_token_logprobs(hidden (N,H), weight (V,H), bias (V,) or None,
//                         dtype code, targets (N,) int64) -> (N,) float32
//   divergence_point(logprobs (B,L) float64, lengths (B,) int64,
//                    delta, alpha, beta) -> (B,) int64
//   token_logprobs_ptr / divergence_point_ptr: the same on raw pointers of C-contiguous CPU
//                    tensors, with the public functions' value checks (the per-call fast paths)
//
// token_logprobs: OpenMP over rows; per row a max pass and a sum-of-exp pass
// (two passes over a row that sits in L2 beat an online rescale per element),
// float32 accumulation, a polynomial exp that vectorises.
//
// linear_token_logprobs: the vocabulary is split into tiles of kVocabTile rows
// of the LM head, distributed over threads.  A thread packs its weight tile
// into 16-column panels (H x 16 floats, the B operand of a 6x16 register-
// blocked FMA micro-kernel), multiplies every hidden row block against it into
// a small (rows x kVocabTile) logits scratch, and folds that scratch into its
// own per-row running max / running sum / target logit.  The per-thread states
// are merged once at the end.  Nothing of size (N, V) exists.
#include "common.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace streammem {
namespace {

enum DtypeCode : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline float bf16_to_float(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float fp16_to_float(uint16_t bits) {
  // IEEE half -> float by bit manipulation (exact, handles subnormals/inf/nan).
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Convert n elements of a raw buffer to float.
inline void load_row(const void* src, int code, int64_t n, float* __restrict dst) {
  if (code == kFloat32) {
    std::memcpy(dst, src, n * sizeof(float));
  } else if (code == kBFloat16) {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
  } else {
    const uint16_t* s = static_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_float(s[i]);
  }
}

// exp(x) for x <= 0 (arguments are logit - max), branch-free so loops over it
// vectorise: 2^n * p(r) with r = x - n ln2 in [-ln2/2, ln2/2] and a degree-6
// polynomial (relative error ~2e-7).  NaN propagates through r; results below
// e^-87 flush to 0, which is far below float32 resolution of the >= 1 sum.
inline float exp_nonpositive(float x) {
  const float clamped = x < -87.0f ? -87.0f : x;
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  const float r = (clamped - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  const float value = p * scale;
  return x < -87.0f ? 0.0f * p : value;  // 0 * p keeps NaN a NaN
}

STREAMMEM_HOT float row_max(const float* __restrict x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

STREAMMEM_HOT float row_sum_exp(const float* __restrict x, int64_t n, float shift) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += exp_nonpositive(x[i] - shift);
  return s;
}

// NaN-propagating row scan: the max reduction ignores NaN, so it is re-checked.
STREAMMEM_HOT bool row_has_nan(const float* __restrict x, int64_t n) {
  int bad = 0;
#pragma omp simd reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) bad |= (x[i] != x[i]);
  return bad != 0;
}

// The kernel on raw rows: N rows of V logits `row_stride` bytes apart, targets in [0, V).
void token_logprobs_rows(const char* base, int64_t row_stride, int code, int64_t N, int64_t V,
                         const int64_t* tgt, float* o) {
  py::gil_scoped_release release;
#pragma omp parallel
  {
    std::vector<float> buffer(code == kFloat32 ? 0 : V);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const void* raw = base + r * row_stride;
      const float* x;
      if (code == kFloat32) {
        x = static_cast<const float*>(raw);
      } else {
        load_row(raw, code, V, buffer.data());
        x = buffer.data();
      }
      const float m = row_max(x, V);
      const float s = row_sum_exp(x, V, m);
      const float lp = x[tgt[r]] - m - std::log(s);
      o[r] = row_has_nan(x, V) ? std::numeric_limits<float>::quiet_NaN() : lp;
    }
  }
}

py::array_t<float> token_logprobs(py::array logits, int code, carray<int64_t> targets) {
  require(logits.ndim() == 2, "logits must be 2-d (N, V)");
  require(code == kFloat32 || code == kFloat16 || code == kBFloat16, "unknown dtype code");
  const int64_t elem = code == kFloat32 ? 4 : 2;
  require(logits.itemsize() == elem, "logits itemsize does not match its dtype code");
  const int64_t N = logits.shape(0), V = logits.shape(1);
  require(V >= 1, "logits must have V >= 1");
  require(logits.strides(1) == elem, "logits must have a unit vocabulary stride");
  require(targets.ndim() == 1 && targets.shape(0) == N, "targets must have shape (N,)");
  py::array_t<float> out(N);
  token_logprobs_rows(static_cast<const char*>(logits.data()), logits.strides(0), code, N, V, targets.data(),
                      out.mutable_data());
  return out;
}

// token_logprobs with the public function's value checks (logprobs.py's fast path on C-contiguous CPU
// tensors): targets in [0, V) before any work, and NaN rows after it, each a ValueError with the
// message of the general path (the offending range; the first five NaN rows).
py::array_t<float> token_logprobs_ptr(std::uintptr_t logits, int64_t N, int64_t V, int code,
                                      std::uintptr_t targets) {
  require(code == kFloat32 || code == kFloat16 || code == kBFloat16, "unknown dtype code");
  require(N >= 1 && V >= 1, "logits must be a non-empty (N, V) block");
  const int64_t* tgt = in_ptr<int64_t>(targets);
  int64_t low = tgt[0], high = tgt[0];
  for (int64_t r = 1; r < N; ++r) {
    low = std::min(low, tgt[r]);
    high = std::max(high, tgt[r]);
  }
  if (low < 0 || high >= V) {
    throw std::invalid_argument("targets must be token ids in [0, V) = [0, " + std::to_string(V) +
                                "), got values in [" + std::to_string(low) + ", " + std::to_string(high) + "]");
  }
  const int64_t elem = code == kFloat32 ? 4 : 2;
  py::array_t<float> out(N);
  float* o = out.mutable_data();
  token_logprobs_rows(in_ptr<char>(logits), V * elem, code, N, V, tgt, o);
  std::string rows;
  int found = 0;
  for (int64_t r = 0; r < N && found < 5; ++r) {
    if (o[r] != o[r]) rows += (found++ ? ", " : "") + std::to_string(r);
  }
  if (found) {
    throw std::invalid_argument("logits must be finite: rows [" + rows +
                                "] produced NaN (a NaN or +inf logit, or a row that is all -inf)");
  }
  return out;
}

// ---------------------------------------------------------------------------
// Linear form: packed 6x16 FMA micro-kernel
// ---------------------------------------------------------------------------
constexpr int kRows = 6;         // hidden rows per micro-tile (MR)
constexpr int kCols = 16;        // vocabulary columns per micro-tile (NR): two 8-float vectors
constexpr int kVocabTile = 128;  // weight rows per thread task: 128 x H floats stay in L2
constexpr int kRowBlock = 96;    // hidden rows per logits scratch block

using simd::kTileRows;
static_assert(kRows == kTileRows, "the micro-tile is simd::fma_tile's 6 rows");

// logits[0..5][0..15] = sum_h a_panel[h][r] * b_panel[h][c] over H.
// a_panel: H x 6 (hidden rows interleaved), b_panel: H x 16 (weight columns).
STREAMMEM_HOT void micro_kernel(const float* __restrict a_panel, const float* __restrict b_panel, int64_t H,
                                float* __restrict out, int64_t out_stride) {
  simd::v8f acc[kRows][2] = {};
  simd::fma_tile<2>([a_panel](int r, int64_t h) { return a_panel[h * kRows + r]; }, b_panel, kCols, 0, H, acc);
  for (int r = 0; r < kRows; ++r) {
    simd::store8(out + r * out_stride, acc[r][0]);
    simd::store8(out + r * out_stride + 8, acc[r][1]);
  }
}

struct RowState {
  std::vector<float> max, sum, target;
  explicit RowState(int64_t n)
      : max(n, -std::numeric_limits<float>::infinity()), sum(n, 0.0f), target(n, 0.0f) {}
};

// Fold a block of logits (rows x cols) into the running state of those rows.
STREAMMEM_HOT void fold_block(const float* __restrict logits, int64_t stride, int64_t rows, int64_t cols,
                              int64_t row0, int64_t v0, const int64_t* __restrict tgt, RowState& st,
                              int& saw_nan) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* x = logits + i * stride;
    const int64_t r = row0 + i;
    const float tile_max = row_max(x, cols);
    saw_nan |= row_has_nan(x, cols);
    const int64_t local = tgt[r] - v0;
    if (local >= 0 && local < cols) st.target[r] = x[local];
    const float new_max = tile_max > st.max[r] ? tile_max : st.max[r];
    if (new_max == -std::numeric_limits<float>::infinity()) continue;  // nothing but -inf so far
    st.sum[r] = st.sum[r] * exp_nonpositive(st.max[r] - new_max) + row_sum_exp(x, cols, new_max);
    st.max[r] = new_max;
  }
}

py::array_t<float> linear_token_logprobs(py::array hidden, py::array weight, py::object bias, int code,
                                         carray<int64_t> targets) {
  require(code == kFloat32 || code == kFloat16 || code == kBFloat16, "unknown dtype code");
  const int64_t elem = code == kFloat32 ? 4 : 2;
  require(hidden.ndim() == 2 && weight.ndim() == 2, "hidden must be (N, H) and weight (V, H)");
  require(hidden.itemsize() == elem && weight.itemsize() == elem, "itemsize does not match the dtype code");
  require((hidden.flags() & py::array::c_style) && (weight.flags() & py::array::c_style),
          "hidden and weight must be C-contiguous");
  const int64_t N = hidden.shape(0), H = hidden.shape(1), V = weight.shape(0);
  require(weight.shape(1) == H, "weight must have shape (V, H)");
  require(targets.ndim() == 1 && targets.shape(0) == N, "targets must have shape (N,)");
  std::vector<float> bias_f;
  if (!bias.is_none()) {
    py::array b = py::reinterpret_borrow<py::array>(bias);
    require(b.ndim() == 1 && b.shape(0) == V && b.itemsize() == elem && (b.flags() & py::array::c_style),
            "bias must be a contiguous (V,) array of the hidden dtype");
    bias_f.resize(V);
    load_row(b.data(), code, V, bias_f.data());
  }
  const char* hid = static_cast<const char*>(hidden.data());
  const char* wgt = static_cast<const char*>(weight.data());
  const int64_t* tgt = targets.data();
  py::array_t<float> out(N);
  float* o = out.mutable_data();
  {
    py::gil_scoped_release release;
    // Hidden rows packed once into 6-row panels (H x 6, zero-padded rows).
    const int64_t n_panels = (N + kRows - 1) / kRows;
    std::vector<float> a_packed(n_panels * H * kRows, 0.0f);
#pragma omp parallel
    {
      std::vector<float> row(H);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < N; ++r) {
        load_row(hid + r * H * elem, code, H, row.data());
        float* panel = a_packed.data() + (r / kRows) * H * kRows + (r % kRows);
        for (int64_t h = 0; h < H; ++h) panel[h * kRows] = row[h];
      }
    }
    const int n_threads = max_threads();
    std::vector<RowState> states;
    states.reserve(n_threads);
    for (int t = 0; t < n_threads; ++t) states.emplace_back(N);
    const int64_t n_tiles = (V + kVocabTile - 1) / kVocabTile;
    int saw_nan = 0;
#pragma omp parallel num_threads(n_threads) reduction(| : saw_nan)
    {
#ifdef _OPENMP
      RowState& st = states[omp_get_thread_num()];
#else
      RowState& st = states[0];
#endif
      std::vector<float> b_packed(static_cast<size_t>(kVocabTile / kCols) * H * kCols);
      std::vector<float> wrow(H);
      const int64_t scratch_rows = ((kRowBlock + kRows - 1) / kRows) * kRows;
      std::vector<float> logits(scratch_rows * kVocabTile);
#pragma omp for schedule(dynamic, 4)
      for (int64_t tile = 0; tile < n_tiles; ++tile) {
        const int64_t v0 = tile * kVocabTile;
        const int64_t cols = std::min<int64_t>(kVocabTile, V - v0);
        const int64_t col_panels = (cols + kCols - 1) / kCols;
        // Pack the weight tile into 16-column panels, H-major, zero-padded.
        std::fill(b_packed.begin(), b_packed.begin() + col_panels * H * kCols, 0.0f);
        for (int64_t c = 0; c < cols; ++c) {
          load_row(wgt + (v0 + c) * H * elem, code, H, wrow.data());
          float* panel = b_packed.data() + (c / kCols) * H * kCols + (c % kCols);
          for (int64_t h = 0; h < H; ++h) panel[h * kCols] = wrow[h];
        }
        for (int64_t row0 = 0; row0 < N; row0 += kRowBlock) {
          const int64_t rows = std::min<int64_t>(kRowBlock, N - row0);
          for (int64_t i = 0; i < rows; i += kRows) {
            const float* a_panel = a_packed.data() + ((row0 + i) / kRows) * H * kRows;
            for (int64_t p = 0; p < col_panels; ++p)
              micro_kernel(a_panel, b_packed.data() + p * H * kCols, H, logits.data() + i * kVocabTile + p * kCols,
                           kVocabTile);
          }
          if (!bias_f.empty())
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t c = 0; c < cols; ++c) logits[i * kVocabTile + c] += bias_f[v0 + c];
          fold_block(logits.data(), kVocabTile, rows, cols, row0, v0, tgt, st, saw_nan);
        }
      }
    }
    // Merge the per-thread running states (each saw a disjoint set of tiles).
    for (int64_t r = 0; r < N; ++r) {
      float m = -std::numeric_limits<float>::infinity();
      for (const RowState& st : states) m = std::max(m, st.max[r]);
      double s = 0.0;
      float target = 0.0f;
      for (const RowState& st : states) {
        if (st.max[r] != -std::numeric_limits<float>::infinity()) s += st.sum[r] * std::exp(st.max[r] - m);
        target += st.target[r];  // only the thread that owned the target's tile wrote it
      }
      o[r] = target - m - static_cast<float>(std::log(s));
    }
    if (saw_nan)
      for (int64_t r = 0; r < N; ++r) o[r] = std::numeric_limits<float>::quiet_NaN();
  }
  return out;
}

// ---------------------------------------------------------------------------
// Divergence point (Eq. 9-10), one caption per row
// ---------------------------------------------------------------------------
// Eq. 9-10 on one caption of n finite values (x read through `at`, widened to double).
template <typename Get>
int64_t divergence_row(Get at, int64_t n, int64_t delta, double alpha, double beta) {
  for (int64_t j = delta + 1; j < n; ++j) {
    // Summed afresh per j (not a running sum) so rounding matches the reference's window sums.
    double window = 0.0;
    for (int64_t k = j - delta; k < j; ++k) window += at(k);
    const double mu = window / static_cast<double>(delta);
    if (mu - at(j) > std::max(alpha * std::fabs(mu), beta)) return j;
  }
  return n;
}

py::array_t<int64_t> divergence_point(carray<double> logprobs, carray<int64_t> lengths, int64_t delta, double alpha,
                                      double beta) {
  require(logprobs.ndim() == 2, "logprobs must be (B, L)");
  const int64_t B = logprobs.shape(0), L = logprobs.shape(1);
  require(lengths.ndim() == 1 && lengths.shape(0) == B, "lengths must be (B,)");
  require(delta >= 1, "delta must be >= 1");
  const double* lp = logprobs.data();
  const int64_t* len = lengths.data();
  py::array_t<int64_t> out(B);
  int64_t* o = out.mutable_data();
  for (int64_t b = 0; b < B; ++b) {
    const double* x = lp + b * L;
    o[b] = divergence_row([x](int64_t k) { return x[k]; }, len[b], delta, alpha, beta);
  }
  return out;
}

// divergence_point with the public function's value checks (logprobs.py's fast path): (B, L)
// C-contiguous float32 (is_double false; widened exactly, as .to(float64) does) or float64 log-probs,
// lengths (B,) int64 or 0 for "every caption has length L", delta clamped to L as the public function
// does.  Lengths in [0, L] and finite values within each length, else ValueError with the general
// path's message.  `scalar`: a 0-d result (one caption given as (L,)).
py::array_t<int64_t> divergence_point_ptr(std::uintptr_t logprobs, int64_t B, int64_t L, bool is_double,
                                          std::uintptr_t lengths, int64_t delta, double alpha, double beta,
                                          bool scalar) {
  require(B >= 1 && L >= 1 && delta >= 1 && (!scalar || B == 1), "logprobs must be a non-empty (B, L) block");
  delta = std::min(delta, L);
  const int64_t* len = lengths ? in_ptr<int64_t>(lengths) : nullptr;
  if (len) {
    for (int64_t b = 0; b < B; ++b) {
      if (len[b] < 0 || len[b] > L) {
        throw std::invalid_argument("lengths must lie in [0, L] = [0, " + std::to_string(L) + "]");
      }
    }
  }
  const double* f64 = in_ptr<double>(logprobs);
  const float* f32 = in_ptr<float>(logprobs);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len ? len[b] : L;
    bool finite = true;
    for (int64_t k = 0; k < n; ++k) {
      finite &= std::isfinite(is_double ? f64[b * L + k] : static_cast<double>(f32[b * L + k]));
    }
    require(finite, "logprobs (within lengths) must be finite, found NaN or Inf");
  }
  py::array_t<int64_t> out = scalar ? py::array_t<int64_t>(std::vector<py::ssize_t>{}) : py::array_t<int64_t>(B);
  int64_t* o = out.mutable_data();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len ? len[b] : L;
    if (is_double) {
      const double* x = f64 + b * L;
      o[b] = divergence_row([x](int64_t k) { return x[k]; }, n, delta, alpha, beta);
    } else {
      const float* x = f32 + b * L;
      o[b] = divergence_row([x](int64_t k) { return static_cast<double>(x[k]); }, n, delta, alpha, beta);
    }
  }
  return out;
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_logprobs, m) {
  namespace py = pybind11;
  m.doc() = "Gathered token log-probs and the caption divergence point (CPU); see streammem_kernels/logprobs.py";
  m.def("token_logprobs", &streammem::token_logprobs, py::arg("logits"), py::arg("dtype_code"), py::arg("targets"),
        "(N,V) logits -> (N,) log p(target), online log-sum-exp per row");
  m.def("linear_token_logprobs", &streammem::linear_token_logprobs, py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("dtype_code"), py::arg("targets"),
        "(N,H) hidden, (V,H) LM head -> (N,) log p(target) without materialising the logits");
  m.def("divergence_point", &streammem::divergence_point, py::arg("logprobs"), py::arg("lengths"), py::arg("delta"),
        py::arg("alpha"), py::arg("beta"), "(B,L) float64 log-probs -> (B,) divergence points");
  m.def("token_logprobs_ptr", &streammem::token_logprobs_ptr, py::arg("logits"), py::arg("num_rows"),
        py::arg("vocab"), py::arg("dtype_code"), py::arg("targets"),
        "token_logprobs on raw pointers of C-contiguous tensors, targets and NaN rows checked (ValueError)");
  m.def("divergence_point_ptr", &streammem::divergence_point_ptr, py::arg("logprobs"), py::arg("batch"),
        py::arg("length"), py::arg("is_double"), py::arg("lengths"), py::arg("delta"), py::arg("alpha"),
        py::arg("beta"), py::arg("scalar"),
        "divergence_point on raw pointers (float32/float64 (B,L), lengths or 0), values checked (ValueError)");
}
