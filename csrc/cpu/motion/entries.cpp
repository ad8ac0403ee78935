// The entries of _cpu_motion, on the border of csrc/cpu/tensor_view.h: tensors as DLPack capsules,
// scalars as plain numbers, results written into tensors the caller allocated, a Status back.
//
//   gray_area(frames (T, H, W) or (T, H, W, 3) uint8, out (T, oh, ow) float32 with oh <= H, ow <= W)
//       out: BT.601 gray in [0, 1], area resampled.
//   lk_flow(gray (T, H, W) uint8 (scaled by 1/255 on load) or float32 in [0, 1], T >= 2,
//           window (odd >= 3, or 0: one global system), min_eig, levels, moving, floor_lo, floor_hi,
//           min_area, guess_box, search_radius, search_quant,
//           flow_px (T-1,) float32, mean_uv (T-1, 2) float32, score (T-1,) float32 or None)
//       score: flow_px / (1 + flow_px), the float32 division of MotionResult.score.
//   streamchat_flow(gray (T, H, W) float32, T >= 2, window (odd >= 3, at most H and W), eps,
//                   flow_px (T-1,) float32, mean_uv (T-1, 2) float32)
//       StreamChat's reading of every consecutive pair (the "streamchat" statistic).
//
// Every tensor is a C-contiguous CPU tensor.  The Python side (streammem_kernels/motion/__init__.py)
// validated every argument with the public functions' rules and passes the reference's constants
// (the statistic's floor, the guess box, the search's radius and quantum), so what is checked here
// is what the caller promised (a violation is a RuntimeError).  Neither entry checks values of its
// own (floating frames are range-checked before the call), so both always return 0.
#include "motion.h"
#include "tensor_view.h"

#include <optional>
#include <string>

#include <pybind11/stl.h>

