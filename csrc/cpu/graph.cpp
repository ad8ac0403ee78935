// Batched k-hop neighbourhood expansion over a CSR graph, CPU kernel.
//
// Contract (streammem_kernels/graph.py is the spec; inputs arrive prepared):
//   expand(row_ptr (R+1) i64, col_idx (E) i64 in [0, num_cols), sources (B,S) i64 in [-1, R),
//          num_cols, hops >= 0, capacity >= 1, max_fanout >= 1, max_frontier >= 1, keep_sources)
//     -> nodes, hop, seed, parent, edge (B, capacity) i64 padded with -1,
//        count (B,) i64, truncated (B,) bool.
//   expand_ptr(...): the same on a validated CSRGraph and sources read in place (khop_neighbourhood).
//   retrieve(queries, node_embeddings, k, topk_into, row_ptr, ...): graph_retrieve in one call, the
//        cosine top-k seeds (tree.cpp's scan) and their expansion (see retrieve below).
//
// Per query, a level-synchronous BFS that appends to one ordered list:
//   hop 0 (keep_sources): the distinct sources in row order;
//   hop h >= 1: for each node of hop h-1's frontier (in list order; in chunk mode, with
//     keep_sources false, the sources row itself is the one frontier), the first max_fanout
//     entries of its CSR row in row order; an entry whose target is not listed yet is appended
//     with (hop h, the frontier node's seed, parent = the frontier node, edge = the entry's
//     position in col_idx), until the hop holds max_frontier nodes (the hop ends) or the list
//     holds capacity nodes (the query ends; truncated when a node the frontier cap admits was
//     turned away).
// OpenMP over queries; each thread keeps a visited bitmap (one bit per column id) across calls
// and clears only the bits its query set, so a query costs O(output + edges scanned), not
// O(num_cols): at 10^6 nodes, zeroing a fresh bitmap per call would cost more than a 2-hop
// expansion itself.
#include "common.h"
#include "tensor_args.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace streammem {
namespace {

struct Lists {
  int64_t* node;
  int64_t* hop;
  int64_t* seed;
  int64_t* parent;
  int64_t* edge;
};

// This thread's visited bitmap, at least `bits` long and all clear (every query clears what it set).
std::vector<uint64_t>& visited_bitmap(int64_t bits) {
  thread_local std::vector<uint64_t> words;
  const size_t need = static_cast<size_t>((bits + 63) / 64);
  if (words.size() < need) words.resize(need, 0);
  return words;
}

struct Bitmap {
  uint64_t* words;
  bool test(int64_t i) const { return (words[i >> 6] >> (i & 63)) & 1u; }
  void set(int64_t i) { words[i >> 6] |= uint64_t{1} << (i & 63); }
  void clear(int64_t i) { words[i >> 6] &= ~(uint64_t{1} << (i & 63)); }
};

// One query's expansion; `visited` is all clear on entry and on return.
void expand_one(const int64_t* row_ptr, const int64_t* col_idx, const int64_t* sources, int64_t num_src,
                int64_t hops, int64_t capacity, int64_t max_fanout, int64_t max_frontier, bool keep_sources,
                Bitmap visited, Lists out, int64_t* count_out, bool* truncated_out) {
  int64_t count = 0;
  bool truncated = false;
  auto append = [&](int64_t v, int64_t hop, int64_t seed, int64_t parent, int64_t edge) {
    out.node[count] = v;
    out.hop[count] = hop;
    out.seed[count] = seed;
    out.parent[count] = parent;
    out.edge[count] = edge;
    visited.set(v);
    ++count;
  };
  if (keep_sources) {
    for (int64_t j = 0; j < num_src && !truncated; ++j) {
      const int64_t v = sources[j];
      if (v < 0 || visited.test(v)) continue;
      if (count == capacity) {
        truncated = true;
        break;
      }
      append(v, 0, v, -1, -1);
    }
  }
  // The frontier of the hop being expanded: list positions [fs, fe), or the sources row.
  int64_t fs = 0, fe = keep_sources ? count : num_src;
  for (int64_t h = 1; h <= hops && fs < fe && !truncated; ++h) {
    int64_t in_hop = 0;
    bool hop_full = false;
    for (int64_t i = fs; i < fe && !hop_full && !truncated; ++i) {
      const int64_t u = keep_sources ? out.node[i] : sources[i];
      if (u < 0) continue;
      const int64_t u_seed = keep_sources ? out.seed[i] : u;
      const int64_t begin = row_ptr[u];
      const int64_t end = row_ptr[u + 1] - begin > max_fanout ? begin + max_fanout : row_ptr[u + 1];
      for (int64_t e = begin; e < end; ++e) {
        const int64_t v = col_idx[e];
        if (visited.test(v)) continue;
        if (in_hop == max_frontier) {  // the frontier cap ends the hop, not the query
          hop_full = true;
          break;
        }
        if (count == capacity) {
          truncated = true;
          break;
        }
        append(v, h, u_seed, u, e);
        ++in_hop;
      }
    }
    fs = fe;
    fe = count;
  }
  for (int64_t i = 0; i < count; ++i) visited.clear(out.node[i]);
  *count_out = count;
  *truncated_out = truncated;
}

// The expansion's outputs: nodes, hop, seed, parent, edge (B, capacity), count (B,), truncated (B,).
struct Expansion {
  carray<int64_t> node, hop, seed, parent, edge, count;
  py::array_t<bool> truncated;
};

// Expansion of num_q queries into fresh output arrays (inputs as validated raw pointers).
Expansion expand_raw(const int64_t* rp, const int64_t* ci, const int64_t* src, int64_t num_q, int64_t num_src,
                     int64_t num_cols, int64_t hops, int64_t capacity, int64_t max_fanout, int64_t max_frontier,
                     bool keep_sources) {
  const std::vector<py::ssize_t> shape{num_q, capacity};
  Expansion out{carray<int64_t>(shape), carray<int64_t>(shape), carray<int64_t>(shape), carray<int64_t>(shape),
                carray<int64_t>(shape), carray<int64_t>(std::vector<py::ssize_t>{num_q}),
                py::array_t<bool>(std::vector<py::ssize_t>{num_q})};
  Lists lists{out.node.mutable_data(), out.hop.mutable_data(), out.seed.mutable_data(), out.parent.mutable_data(),
              out.edge.mutable_data()};
  int64_t* cnt = out.count.mutable_data();
  bool* trunc = out.truncated.mutable_data();
  {
    py::gil_scoped_release release;
    std::fill(lists.node, lists.node + num_q * capacity, -1);
    std::fill(lists.hop, lists.hop + num_q * capacity, -1);
    std::fill(lists.seed, lists.seed + num_q * capacity, -1);
    std::fill(lists.parent, lists.parent + num_q * capacity, -1);
    std::fill(lists.edge, lists.edge + num_q * capacity, -1);
    auto run = [&](int64_t b) {
      const int64_t off = b * capacity;
      Lists row{lists.node + off, lists.hop + off, lists.seed + off, lists.parent + off, lists.edge + off};
      expand_one(rp, ci, src + b * num_src, num_src, hops, capacity, max_fanout, max_frontier, keep_sources,
                 Bitmap{visited_bitmap(num_cols).data()}, row, cnt + b, trunc + b);
    };
    // A query lists at most `capacity` nodes (about 10-20 ns each with the edges it scans): below
    // about 16K list entries in all, a parallel region costs more than it saves.
    if (num_q == 1 || num_q * capacity < (int64_t{1} << 14)) {
      for (int64_t b = 0; b < num_q; ++b) run(b);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t b = 0; b < num_q; ++b) run(b);
    }
  }
  return out;
}

