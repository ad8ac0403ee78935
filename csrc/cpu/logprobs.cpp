// Gathered token log-probabilities and the caption divergence point, CPU kernels.
//
// Entries (the border of csrc/cpu/tensor_view.h; the spec is streammem_kernels/logprobs/reference.py):
//   token_logprobs(logits (N, V) float32|float16|bfloat16 with unit vocabulary stride (or a C-contiguous
//                  (B, T, V) block), targets (N,) int64, out (N,) float32) -> Status
//       1: a target outside [0, V); 2: a row produced NaN (a NaN or +inf logit, or all -inf).
//   linear_token_logprobs(hidden (N, H), weight (V, H), bias (V,) or None, all of one 16/32-bit float
//                         dtype and C-contiguous, targets (N,) int64 in [0, V), out (N,) float32) -> Status
//       1: some logit was NaN (every output is then NaN).
//   divergence_point(logprobs (B, L) or (L,) float32|float64 C-contiguous, lengths (B,) int64 or None (all L),
//                    delta in [1, L], alpha, beta, out (B,) int64) -> Status
//       1: a length outside [0, L]; 2: a non-finite value within a caption's length.
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
#include "tensor_view.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include <pybind11/stl.h>

namespace streammem {
namespace {

// Work (logits read, or multiply-adds of the LM head) each thread should get before a region
// takes a second thread (threads_for, common.h): about 0.1 ms on one core.
constexpr int64_t kParallelWork = int64_t(1) << 18;

enum DtypeCode : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// The element format of a logits/hidden view (the caller passes only these three).
int code_of(const TensorView& v, const char* entry, const char* name) {
  switch (v.dtype) {
    case DType::kFloat32:
      return kFloat32;
    case DType::kFloat16:
      return kFloat16;
    case DType::kBFloat16:
      return kBFloat16;
    default:
      expect(false, entry, std::string(name) + " must be float32, float16 or bfloat16");
      return kFloat32;
  }
}

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
#pragma omp parallel num_threads(threads_for(N * V, kParallelWork))
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

Status token_logprobs(TensorView logits, TensorView targets, TensorView out) {
  constexpr const char* entry = "token_logprobs";
  const int code = code_of(logits, entry, "logits");
  expect(logits.on_cpu && logits.ndim >= 2, entry, "logits must be a CPU tensor of rank >= 2");
  const int64_t V = logits.size(logits.ndim - 1), N = V ? logits.numel() / V : 0;
  const int64_t elem = code == kFloat32 ? 4 : 2;
  expect(V >= 1 && N >= 1 && logits.stride(logits.ndim - 1) == 1, entry, "logits must have V >= 1 and unit stride");
  // The rows: one stride apart, which holds for (N, V) and for C-contiguous blocks of any rank.
  expect(logits.ndim == 2 || logits.contiguous(), entry, "logits of rank > 2 must be C-contiguous");
  const int64_t row_stride = logits.stride(logits.ndim - 2) * elem;
  expect(targets.on_cpu && targets.dtype == DType::kInt64 && targets.contiguous() && targets.numel() == N, entry,
         "targets must hold N contiguous int64 ids");
  expect(out.on_cpu && out.dtype == DType::kFloat32 && out.contiguous() && out.numel() == N, entry,
         "out must hold N contiguous float32");
  const int64_t* tgt = targets.ptr<int64_t>();
  for (int64_t r = 0; r < N; ++r) {
    if (tgt[r] < 0 || tgt[r] >= V) return 1;
  }
  float* o = out.ptr<float>();
  token_logprobs_rows(logits.ptr<const char>(), row_stride, code, N, V, tgt, o);
  for (int64_t r = 0; r < N; ++r) {
    if (o[r] != o[r]) return 2;
  }
  return kOk;
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

Status linear_token_logprobs(TensorView hidden, TensorView weight, std::optional<TensorView> bias, TensorView targets,
                             TensorView out) {
  constexpr const char* entry = "linear_token_logprobs";
  const int code = code_of(hidden, entry, "hidden");
  const int64_t elem = code == kFloat32 ? 4 : 2;
  expect(hidden.on_cpu && weight.on_cpu && hidden.ndim == 2 && weight.ndim == 2 && hidden.contiguous() &&
             weight.contiguous() && weight.dtype == hidden.dtype,
         entry, "hidden (N, H) and weight (V, H) must be C-contiguous CPU tensors of one dtype");
  const int64_t N = hidden.size(0), H = hidden.size(1), V = weight.size(0);
  expect(weight.size(1) == H, entry, "weight must have shape (V, H)");
  expect(targets.on_cpu && targets.dtype == DType::kInt64 && targets.contiguous() && targets.numel() == N, entry,
         "targets must hold N contiguous int64 ids");
  expect(out.on_cpu && out.dtype == DType::kFloat32 && out.contiguous() && out.numel() == N, entry,
         "out must hold N contiguous float32");
  std::vector<float> bias_f;
  if (bias) {
    expect(bias->on_cpu && bias->ndim == 1 && bias->size(0) == V && bias->dtype == hidden.dtype && bias->contiguous(),
           entry, "bias must be a contiguous (V,) tensor of the hidden dtype");
    bias_f.resize(V);
    load_row(bias->data, code, V, bias_f.data());
  }
  const char* hid = hidden.ptr<const char>();
  const char* wgt = weight.ptr<const char>();
  const int64_t* tgt = targets.ptr<int64_t>();
  float* o = out.ptr<float>();
  int saw_nan = 0;
  {
    py::gil_scoped_release release;
    // Hidden rows packed once into 6-row panels (H x 6, zero-padded rows).
    const int64_t n_panels = (N + kRows - 1) / kRows;
    std::vector<float> a_packed(n_panels * H * kRows, 0.0f);
#pragma omp parallel num_threads(threads_for(N * H, kParallelWork))
    {
      std::vector<float> row(H);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < N; ++r) {
        load_row(hid + r * H * elem, code, H, row.data());
        float* panel = a_packed.data() + (r / kRows) * H * kRows + (r % kRows);
        for (int64_t h = 0; h < H; ++h) panel[h * kRows] = row[h];
      }
    }
    const int n_threads = threads_for(N * H * V, kParallelWork);
    std::vector<RowState> states;
    states.reserve(n_threads);
    for (int t = 0; t < n_threads; ++t) states.emplace_back(N);
    const int64_t n_tiles = (V + kVocabTile - 1) / kVocabTile;
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
  return saw_nan ? 1 : kOk;
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

Status divergence_point(TensorView logprobs, std::optional<TensorView> lengths, int64_t delta, double alpha,
                        double beta, TensorView out) {
  constexpr const char* entry = "divergence_point";
  const bool is_double = logprobs.dtype == DType::kFloat64;
  expect(logprobs.on_cpu && (logprobs.ndim == 1 || logprobs.ndim == 2) && logprobs.contiguous() &&
             (is_double || logprobs.dtype == DType::kFloat32),
         entry, "logprobs must be a C-contiguous (L,) or (B, L) float32 or float64 CPU tensor");
  const int64_t B = logprobs.ndim == 2 ? logprobs.size(0) : 1, L = logprobs.size(logprobs.ndim - 1);
  expect(delta >= 1 && delta <= std::max<int64_t>(L, 1), entry, "delta must lie in [1, L]");
  expect(out.on_cpu && out.dtype == DType::kInt64 && out.contiguous() && out.numel() == B, entry,
         "out must hold B contiguous int64");
  const int64_t* len = nullptr;
  if (lengths) {
    expect(lengths->on_cpu && lengths->dtype == DType::kInt64 && lengths->contiguous() && lengths->numel() == B, entry,
           "lengths must hold B contiguous int64");
    len = lengths->ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      if (len[b] < 0 || len[b] > L) return 1;
    }
  }
  const double* f64 = logprobs.ptr<double>();
  const float* f32 = logprobs.ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = len ? len[b] : L;
    bool finite = true;
    for (int64_t k = 0; k < n; ++k) {
      finite &= std::isfinite(is_double ? f64[b * L + k] : static_cast<double>(f32[b * L + k]));
    }
    if (!finite) return 2;
  }
  int64_t* o = out.ptr<int64_t>();
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
  return kOk;
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_logprobs, m) {
  namespace py = pybind11;
  m.doc() = "Gathered token log-probs and the caption divergence point (CPU); see streammem_kernels/logprobs";
  m.def("token_logprobs", &streammem::token_logprobs, py::arg("logits"), py::arg("targets"), py::arg("out"),
        "(N, V) logits -> out (N,) log p(target), online log-sum-exp per row; status 1: target out of range, "
        "2: a NaN row");
  m.def("linear_token_logprobs", &streammem::linear_token_logprobs, py::arg("hidden"), py::arg("weight"),
        py::arg("bias"), py::arg("targets"), py::arg("out"),
        "(N, H) hidden, (V, H) LM head -> out (N,) log p(target) without materialising the logits; status 1: NaN");
  m.def("divergence_point", &streammem::divergence_point, py::arg("logprobs"), py::arg("lengths"), py::arg("delta"),
        py::arg("alpha"), py::arg("beta"), py::arg("out"),
        "(B, L) log-probs -> out (B,) divergence points; status 1: a length out of [0, L], 2: non-finite values");
}
