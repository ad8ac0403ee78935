// The one border between Python and the CPU kernels.
//
// Every tensor argument of every entry point arrives as a TensorView: a borrowed view of a DLPack
// capsule (`torch.utils.dlpack.to_dlpack(t)` on the Python side, `streammem_kernels.runtime.native.view`),
// read without copying and without libtorch.  Scalars arrive as plain ints and floats.  Every entry
// returns a Status: 0, or the 1-based number of the check that failed among those its Python caller
// declares next to the call (`NativeChecks`); the message lives there, once, in Python.
//
// The Python side validates the arguments before the call (shapes, dtypes, devices, ranges of the
// scalars): what a kernel checks with STREAMMEM_EXPECT is what the caller promised, and a violation
// is a bug of the caller (a RuntimeError naming the entry), never a user error.  Checks of the
// values a kernel reads anyway in its own pass (finite inputs, ids in range) are user errors: the
// kernel returns their Status instead of scanning twice.
#pragma once

#include "common.h"

#include <cstdint>
#include <stdexcept>
#include <string>

namespace streammem {

// The DLPack ABI (dlpack.h, v0.8 and later, Apache-2.0): the fields read here, in their layout.
extern "C" {
struct DLDevice {
  int32_t device_type;  // kDLCPU = 1
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; NULL means C-contiguous
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
}

enum class DType { kFloat32, kFloat64, kFloat16, kBFloat16, kInt64, kInt32, kInt16, kInt8, kUInt8, kBool, kOther };

inline DType dtype_of(const DLDataType& t) {
  if (t.lanes != 1) return DType::kOther;
  switch (t.code) {
    case 2:
      return t.bits == 32 ? DType::kFloat32 : t.bits == 64 ? DType::kFloat64 : t.bits == 16 ? DType::kFloat16
                                                                                              : DType::kOther;
    case 4:
      return t.bits == 16 ? DType::kBFloat16 : DType::kOther;
    case 0:
      return t.bits == 64 ? DType::kInt64 : t.bits == 32 ? DType::kInt32 : t.bits == 16 ? DType::kInt16
                                            : t.bits == 8 ? DType::kInt8 : DType::kOther;
    case 1:
      return t.bits == 8 ? DType::kUInt8 : DType::kOther;
    case 6:
      return t.bits == 8 ? DType::kBool : DType::kOther;
    default:
      return DType::kOther;
  }
}

inline const char* dtype_name(DType d) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16", "int64", "int32",
                                "int16",   "int8",    "uint8",   "bool",     "other"};
  return names[static_cast<int>(d)];
}

// A borrowed view of a tensor: valid for the duration of the call that received it.
struct TensorView {
  void* data = nullptr;
  int32_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;
  DType dtype = DType::kOther;
  bool on_cpu = false;

  int64_t size(int d) const { return shape[d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  // C-contiguous: strides absent, or those of a row-major array (size-1 dimensions may have any
  // stride, and an empty tensor any strides, as torch has it).
  bool contiguous() const {
    if (strides == nullptr || numel() == 0) return true;
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && strides[d] != expected) return false;
      expected *= shape[d];
    }
    return true;
  }
  int64_t stride(int d) const {
    if (strides != nullptr) return strides[d];
    int64_t s = 1;
    for (int e = ndim - 1; e > d; --e) s *= shape[e];
    return s;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// 0 = success; n > 0 = the caller's n-th declared check failed.
using Status = int;
constexpr Status kOk = 0;

// What the Python caller promised about an argument; a violation is a bug of the caller.  The
// message is built only on failure (these checks run on every call of the latency paths, where a
// heap-allocated std::string per check costs more than the check).
[[noreturn]] inline void broken_contract(const char* entry, const std::string& what) {
  throw std::logic_error(std::string(entry) + ": the caller broke the border contract: " + what);
}
inline void expect(bool ok, const char* entry, const char* what) {
  if (!ok) broken_contract(entry, what);
}
inline void expect(bool ok, const char* entry, const std::string& what) {
  if (!ok) broken_contract(entry, what);
}

// `view` is a CPU, C-contiguous tensor of `dtype` with `ndim` dimensions.
inline void expect_tensor(const TensorView& view, DType dtype, int ndim, const char* entry, const char* name) {
  if (view.on_cpu && view.dtype == dtype && view.ndim == ndim && view.contiguous()) return;
  expect(view.on_cpu, entry, std::string(name) + " must be a CPU tensor");
  expect(view.dtype == dtype, entry,
         std::string(name) + " must be " + dtype_name(dtype) + ", got " + dtype_name(view.dtype));
  expect(view.ndim == ndim, entry, std::string(name) + " must have " + std::to_string(ndim) + " dimensions");
  expect(view.contiguous(), entry, std::string(name) + " must be C-contiguous");
}

}  // namespace streammem

namespace pybind11 {
namespace detail {

// A TensorView argument accepts a DLPack capsule ("dltensor") and borrows it: the capsule, and the
// tensor it keeps alive, outlive the call because the caller holds them; nothing is consumed, so
// the capsule's own destructor releases the tensor as usual.  `None` binds to std::optional's
// empty state (pybind11/stl.h) for optional tensors.
template <>
struct type_caster<streammem::TensorView> {
  PYBIND11_TYPE_CASTER(streammem::TensorView, const_name("DLPackCapsule"));

  bool load(handle src, bool) {
    PyObject* obj = src.ptr();
    if (!PyCapsule_CheckExact(obj)) return false;
    auto* managed = static_cast<streammem::DLManagedTensor*>(PyCapsule_GetPointer(obj, "dltensor"));
    if (managed == nullptr) {  // a consumed ("used_dltensor") or foreign capsule
      PyErr_Clear();
      return false;
    }
    const streammem::DLTensor& t = managed->dl_tensor;
    value.data = static_cast<char*>(t.data) + t.byte_offset;
    value.ndim = t.ndim;
    value.shape = t.shape;
    value.strides = t.strides;
    value.dtype = streammem::dtype_of(t.dtype);
    value.on_cpu = t.device.device_type == 1;
    return true;
  }

  static handle cast(const streammem::TensorView&, return_value_policy, handle) {
    throw cast_error("a TensorView is an argument only, never a result");
  }
};

}  // namespace detail
}  // namespace pybind11
