// torch.Tensor arguments read from their Python attributes, for the per-call fast paths.
//
// The CPU modules are built without libtorch (setup.py), so a kernel normally receives
// `tensor.data_ptr()` and the sizes from the Python side.  For the single-item calls that Python
// side (checks, shape reads, pointer reads, result conversion: a dozen calls per tensor) cost as
// much as the kernel.  Here the same attribute reads are made from C++ through the CPython API
// (about 0.75 us per tensor, most of it torch's own getters: 0.16 us for `shape`, 0.11 for
// `is_contiguous()`), with the acceptance rule of streammem_kernels._cosine.cpu_fast_path: an
// exact torch.Tensor (no subclass), the wanted dtype, on the CPU, not requiring grad, strided and
// C-contiguous.  Anything else is "not this case" (the caller returns None and the Python side
// takes its general path, which explains itself).
//
// Outputs go back as torch tensors made by torch.from_numpy on freshly allocated numpy arrays
// (each call returns new memory the caller owns).
#pragma once

#include "common.h"

#include <Python.h>

#include <cstdint>

namespace streammem {
namespace tensor_args {

// torch objects and attribute names, looked up once (torch is imported before any fast path
// runs).  Deliberately leaked: they must outlive every call, and destroying Python objects after
// the interpreter has finalised would crash at exit.
struct Torch {
  PyObject* tensor_type;
  PyObject* float32;
  PyObject* int64;
  PyObject* strided;
  PyObject* from_numpy;
  PyObject* s_dtype;
  PyObject* s_is_cpu;
  PyObject* s_requires_grad;
  PyObject* s_layout;
  PyObject* s_is_contiguous;
  PyObject* s_shape;
  PyObject* s_data_ptr;
};

inline const Torch& torch_objects() {
  static const Torch* t = [] {
    py::module_ torch = py::module_::import("torch");
    auto keep = [](py::object o) { return o.release().ptr(); };
    return new Torch{keep(torch.attr("Tensor")),
                     keep(torch.attr("float32")),
                     keep(torch.attr("int64")),
                     keep(torch.attr("strided")),
                     keep(torch.attr("from_numpy")),
                     PyUnicode_InternFromString("dtype"),
                     PyUnicode_InternFromString("is_cpu"),
                     PyUnicode_InternFromString("requires_grad"),
                     PyUnicode_InternFromString("layout"),
                     PyUnicode_InternFromString("is_contiguous"),
                     PyUnicode_InternFromString("shape"),
                     PyUnicode_InternFromString("data_ptr")};
  }();
  return *t;
}

// obj.name is `expected` (identity, as the Python side's `is`).
inline bool attr_is(PyObject* obj, PyObject* name, PyObject* expected) {
  PyObject* v = PyObject_GetAttr(obj, name);
  if (v == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool same = v == expected;
  Py_DECREF(v);
  return same;
}

// obj.name() as an int64 (false if it raised or is not an int).
inline bool call_int(PyObject* obj, PyObject* name, int64_t* out) {
  PyObject* v = PyObject_CallMethodNoArgs(obj, name);
  if (v == nullptr) {
    PyErr_Clear();
    return false;
  }
  const long long x = PyLong_AsLongLong(v);
  Py_DECREF(v);
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = x;
  return true;
}

// A plain CPU tensor of `dtype` (see the header) with `rank` dimensions: its sizes and address.
template <int Rank>
struct Plain {
  int64_t size[Rank];
  std::uintptr_t data;
};

template <int Rank>
bool plain_cpu(py::handle h, PyObject* dtype, Plain<Rank>* out) {
  const Torch& t = torch_objects();
  PyObject* obj = h.ptr();
  if (Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(t.tensor_type)) return false;
  if (!attr_is(obj, t.s_dtype, dtype) || !attr_is(obj, t.s_is_cpu, Py_True) ||
      !attr_is(obj, t.s_requires_grad, Py_False) || !attr_is(obj, t.s_layout, t.strided))
    return false;
  PyObject* contiguous = PyObject_CallMethodNoArgs(obj, t.s_is_contiguous);
  if (contiguous == nullptr) {
    PyErr_Clear();
    return false;
  }
  const bool is_contiguous = contiguous == Py_True;
  Py_DECREF(contiguous);
  if (!is_contiguous) return false;
  PyObject* shape = PyObject_GetAttr(obj, t.s_shape);
  if (shape == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool ok = PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) == Rank;
  for (int d = 0; ok && d < Rank; ++d) {
    out->size[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
    ok = !(out->size[d] == -1 && PyErr_Occurred());
  }
  Py_DECREF(shape);
  if (!ok) {
    PyErr_Clear();
    return false;
  }
  int64_t address = 0;
  if (!call_int(obj, t.s_data_ptr, &address)) return false;
  out->data = static_cast<std::uintptr_t>(address);
  return true;
}

// A Python int that fits int64 (bool excluded, as the Python side's `type(k) is int`).
inline bool exact_int(py::handle h, int64_t* out) {
  if (!PyLong_CheckExact(h.ptr())) return false;
  const long long x = PyLong_AsLongLong(h.ptr());
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = x;
  return true;
}

// The arguments of a cosine top-k fast path (cosine_topk, graph_retrieve's seeds): queries (Q, D)
// and keys (N, D) plain float32 CPU tensors with 1 <= Q < max_queries, N >= 1, D >= 1, and k an int
// in [1, max_k].  False for anything else (the caller returns None: the general path explains).
inline bool topk_args(py::handle queries, py::handle keys, py::handle k_obj, int64_t max_queries, int64_t max_k,
                      Plain<2>* q, Plain<2>* kv, int64_t* k) {
  if (!exact_int(k_obj, k) || *k < 1 || *k > max_k || !plain_cpu(queries, torch_objects().float32, q) ||
      !plain_cpu(keys, torch_objects().float32, kv))
    return false;
  return q->size[0] >= 1 && q->size[0] < max_queries && kv->size[0] >= 1 && kv->size[1] >= 1 &&
         q->size[1] == kv->size[1];
}

// torch.from_numpy(array): the tensor shares the array's fresh memory.
inline py::object to_tensor(const py::array& a) {
  PyObject* t = PyObject_CallOneArg(torch_objects().from_numpy, a.ptr());
  if (t == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(t);
}

}  // namespace tensor_args
}  // namespace streammem