py::tuple as_tuple(const Expansion& e) {
  return py::make_tuple(e.node, e.hop, e.seed, e.parent, e.edge, e.count, e.truncated);
}

py::tuple expand(carray<int64_t> row_ptr, carray<int64_t> col_idx, carray<int64_t> sources, int64_t num_cols,
                 int64_t hops, int64_t capacity, int64_t max_fanout, int64_t max_frontier, bool keep_sources) {
  require(row_ptr.ndim() == 1 && row_ptr.shape(0) >= 1, "row_ptr must be (R+1,)");
  require(col_idx.ndim() == 1 && sources.ndim() == 2, "col_idx must be (E,), sources (B, S)");
  require(capacity >= 1 && hops >= 0 && max_fanout >= 1 && max_frontier >= 1 && num_cols >= 0,
          "capacity, max_fanout, max_frontier must be >= 1 and hops, num_cols >= 0");
  return as_tuple(expand_raw(row_ptr.data(), col_idx.data(), sources.data(), sources.shape(0), sources.shape(1),
                            num_cols, hops, capacity, max_fanout, max_frontier, keep_sources));
}

// The per-call fast path (graph.khop_neighbourhood): a validated CSRGraph's int64 contiguous arrays and
// (B, S) int64 C-contiguous sources read in place.  None when a source lies outside [-1, num_rows): the
// general path then raises its ValueError.
py::object expand_ptr(std::uintptr_t row_ptr, int64_t num_rows, std::uintptr_t col_idx, std::uintptr_t sources,
                      int64_t num_q, int64_t num_src, int64_t num_cols, int64_t hops, int64_t capacity,
                      int64_t max_fanout, int64_t max_frontier) {
  require(num_rows >= 0 && num_q >= 1 && num_src >= 0 && capacity >= 1 && hops >= 0 && max_fanout >= 1 &&
              max_frontier >= 1 && num_cols >= 0,
          "expand_ptr: bad sizes");
  const int64_t* src = in_ptr<int64_t>(sources);
  for (int64_t e = 0; e < num_q * num_src; ++e)
    if (src[e] < -1 || src[e] >= num_rows) return py::none();
  return as_tuple(expand_raw(in_ptr<int64_t>(row_ptr), in_ptr<int64_t>(col_idx), src, num_q, num_src, num_cols,
                            hops, capacity, max_fanout, max_frontier, true));
}

