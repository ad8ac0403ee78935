// Batched k-hop neighbourhood expansion over a CSR graph, and graph_retrieve fused, CPU kernels
// (the spec: streammem_kernels/graph/reference.py; the public functions: graph/__init__.py).
//
//   expand(row_ptr (R+1) i64, col_idx (E) i64 in [0, num_cols), sources (B,S) i64, num_cols, hops >= 0,
//          max_fanout >= 1, max_frontier >= 1, keep_sources, nodes, hop, seed, parent, edge (B,C) i64,
//          count (B) i64, truncated (B) bool) -> Status
//     The five fields of every query's list, padded with -1 after count[b] entries.
//     Status 1: a source outside [-1, R).
//   retrieve(queries (Q,D) f32, embeddings (R,D) f32, row_ptr, col_idx, hops, max_fanout,
//            max_frontier, min_score, seeds (Q,k) i64, seed_scores (Q,k) f32, nodes, hop, seed, parent,
//            edge (Q,C) i64, count (Q) i64, truncated (Q) bool) -> Status
//     graph_retrieve on a square graph in one call: the exact cosine top-k seeds (cosine_scan.h, the
//     scan of cosine_topk), those scoring below min_score dropped (-1 / -inf; -inf: none dropped),
//     then their expansion (keep_sources).  Status 1: queries not finite, 2: embeddings not finite.
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
#include "cosine_scan.h"
#include "tensor_view.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
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


// Expansion of num_q queries of num_src sources each into the lists (num_q, capacity each), count and
// truncated (inputs checked by the caller).  Call with the GIL held; it runs without it.
void expand_into(const int64_t* rp, const int64_t* ci, const int64_t* src, int64_t num_q, int64_t num_src,
                 int64_t num_cols, int64_t hops, int64_t capacity, int64_t max_fanout, int64_t max_frontier,
                 bool keep_sources, Lists lists, int64_t* cnt, bool* trunc) {
  py::gil_scoped_release release;
  const int64_t plane = num_q * capacity;
  for (int64_t* field : {lists.node, lists.hop, lists.seed, lists.parent, lists.edge})
    std::fill(field, field + plane, int64_t(-1));
  auto run = [&](int64_t b) {
    const int64_t off = b * capacity;
    Lists row{lists.node + off, lists.hop + off, lists.seed + off, lists.parent + off, lists.edge + off};
    expand_one(rp, ci, src + b * num_src, num_src, hops, capacity, max_fanout, max_frontier, keep_sources,
               Bitmap{visited_bitmap(num_cols).data()}, row, cnt + b, trunc + b);
  };
  // A query lists at most `capacity` nodes (about 10-20 ns each with the edges it scans): below
  // about 16K list entries in all, a parallel region costs more than it saves.
  const int threads = num_q == 1 ? 1 : threads_for(num_q * capacity, int64_t{1} << 13);
  if (threads == 1) {
    for (int64_t b = 0; b < num_q; ++b) run(b);
  } else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int64_t b = 0; b < num_q; ++b) run(b);
  }
}

// The outputs of an expansion of B queries: the lists nodes, hop, seed, parent, edge (B, C) int64 with
// C >= 1, count (B,) int64 and truncated (B,) bool; returns the lists' pointers.
Lists expect_expansion(const TensorView& nodes, const TensorView& hop, const TensorView& seed,
                       const TensorView& parent, const TensorView& edge, const TensorView& count,
                       const TensorView& truncated, int64_t B, const char* entry) {
  const char* names[] = {"nodes", "hop", "seed", "parent", "edge"};
  const TensorView* fields[] = {&nodes, &hop, &seed, &parent, &edge};
  for (int f = 0; f < 5; ++f) {
    expect_tensor(*fields[f], DType::kInt64, 2, entry, names[f]);
    expect(fields[f]->size(0) == B && fields[f]->size(1) == nodes.size(1) && nodes.size(1) >= 1, entry,
           "the lists must be (B, capacity) with capacity >= 1");
  }
  expect_tensor(count, DType::kInt64, 1, entry, "count");
  expect_tensor(truncated, DType::kBool, 1, entry, "truncated");
  expect(count.size(0) == B && truncated.size(0) == B, entry, "count and truncated must be (B,)");
  return Lists{nodes.ptr<int64_t>(), hop.ptr<int64_t>(), seed.ptr<int64_t>(), parent.ptr<int64_t>(),
               edge.ptr<int64_t>()};
}

// A graph's CSR: row_ptr (R+1,) and col_idx (E,) int64 (values validated when the CSRGraph was built).
void expect_csr(const TensorView& row_ptr, const TensorView& col_idx, const char* entry) {
  expect_tensor(row_ptr, DType::kInt64, 1, entry, "row_ptr");
  expect_tensor(col_idx, DType::kInt64, 1, entry, "col_idx");
  expect(row_ptr.size(0) >= 1, entry, "row_ptr must be (R+1,)");
}

}  // namespace

// Status 1 of expand: a source outside [-1, R).
constexpr Status kSourceOutside = 1;