namespace streammem {
namespace motion {
namespace {

Status gray_area(TensorView frames, TensorView out) {
  constexpr const char* entry = "gray_area";
  expect(frames.on_cpu && frames.dtype == DType::kUInt8 && frames.contiguous() &&
             (frames.ndim == 3 || (frames.ndim == 4 && frames.size(3) == 3)),
         entry, "frames must be C-contiguous uint8 CPU frames (T, H, W) or (T, H, W, 3)");
  expect_tensor(out, DType::kFloat32, 3, entry, "out");
  const int64_t T_ = frames.size(0), H = frames.size(1), W = frames.size(2), oh = out.size(1), ow = out.size(2);
  expect(out.size(0) == T_ && oh >= 1 && ow >= 1 && oh <= H && ow <= W, entry,
         "out must be (T, oh, ow) with 1 <= oh <= H and 1 <= ow <= W");
  gray_area_into(frames.ptr<const uint8_t>(), T_, H, W, frames.ndim == 4 ? 3 : 1, oh, ow, out.ptr<float>());
  return kOk;
}

Status lk_flow(TensorView gray, int window, float min_eig, int levels, bool moving, float floor_lo, float floor_hi,
               double min_area, int guess_box, int search_radius, float search_quant, TensorView flow_px,
               TensorView mean_uv, std::optional<TensorView> score) {
  constexpr const char* entry = "lk_flow";
  const bool is_uint8 = gray.dtype == DType::kUInt8;
  expect_tensor(gray, is_uint8 ? DType::kUInt8 : DType::kFloat32, 3, entry, "gray");
  const int64_t T_ = gray.size(0), H = gray.size(1), W = gray.size(2), pairs = T_ - 1;
  const int w = window;
  expect(T_ >= 2, entry, "gray must hold at least 2 frames");
  expect(w == 0 || (w >= 3 && w % 2 == 1), entry, "window must be 0 or odd >= 3");
  expect(H >= (w ? w : 1) + 2 && W >= (w ? w : 1) + 2, entry, "frames must be at least window + 2 pixels a side");
  expect(levels >= 1 && (w != 0 || levels == 1), entry, "levels must be >= 1 (1 for the global system)");
  for (int64_t l = 1, h = H, wd = W; l < levels; ++l) {
    h = (h + 1) / 2;
    wd = (wd + 1) / 2;
    expect(h >= w + 4 && wd >= w + 4, entry, "every pyramid level must be at least window + 4 pixels a side");
  }
  expect(floor_hi > floor_lo && guess_box >= 1 && guess_box % 2 == 1 && search_radius >= 0 && search_quant > 0.0f,
         entry, "floor_hi > floor_lo, an odd guess_box, search_radius >= 0 and search_quant > 0");
  expect_tensor(flow_px, DType::kFloat32, 1, entry, "flow_px");
  expect_tensor(mean_uv, DType::kFloat32, 2, entry, "mean_uv");
  expect(flow_px.size(0) == pairs && mean_uv.size(0) == pairs && mean_uv.size(1) == 2, entry,
         "flow_px must be (T-1,) and mean_uv (T-1, 2)");
  if (score) {
    expect_tensor(*score, DType::kFloat32, 1, entry, "score");
    expect(score->size(0) == pairs, entry, "score must be (T-1,)");
  }
  const LkParams params{w, min_eig, levels, Statistic{moving, floor_lo, floor_hi}, min_area, guess_box, search_radius,
                        search_quant};
  float* flow = flow_px.ptr<float>();
  if (is_uint8) {
    lk_flow_into<uint8_t>(gray.ptr<const uint8_t>(), T_, H, W, 1.0f / 255.0f, params, flow, mean_uv.ptr<float>());
  } else {
    lk_flow_into<float>(gray.ptr<const float>(), T_, H, W, 1.0f, params, flow, mean_uv.ptr<float>());
  }
  if (score) {
    float* s = score->ptr<float>();
    for (int64_t p = 0; p < pairs; ++p) s[p] = flow[p] / (1.0f + flow[p]);
  }
  return kOk;
}

Status streamchat_flow(TensorView gray, int window, float eps, TensorView flow_px, TensorView mean_uv) {
  constexpr const char* entry = "streamchat_flow";
  expect_tensor(gray, DType::kFloat32, 3, entry, "gray");
  const int64_t T_ = gray.size(0), H = gray.size(1), W = gray.size(2), pairs = T_ - 1;
  expect(T_ >= 2, entry, "gray must hold at least 2 frames");
  expect(window >= 3 && window % 2 == 1 && H >= window && W >= window, entry,
         "window must be odd >= 3 and at most the frames' height and width");
  expect(eps >= 0.0f, entry, "eps must be >= 0");
  expect_tensor(flow_px, DType::kFloat32, 1, entry, "flow_px");
  expect_tensor(mean_uv, DType::kFloat32, 2, entry, "mean_uv");
  expect(flow_px.size(0) == pairs && mean_uv.size(0) == pairs && mean_uv.size(1) == 2, entry,
         "flow_px must be (T-1,) and mean_uv (T-1, 2)");
  streamchat_flow_into(gray.ptr<const float>(), T_, H, W, window, eps, flow_px.ptr<float>(), mean_uv.ptr<float>());
  return kOk;
}

}  // namespace
}  // namespace motion
}  // namespace streammem

PYBIND11_MODULE(_cpu_motion, m) {
  namespace py = pybind11;
  using namespace streammem::motion;
  m.doc() = "Pyramidal Lucas-Kanade motion magnitude (CPU); see streammem_kernels/motion";
  m.def("gray_area", &gray_area, py::arg("frames"), py::arg("out"),
        "uint8 (T, H, W[, 3]) frames -> out (T, oh, ow) float32 gray in [0, 1], area resampling; status 0");
  m.def("lk_flow", &lk_flow, py::arg("gray"), py::arg("window"), py::arg("min_eig"), py::arg("levels"),
        py::arg("moving"), py::arg("floor_lo"), py::arg("floor_hi"), py::arg("min_area"), py::arg("guess_box"),
        py::arg("search_radius"), py::arg("search_quant"), py::arg("flow_px"), py::arg("mean_uv"), py::arg("score"),
        "(T, H, W) uint8|float32 gray -> out flow_px (T-1,), mean_uv (T-1, 2) and score (T-1,) or None; status 0");
  m.def("streamchat_flow", &streamchat_flow, py::arg("gray"), py::arg("window"), py::arg("eps"), py::arg("flow_px"),
        py::arg("mean_uv"),
        "(T, H, W) float32 gray -> out flow_px (T-1,), mean_uv (T-1, 2): StreamChat's reading; status 0");
}
