// Shared helpers for the CPU kernels (pybind11 + OpenMP).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace streammem {

namespace py = pybind11;

// Hot loops are compiled twice, for x86-64-v3 (AVX2+FMA: Haswell, Zen and newer) and for the
// baseline ISA, and the loader picks one; this keeps -march=native opt-in.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STREAMMEM_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define STREAMMEM_HOT
#endif

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Threads for a parallel region of `work` units (multiply-adds, or what the caller counts) when
// each thread should get at least `per_thread` of them: one below 2 x per_thread, never more than
// max_threads().  A region's threads meet at its barrier, so on a machine whose cores run other
// work every region waits for its slowest thread to be scheduled; a region is worth it only for
// work that dwarfs that wait (docs/performance.md gives the measured thresholds).  max_threads()
// follows torch.set_num_threads(): torch loads libgomp first and these modules share it.
inline int threads_for(int64_t work, int64_t per_thread) {
  const int most = max_threads();
  if (most <= 1 || per_thread <= 0 || work < 2 * per_thread) return 1;
  return static_cast<int>(std::min<int64_t>(most, work / per_thread));
}

// Contiguous array of a fixed dtype: pybind11 copies non-contiguous input and
// takes contiguous input zero-copy (the Python side always passes contiguous).
template <typename T>
using carray = py::array_t<T, py::array::c_style>;

// std::invalid_argument becomes Python's ValueError: kernels that validate values themselves (finite
// inputs, ids in range) raise with the message the public function documents.  Never throw inside
// an OpenMP region: record the failure there and throw after it.
inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

// Entry points taking raw pointers (the per-call fast paths, like the CUDA modules' C ABI): the
// Python side passes ``tensor.data_ptr()`` of C-contiguous CPU tensors of the stated dtype and
// sizes, which it keeps alive for the call.  Converting a tensor to numpy costs about a
// microsecond, which is most of a small op's budget.
template <typename T>
inline const T* in_ptr(std::uintptr_t address) {
  return reinterpret_cast<const T*>(address);
}

}  // namespace streammem