Status expand(TensorView row_ptr, TensorView col_idx, TensorView sources, int64_t num_cols, int64_t hops,
              int64_t max_fanout, int64_t max_frontier, bool keep_sources, TensorView nodes, TensorView hop,
              TensorView seed, TensorView parent, TensorView edge, TensorView count, TensorView truncated) {
  constexpr const char* entry = "expand";
  expect_csr(row_ptr, col_idx, entry);
  expect_tensor(sources, DType::kInt64, 2, entry, "sources");
  const int64_t B = sources.size(0), S = sources.size(1), R = row_ptr.size(0) - 1;
  const Lists lists = expect_expansion(nodes, hop, seed, parent, edge, count, truncated, B, entry);
  expect(hops >= 0 && max_fanout >= 1 && max_frontier >= 1 && num_cols >= 0, entry,
         "hops, num_cols must be >= 0 and max_fanout, max_frontier >= 1");
  const int64_t* src = sources.ptr<int64_t>();
  for (int64_t e = 0; e < B * S; ++e)
    if (src[e] < -1 || src[e] >= R) return kSourceOutside;
  expand_into(row_ptr.ptr<int64_t>(), col_idx.ptr<int64_t>(), src, B, S, num_cols, hops, nodes.size(1), max_fanout,
              max_frontier, keep_sources, lists, count.ptr<int64_t>(), truncated.ptr<bool>());
  return kOk;
}

Status retrieve(TensorView queries, TensorView embeddings, TensorView row_ptr, TensorView col_idx, int64_t hops,
                int64_t max_fanout, int64_t max_frontier, double min_score, TensorView seeds, TensorView seed_scores,
                TensorView nodes, TensorView hop, TensorView seed, TensorView parent, TensorView edge,
                TensorView count, TensorView truncated) {
  constexpr const char* entry = "retrieve";
  expect_tensor(queries, DType::kFloat32, 2, entry, "queries");
  expect_tensor(embeddings, DType::kFloat32, 2, entry, "embeddings");
  expect_csr(row_ptr, col_idx, entry);
  expect_tensor(seeds, DType::kInt64, 2, entry, "seeds");
  expect_tensor(seed_scores, DType::kFloat32, 2, entry, "seed_scores");
  const int64_t Q = queries.size(0), N = embeddings.size(0), D = embeddings.size(1), k = seeds.size(1);
  const Lists lists = expect_expansion(nodes, hop, seed, parent, edge, count, truncated, Q, entry);
  expect(Q >= 1 && N >= 1 && D >= 1 && queries.size(1) == D && row_ptr.size(0) == N + 1, entry,
         "queries (Q, D) and embeddings (N, D) must be non-empty, one embedding per graph row");
  expect(k >= 1 && seeds.size(0) == Q && seed_scores.size(0) == Q && seed_scores.size(1) == k, entry,
         "seeds and seed_scores must be (Q, k)");
  expect(hops >= 0 && max_fanout >= 1 && max_frontier >= 1, entry,
         "hops must be >= 0 and max_fanout, max_frontier >= 1");
  int64_t* ids = seeds.ptr<int64_t>();
  float* s = seed_scores.ptr<float>();
  const int status =
      cosine::cosine_topk_into(queries.ptr<float>(), Q, embeddings.ptr<float>(), N, D, k, nullptr, ids, s);
  if (status != cosine::kScanOk) return status;  // 1: queries, 2: embeddings not finite
  // Compared in float32, as the reference's tensor comparison does (a bound beyond float32's range
  // is an infinity there too).
  const float threshold = min_score > std::numeric_limits<float>::max()    ? std::numeric_limits<float>::infinity()
                          : min_score < -std::numeric_limits<float>::max() ? -std::numeric_limits<float>::infinity()
                                                                           : static_cast<float>(min_score);
  if (threshold > -std::numeric_limits<float>::infinity())
    for (int64_t j = 0; j < Q * k; ++j)
      if (!(s[j] >= threshold)) {
        ids[j] = -1;
        s[j] = -std::numeric_limits<float>::infinity();
      }
  expand_into(row_ptr.ptr<int64_t>(), col_idx.ptr<int64_t>(), ids, Q, k, N, std::min(hops, N), nodes.size(1),
              max_fanout, max_frontier, true, lists, count.ptr<int64_t>(), truncated.ptr<bool>());
  return kOk;
}

}  // namespace streammem

PYBIND11_MODULE(_cpu_graph, m) {
  namespace py = pybind11;
  m.doc() = "Batched k-hop neighbourhood expansion over CSR (CPU, OpenMP over queries)";
  m.def("expand", &streammem::expand, py::arg("row_ptr"), py::arg("col_idx"), py::arg("sources"),
        py::arg("num_cols"), py::arg("hops"), py::arg("max_fanout"), py::arg("max_frontier"), py::arg("keep_sources"),
        py::arg("nodes"), py::arg("hop"), py::arg("seed"), py::arg("parent"), py::arg("edge"), py::arg("count"),
        py::arg("truncated"));
  m.def("retrieve", &streammem::retrieve, py::arg("queries"), py::arg("embeddings"), py::arg("row_ptr"),
        py::arg("col_idx"), py::arg("hops"), py::arg("max_fanout"), py::arg("max_frontier"), py::arg("min_score"),
        py::arg("seeds"), py::arg("seed_scores"), py::arg("nodes"), py::arg("hop"), py::arg("seed"),
        py::arg("parent"), py::arg("edge"), py::arg("count"), py::arg("truncated"));
}
