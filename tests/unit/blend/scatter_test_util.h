// The scatter tests' harness: a registered model (layout_test_util.h's builders), stored
// objects whose keys were computed at their old positions from a real rotary table, and
// a check of the destination after a scatter that uses only the test's own knowledge of
// the layout (which dimension is K/V, block, token; what a K row looks like), never the
// plan under test:
//   - each matched token's K row equals the engine's K at the new position (within the
//     rope tests' bounds), its V row (and every unrotated row) the stored bytes exactly;
//   - every other byte of every registered buffer (a canary pattern) is unchanged.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "../layout/layout_test_util.h"
#include "blend/scatter.h"
#include "rope_test_util.h"

namespace kvd::blend::test_util {

using namespace kvd::layout::test_util;  // NOLINT
using BlockIds = std::vector<std::vector<int64_t>>;

// The test's statement of one kernel group's key rows, and the rope the request passes.
struct GroupKeys {
  KRowGeometry geo;  // a K row (rot_dim 0: never rotated, geo only sizes the row)
  GroupRope rope;    // table null: the request asks for no rotation
};

struct MatchSpec {
  int64_t old_st, cur_st, n;
};

// A stored chunk object and the raw keys it was made from: raw[group][layer][token].
struct Stored {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<std::vector<std::vector<double>>>> raw;
};

inline bool TwoPlanes(const TestTensor& t) { return t.kv_dim >= 0 || t.vllm_cpu; }

// The object of a chunk whose token r was computed at old_st + r.
inline Stored MakeObject(const TestModel& m, const std::vector<GroupKeys>& keys,
                         const EngineTable& engine, int64_t chunk, int64_t old_st,
                         std::mt19937_64& rng) {
  Stored s;
  s.raw.resize(m.groups.size());
  for (size_t gi = 0; gi < m.groups.size(); ++gi) {
    const auto& tensors = m.groups[gi].tensors;
    const KRowGeometry& geo = keys[gi].geo;
    const int64_t planes = TwoPlanes(m.tensors[tensors[0]]) ? 2 : 1;
    s.raw[gi].resize(tensors.size());
    for (int64_t kv = 0; kv < planes; ++kv) {
      for (size_t li = 0; li < tensors.size(); ++li) {
        for (int64_t t = 0; t < chunk; ++t) {
          if (kv == 0) {
            auto raw = RawRow(geo, rng);
            auto row = KeyAt(raw, geo, engine, geo.rot_dim > 0 ? old_st + t : 0);
            s.bytes.insert(s.bytes.end(), row.begin(), row.end());
            s.raw[gi][li].push_back(std::move(raw));
          } else {
            for (int64_t b = 0; b < geo.row_bytes(); ++b)
              s.bytes.push_back(static_cast<uint8_t>(rng()));
          }
        }
      }
    }
  }
  return s;
}

// Everything a scatter scenario needs, and its check.
// Move-only: bases and wire_matches point into its own buffers.
struct Scenario {
  Scenario() = default;
  Scenario(Scenario&&) = default;
  Scenario& operator=(Scenario&&) = default;
  Scenario(const Scenario&) = delete;
  Scenario& operator=(const Scenario&) = delete;

  TestModel model;
  int64_t chunk = 0;
  std::vector<GroupKeys> keys;  // per group of model.groups
  const EngineTable* engine = nullptr;
  BlockIds ids;  // destination block tables, one per block-id list
  std::vector<MatchSpec> matches;
  int64_t null_block_id = -1;

  layout::KvLayout layout;
  Buffers bufs;
  Buffers before;
  std::vector<Stored> objects;
  std::vector<uint64_t> sizes;
  std::vector<uint8_t*> bases;
  std::vector<BlendMatch> wire_matches;
  std::vector<GroupRope> ropes;

  // Builds the layout, the objects and canary-filled buffers. false (with a test failure)
  // when the layout does not build.
  bool Prepare(uint64_t seed = 1) {
    auto l =
        layout::BuildLayout(model.Descriptors(), model.hints, model.infos, chunk, model.options);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return false;
    layout = std::move(l).value();
    EXPECT_EQ(layout.groups.size(), model.groups.size()) << layout.Describe();
    for (size_t gi = 0; gi < std::min(layout.groups.size(), keys.size()); ++gi) {
      EXPECT_EQ(layout.groups[gi].row_bytes, keys[gi].geo.row_bytes()) << "group " << gi;
    }
    std::mt19937_64 rng(seed);
    objects.clear();
    for (const auto& mt : matches)
      objects.push_back(MakeObject(model, keys, *engine, chunk, mt.old_st, rng));
    bufs = Buffers::Random(model, seed * 7919 + 1);
    before = bufs;
    bases = bufs.Bases(model);
    sizes.clear();
    for (const auto& t : model.tensors) sizes.push_back(bufs.seg.at(t.desc.shm_name).size());
    wire_matches.clear();
    for (size_t i = 0; i < matches.size(); ++i) {
      wire_matches.push_back({matches[i].old_st, matches[i].cur_st, matches[i].n,
                              objects[i].bytes.data(), objects[i].bytes.size()});
    }
    ropes.clear();
    for (const auto& k : keys) ropes.push_back(k.rope);
    return true;
  }

  ScatterRequest Request() const {
    ScatterRequest r;
    r.layout = &layout;
    r.tensor_bases = bases;
    r.tensor_sizes = sizes;
    r.block_ids = ids;
    r.matches = wire_matches;
    r.rope = ropes;
    r.null_block_id = null_block_id;
    return r;
  }

  // Plans and executes; the plan's outcome.
  Result<RetrieveReason> Run() {
    auto plan = PlanScatter(Request());
    if (!plan.ok()) return plan.status();
    ExecuteScatter(*plan);
    return plan->reason();
  }