// graph.graph_retrieve's fast path, fused: the cosine top-k seeds of plain float32 CPU queries (Q, D),
// 1 <= Q < max_queries, over the node embeddings (N, D) (tensor_args.h), k an int in [1, max_k],
// dropped (-1 / -inf) where they score below min_score (compared in float32, as the reference's
// tensor comparison does), then their expansion (keep_sources) over a validated square CSRGraph of
// N rows read in place.  The top-k is tree.cpp's, reached through the C signature at `topk_into`
// (tree.cpp topk_into_address), so both modules run one scan and raise its ValueErrors.  Returns
// (seeds, seed_scores, nodes, hop, seed, parent, edge, count, truncated) as torch tensors, or None
// when the input is not this case (the general path then validates and explains).
using TopKInto = const char* (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, int64_t*, float*);

py::object retrieve(py::handle queries, py::handle embeddings, py::handle k_obj, std::uintptr_t topk_into,
                    std::uintptr_t row_ptr, int64_t num_rows, std::uintptr_t col_idx, int64_t hops, int64_t capacity,
                    int64_t max_fanout, int64_t max_frontier, bool use_min_score, double min_score,
                    int64_t max_queries, int64_t max_k) {
  namespace ta = tensor_args;
  require(topk_into != 0 && num_rows >= 0 && hops >= 0 && capacity >= 1 && max_fanout >= 1 && max_frontier >= 1,
          "retrieve: bad arguments");
  ta::Plain<2> q, emb;
  int64_t k;
  if (!ta::topk_args(queries, embeddings, k_obj, max_queries, max_k, &q, &emb, &k)) return py::none();
  const int64_t Q = q.size[0], N = emb.size[0], D = emb.size[1];
  if (N != num_rows) return py::none();
  py::array_t<int64_t> seeds({Q, k});
  py::array_t<float> scores({Q, k});
  int64_t* ids = seeds.mutable_data();
  float* s = scores.mutable_data();
  const char* error = reinterpret_cast<TopKInto>(topk_into)(in_ptr<float>(q.data), Q, in_ptr<float>(emb.data), N, D,
                                                            k, ids, s);
  if (error != nullptr) require(false, error);
  if (use_min_score) {
    const float threshold = min_score > std::numeric_limits<float>::max()    ? std::numeric_limits<float>::infinity()
                            : min_score < -std::numeric_limits<float>::max() ? -std::numeric_limits<float>::infinity()
                                                                             : static_cast<float>(min_score);
    for (int64_t j = 0; j < Q * k; ++j)
      if (!(s[j] >= threshold)) {
        ids[j] = -1;
        s[j] = -std::numeric_limits<float>::infinity();
      }
  }
  const Expansion e = expand_raw(in_ptr<int64_t>(row_ptr), in_ptr<int64_t>(col_idx), ids, Q, k, num_rows,
                                 std::min(hops, num_rows), capacity, max_fanout, max_frontier, true);
  return py::make_tuple(ta::to_tensor(seeds), ta::to_tensor(scores), ta::to_tensor(e.node), ta::to_tensor(e.hop),
                        ta::to_tensor(e.seed), ta::to_tensor(e.parent), ta::to_tensor(e.edge), ta::to_tensor(e.count),
                        ta::to_tensor(e.truncated));
}

}  // namespace
}  // namespace streammem

PYBIND11_MODULE(_cpu_graph, m) {
  namespace py = pybind11;
  m.doc() = "Batched k-hop neighbourhood expansion over CSR (CPU, OpenMP over queries)";
  m.def("expand", &streammem::expand, py::arg("row_ptr"), py::arg("col_idx"), py::arg("sources"),
        py::arg("num_cols"), py::arg("hops"), py::arg("capacity"), py::arg("max_fanout"), py::arg("max_frontier"),
        py::arg("keep_sources"));
  m.def("expand_ptr", &streammem::expand_ptr, py::arg("row_ptr"), py::arg("num_rows"), py::arg("col_idx"),
        py::arg("sources"), py::arg("num_q"), py::arg("num_src"), py::arg("num_cols"), py::arg("hops"),
        py::arg("capacity"), py::arg("max_fanout"), py::arg("max_frontier"),
        "expand (keep_sources) on int64 C-contiguous arrays read in place; None if a source is out of range");
  m.def("retrieve", &streammem::retrieve, py::arg("queries"), py::arg("node_embeddings"), py::arg("k"),
        py::arg("topk_into"), py::arg("row_ptr"), py::arg("num_rows"), py::arg("col_idx"), py::arg("hops"),
        py::arg("capacity"), py::arg("max_fanout"), py::arg("max_frontier"), py::arg("use_min_score"),
        py::arg("min_score"), py::arg("max_queries"), py::arg("max_k"),
        "graph_retrieve fused: cosine top-k seeds, min_score, expansion; None when not this case");
}
