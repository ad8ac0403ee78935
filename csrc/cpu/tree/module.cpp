// The module _cpu_tree: the tree family's CPU entries (search.cpp, topk.cpp, half_scan.cpp, index.cpp), each
// documented where it is defined.  Tensors are DLPack capsules read as TensorView; every entry
// returns a Status.
#include "tree.h"

#include "common.h"

#include <pybind11/stl.h>

PYBIND11_MODULE(_cpu_tree, m) {
  namespace py = pybind11;
  namespace tree = streammem::tree;
  m.doc() = "Cosine memory tree search and exact cosine top-k (CPU, OpenMP over queries)";
  m.def("greedy", &tree::greedy, py::arg("emb"), py::arg("child_ptr"), py::arg("child_idx"), py::arg("roots"),
        py::arg("queries"), py::arg("from_every_root"), py::arg("path"), py::arg("path_scores"), py::arg("best_node"),
        py::arg("best_score"));
  m.def("beam", &tree::beam, py::arg("emb"), py::arg("child_ptr"), py::arg("child_idx"), py::arg("roots"),
        py::arg("level"), py::arg("utility"), py::arg("queries"), py::arg("widths"), py::arg("min_score"),
        py::arg("use_utility"), py::arg("ids"), py::arg("scores"), py::arg("scan"), py::arg("scan_norm"),
        py::arg("scan_err"));
  m.def("cosine_topk", &tree::cosine_topk, py::arg("queries"), py::arg("keys"), py::arg("ranges"), py::arg("ids"),
        py::arg("scores"));
  m.def("unit_rows", &tree::unit_rows, py::arg("queries"), py::arg("out"));
  m.def("row_norms", &tree::row_norms, py::arg("keys"), py::arg("norms"));
  m.def("topk_merge", &tree::topk_merge, py::arg("dots"), py::arg("norms"), py::arg("queries"), py::arg("keys"),
        py::arg("offset"), py::arg("ranges"), py::arg("ids"), py::arg("scores"));
  m.def("index_prepare", &tree::index_prepare, py::arg("src"), py::arg("dst"), py::arg("norms"), py::arg("scale"));
  m.def("index_topk", &tree::index_topk, py::arg("queries"), py::arg("keys"), py::arg("norms"), py::arg("alive"),
        py::arg("ranges"), py::arg("ids"), py::arg("scores"), py::arg("scan"), py::arg("scan_scale"),
        py::arg("scan_norm"), py::arg("scan_err"), py::arg("norm_slack"));
  m.def("index_merge", &tree::index_merge, py::arg("dots"), py::arg("norms"), py::arg("queries"), py::arg("keys"),
        py::arg("offset"), py::arg("ranges"), py::arg("alive"), py::arg("ids"), py::arg("scores"));
  m.def("half_copy", &tree::half_copy, py::arg("src"), py::arg("dst"), py::arg("bounds"),
        "Write the float16 scan copy of float32 rows src (n, D) into dst (n, D) (round to nearest even, "
        "|x| < 2^-14 stored as 0) and bounds (2,) float64: the largest row norm and the largest L2 distance of a "
        "row to its copy");
  m.def("half_dots", &tree::half_dots, py::arg("query"), py::arg("rows"), py::arg("out"),
        "float32 dot products of query (D,) with the float16 rows (n, D) of a scan copy into out (n,), by the beam "
        "search's kernel (only where half_scan_kernel())");
  m.def("int8_copy", &tree::int8_copy, py::arg("src"), py::arg("codes"), py::arg("scales"), py::arg("bounds"),
        "Write the int8 scan copy of float32 rows src (n, D): codes (n, D) int8 in [-127, 127] and scales (n,) "
        "float32 (row ~ scale * codes), and bounds (2,) float64: the largest row norm and the largest L2 distance "
        "of a row to scale * codes");
  m.def("int8_dots", &tree::int8_dots, py::arg("query"), py::arg("codes"), py::arg("scales"), py::arg("out"),
        py::arg("kernel"),
        "The int8 copy's scores of one query (D,) against codes (n, D) with scales (n,) into out (n,), as the index "
        "scan computes them, by this CPU's kernel (kernel='') or the one named ('avx512vnni', 'avx2', 'scalar')");
  m.def("int8_scan_kernel", [] { return std::string(tree::dot_int8_name()); },
        "The kernel the index scan reads an int8 copy with on this CPU: 'avx512vnni', 'avx2' or 'scalar'");
  m.def("half_scan_kernel", [] { return tree::dot_half_kernel() != nullptr; },
        "Whether this CPU has the kernel (F16C, AVX2, FMA) with which the beam search reads a scan copy; "
        "without it the copy is kept but not read (same results, float32 speed)");
}