  // True when no byte of any buffer changed.
  bool Untouched() const { return bufs.seg == before.seg; }

  // The check described at the top of this file; `rotated` receives the key error.
  void CheckScattered(RowError* rotated) {
    std::map<std::string, std::vector<bool>> written;
    for (const auto& [name, seg] : bufs.seg) written[name].assign(seg.size(), false);
    for (size_t mi = 0; mi < matches.size(); ++mi) {
      const MatchSpec& mt = matches[mi];
      const Stored& obj = objects[mi];
      uint64_t group_off = 0;
      for (size_t gi = 0; gi < model.groups.size(); ++gi) {
        const auto& eg = model.groups[gi];
        const GroupKeys& k = keys[gi];
        const int64_t row_bytes = k.geo.row_bytes();
        const int64_t planes = TwoPlanes(model.tensors[eg.tensors[0]]) ? 2 : 1;
        const int64_t layers = static_cast<int64_t>(eg.tensors.size());
        for (int64_t kv = 0; kv < planes; ++kv) {
          for (int64_t li = 0; li < layers; ++li) {
            const TestTensor& tt = model.tensors[eg.tensors[li]];
            const int64_t tpb = TokensPerBlock(tt);
            auto& seg = bufs.seg.at(tt.desc.shm_name);
            auto& mask = written.at(tt.desc.shm_name);
            for (int64_t t = 0; t < mt.n; ++t) {
              const int64_t pos = mt.cur_st + t;
              const int64_t block = ids[eg.block_list][pos / tpb];
              std::vector<uint8_t> got;
              for (auto [off, len] : TokenRow(tt, kv, block, pos % tpb)) {
                got.insert(got.end(), seg.begin() + off, seg.begin() + off + len);
                for (int64_t i = 0; i < len; ++i) mask[off + i] = true;
              }
              ASSERT_EQ(static_cast<int64_t>(got.size()), row_bytes);
              const uint8_t* stored =
                  obj.bytes.data() + group_off + ((kv * layers + li) * chunk + t) * row_bytes;
              const bool turned = kv == 0 && k.rope.table != nullptr && mt.old_st != mt.cur_st;
              if (turned) {
                const auto want = KeyAt(obj.raw[gi][li][t], k.geo, *engine, pos);
                rotated->Merge(CompareRows(got.data(), want.data(), k.geo));
              } else {
                ASSERT_EQ(0, std::memcmp(got.data(), stored, row_bytes))
                    << "group " << gi << " plane " << kv << " layer " << li << " token " << t;
              }
            }
          }
        }
        group_off += static_cast<uint64_t>(planes * layers * chunk * row_bytes);
      }
    }
    for (const auto& [name, seg] : bufs.seg) {
      const auto& was = before.seg.at(name);
      const auto& mask = written.at(name);
      int64_t changed = 0;
      for (size_t i = 0; i < seg.size(); ++i) changed += !mask[i] && seg[i] != was[i];
      EXPECT_EQ(changed, 0) << "bytes outside the destination rows changed in " << name;
    }
  }
};

// The bounds of the rope tests for keys of type e.
inline void ExpectKeysExact(const RowError& e, KvElem elem) {
  EXPECT_GT(e.elems, 0);
  if (elem == KvElem::kFloat32) {
    EXPECT_LE(e.max_rel, 1e-5);
  } else {
    EXPECT_GE(e.Fraction(), 0.999) << e.within_one << " of " << e.elems;
    EXPECT_LE(e.max_ulp, 2.0);
  }
  EXPECT_TRUE(e.outside_same);
}

// A destination block table for `positions` tokens: distinct ids from [first, nb),
// shuffled, so that consecutive blocks are never adjacent by accident.
inline std::vector<int64_t> ShuffledBlocks(int64_t nb, int64_t count, uint64_t seed,
                                           int64_t first = 1) {
  std::vector<int64_t> ids;
  for (int64_t b = first; b < nb; ++b) ids.push_back(b);
  std::mt19937_64 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(static_cast<size_t>(count));
  return ids;
}

inline KRowGeometry KeyRow(KvElem e, RopeStyle s, int64_t heads, int64_t stride, int64_t offset,
                           int64_t rot) {
  KRowGeometry g;
  g.elem = e;
  g.style = s;
  g.num_heads = heads;
  g.head_stride = stride;
  g.rot_offset = offset;
  g.rot_dim = rot;
  return g;
}

// The rotary table the scatter tests use (Llama-3-like base 500000, 64 rotated dims) and the
// per-group rope over it.
inline const EngineTable& Engine500k() {
  static const EngineTable* t = new EngineTable(MakeEngineTable(4096, 64, 500000.0));
  return *t;
}
inline const RopeTable& Table500k() {
  static const RopeTable* t = new RopeTable(MustTable(Engine500k()));
  return *t;
}

inline GroupRope Rope(int64_t head_size, RopeStyle style, int64_t offset = 0,
                      KvQuant quant = KvQuant::kNone) {
  GroupRope r;
  r.table = &Table500k();
  r.rot_offset = offset;
  r.rot_width = 64;
  r.head_size = head_size;
  r.style = style;
  r.kv_quant = quant;
  return r;
}

// Three matches into one request: shifted later and not block-aligned, shifted earlier
// and partial, and one at its own position (copied as stored).
inline std::vector<MatchSpec> ThreeMatches(int64_t chunk) {
  return {{chunk, 37, chunk},
          {5 * chunk, 37 + chunk + 3, chunk - 9},
          {2 * chunk + 40, 2 * chunk + 40, chunk - 40}};
}

}  // namespace kvd::blend::test_util
