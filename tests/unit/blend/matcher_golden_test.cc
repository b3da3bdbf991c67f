// The blend matcher against lmcache 0.5.6's own answers (tests/unit/blend/data/
// matcher_goldens.json, written by tools/blend/make_matcher_goldens.py from lmcache's
// token_hasher, BlendTokenRangeMatcher, STORE handler and lookup selection):
//  - the window and rolling hashes, ids up to 2^64 - 1 included;
//  - the engineered 64-bit collision: equal H, reported in parity mode, refused by default;
//  - scripted stores / probes / removals replayed in parity mode give lmcache's matches,
//    registration counts and non-overlap selections, with storage keys equal to kvd's own
//    chained chunk hashes; replayed in default mode they differ only where kvd means to
//    (chunk 0 registered, no slot loss on removal, collision refused).
// Single-threaded; reads the golden file once per test.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "blend/matcher.h"
#include "blend/matcher_plan.h"
#include "blend/poly_hash.h"
#include "keys/blake3.h"
#include "keys/chunk_hasher.h"
#include "matcher_test_util.h"

namespace kvd::blend {
namespace {

using nlohmann::json;
using testing::MakeMatcher;
using testing::ProbeAll;

const json& Goldens() {
  static const json* g = [] {
    std::ifstream in(std::string(KVD_SOURCE_DIR) + "/tests/unit/blend/data/matcher_goldens.json");
    EXPECT_TRUE(in.good()) << "missing matcher_goldens.json";
    return new json(json::parse(in));
  }();
  return *g;
}

struct Row {
  int64_t old_st, old_ed, cur_st, cur_ed;
  std::string key;
  bool operator==(const Row&) const = default;
};

void PrintTo(const Row& r, std::ostream* os) {
  *os << "[" << r.old_st << "," << r.old_ed << "," << r.cur_st << "," << r.cur_ed << ","
      << r.key.substr(0, 8) << "]";
}

std::vector<Row> RowsOf(const json& rows) {
  std::vector<Row> out;
  for (const json& r : rows) out.push_back({r[0], r[1], r[2], r[3], r[4].get<std::string>()});
  return out;
}

std::vector<Row> RowsOf(const std::vector<MatchCandidate>& cands) {
  std::vector<Row> out;
  for (const auto& c : cands) {
    out.push_back({c.old_st, c.old_ed, c.cur_st, c.cur_ed, keys::HexEncode(c.key.bytes().data(), c.key.size())});
  }
  return out;
}

StorageKey KeyFromHex(const std::string& hex) {
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) bytes.push_back(std::stoi(hex.substr(i, 2), nullptr, 16));
  auto k = StorageKey::FromBytes(bytes);
  EXPECT_TRUE(k.ok());
  return k.ok() ? *k : StorageKey();
}

std::vector<uint32_t> Sequence(const json& op) {
  std::vector<uint32_t> out;
  for (const json& part : op.value("seq", json::array())) {
    for (const json& t : Goldens()["docs"][part.get<std::string>()]) out.push_back(t.get<uint32_t>());
  }
  return out;
}

TEST(MatcherGolden, PolyHashesEqualLmcache) {
  ASSERT_EQ(Goldens()["base"].get<uint64_t>(), kPolyBase);
  ASSERT_GE(Goldens()["poly"].size(), 4u);
  for (const json& c : Goldens()["poly"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const size_t k = c["k"];
    const auto t64 = c["tokens"].get<std::vector<uint64_t>>();
    const auto chunks = c["chunk_hashes"].get<std::vector<uint64_t>>();
    std::vector<uint64_t> got(t64.size() / k);
    HashWindows(std::span<const uint64_t>(t64), k, got);
    EXPECT_EQ(got, chunks);
    std::vector<uint64_t> rolling(t64.size() - k + 1);
    ASSERT_EQ(rolling.size(), c["num_rolling"].get<size_t>());
    RollingHashes(std::span<const uint64_t>(t64), k, rolling);
    const auto offsets = c["rolling_offsets"].get<std::vector<size_t>>();
    const auto want = c["rolling_hashes"].get<std::vector<uint64_t>>();
    for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(rolling[offsets[i]], want[i]) << offsets[i];
    // Ids below 2^32 hash the same through kvd's uint32 path.
    if (std::all_of(t64.begin(), t64.end(), [](uint64_t t) { return t < (uint64_t{1} << 32); })) {
      const std::vector<uint32_t> t32(t64.begin(), t64.end());
      std::vector<uint64_t> got32(t32.size() / k), rolling32(t32.size() - k + 1);
      HashWindows(std::span<const uint32_t>(t32), k, got32);
      RollingHashes(std::span<const uint32_t>(t32), k, rolling32);
      EXPECT_EQ(got32, chunks);
      EXPECT_EQ(rolling32, rolling);
    }
  }
  // lmcache's uint64 conversion refuses negative ids; kvd's request path refuses any id
  // outside [0, 2^32) before blend sees it (wire::TokenIds).
  EXPECT_EQ(Goldens()["numpy_negative_token_id"], "OverflowError");
}

TEST(MatcherGolden, EngineeredCollisionParityReportsItDefaultRefusesIt) {
  const json& c = Goldens()["collision"];
  const auto x = c["x"].get<std::vector<uint32_t>>();
  const auto y = c["y"].get<std::vector<uint32_t>>();
  ASSERT_EQ(x.size(), 256u);
  ASSERT_NE(x, y);
  for (size_t i = 0; i < 256; ++i) ASSERT_LT(std::max(x[i], y[i]), 50000u);
  const uint64_t h = PolyHashWindow(std::span<const uint32_t>(x));
  ASSERT_EQ(h, PolyHashWindow(std::span<const uint32_t>(y)));
  ASSERT_EQ(h, c["h"].get<uint64_t>());

  for (bool parity : {false, true}) {
    MatcherOptions o;
    o.lmcache_parity = parity;
    auto m = MakeMatcher(o);
    testing::RegisterOne(*m, 0, x, 256, testing::KeyN(1));
    ProbeCounts counts;
    const auto got = ProbeAll(*m, 0, y, 0, &counts);
    EXPECT_EQ(counts.hash_hits, 1u);
    if (parity) {
      ASSERT_EQ(got.size(), 1u) << "lmcache reports the colliding window";
      EXPECT_EQ(got[0].old_st, 256);
    } else {
      EXPECT_TRUE(got.empty()) << "the digest refuses the colliding window";
      EXPECT_EQ(counts.digest_rejects, 1u);
      EXPECT_EQ(m->Stats().digest_rejects, 1u);
    }
    EXPECT_EQ(ProbeAll(*m, 0, x).size(), 1u);
  }
}

// Replays one scenario; returns the matches of each probe, in order.
std::vector<std::vector<Row>> Replay(const json& scenario, bool parity) {
  MatcherOptions o;
  o.lmcache_parity = parity;
  o.dedup_content = scenario["dedup_content"];
  auto m = MakeMatcher(o);
  const Partition partition = 17;
  std::vector<std::vector<Row>> probes;
  for (const json& op : scenario["ops"]) {
    const std::string kind = op["op"];
    const std::vector<uint32_t> tokens = Sequence(op);
    if (kind == "store") {
      const int64_t start = op["start"], end = op["end"];
      // The storage keys are kvd's chained chunk hashes, as lmcache's.
      const std::vector<int64_t> t64(tokens.begin(), tokens.end());
      auto chain = keys::ComputeChunkHashes(t64, 256);
      EXPECT_TRUE(chain.ok());
      std::vector<StorageKey> keys;
      for (size_t i = start / 256; i < chain->size() && static_cast<int64_t>(i) * 256 < end; ++i) {
        keys.push_back(StorageKey::FromHash32((*chain)[i]));
      }
      std::vector<std::string> hex;
      for (const auto& k : keys) hex.push_back(keys::HexEncode(k.bytes().data(), k.size()));
      EXPECT_EQ(hex, op["keys"].get<std::vector<std::string>>());
      std::vector<uint8_t> committed;
      for (const json& b : op["committed"]) committed.push_back(b.get<bool>() ? 1 : 0);
      StoredRange r;
      r.tokens = tokens;
      r.start = start;
      r.end = end;
      r.committed = committed;
      r.keys = keys;
      auto plan = PlanRegistration(r, 256, parity);
      EXPECT_TRUE(plan.ok()) << plan.status().ToString();
      auto counts = m->Register(partition, *plan);
      EXPECT_TRUE(counts.ok());
      if (parity) {
        EXPECT_EQ(counts->registered, op["registered"].get<uint32_t>()) << op.dump().substr(0, 80);
      }
    } else if (kind == "probe") {
      const auto cands = ProbeAll(*m, partition, tokens);
      probes.push_back(RowsOf(cands));
      if (parity && op.contains("selected")) {
        const auto prefixes = op["select_prefixes"].get<std::vector<int64_t>>();
        for (size_t i = 0; i < prefixes.size(); ++i) {
          EXPECT_EQ(RowsOf(SelectNonOverlapping(cands, prefixes[i])), RowsOf(op["selected"][i]))
              << "prefix " << prefixes[i];
        }
      }
    } else if (kind == "remove") {
      for (const json& k : op["keys"]) m->Remove(partition, KeyFromHex(k));
    } else {
      ADD_FAILURE() << "unknown op " << kind;
    }
  }
  return probes;
}

std::vector<std::vector<Row>> GoldenProbes(const json& scenario) {
  std::vector<std::vector<Row>> out;
  for (const json& op : scenario["ops"]) {
    if (op["op"] == "probe") out.push_back(RowsOf(op["matches"]));
  }
  return out;
}

TEST(MatcherGolden, ScenariosInParityModeGiveLmcachesAnswers) {
  ASSERT_EQ(Goldens()["scenarios"].size(), 2u);
  for (const json& s : Goldens()["scenarios"]) {
    SCOPED_TRACE(s["name"].get<std::string>());
    const auto golden = GoldenProbes(s);
    const auto got = Replay(s, /*parity=*/true);
    ASSERT_EQ(got.size(), golden.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], golden[i]) << "probe " << i;
  }
}

TEST(MatcherGolden, DefaultModeDiffersOnlyWhereIntended) {
  const json& s = Goldens()["scenarios"][0];
  ASSERT_EQ(s["name"], "main");
  const json& ops = s["ops"];
  const auto golden = GoldenProbes(s);
  ASSERT_EQ(golden.size(), 10u);
  const auto got = Replay(s, /*parity=*/false);
  ASSERT_EQ(got.size(), golden.size());

  // The first store is [A, B, C] at 0; probes 0, 4 and 7 query [P100, A, C, B, P50]. kvd
  // registers chunk 0 (A), so it finds A at 100 as well.
  const size_t a_at = Goldens()["docs"]["P100"].size();
  const Row a{0, 256, static_cast<int64_t>(a_at), static_cast<int64_t>(a_at) + 256,
              ops[0]["keys"][0].get<std::string>()};
  auto expect = golden;
  for (size_t i : {0, 4, 7}) expect[i].insert(expect[i].begin(), a);
  // Probe 7 follows the removal of the first store's B, whose slot the second store's B had
  // overwritten: lmcache lost both; kvd keeps the second one (as in probe 4).
  expect[7].push_back(golden[4][1]);
  // Probe 9 queries the window that collides with a stored one: kvd's digest refuses it.
  ASSERT_EQ(golden[9].size(), 1u);
  expect[9].clear();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expect[i]) << "probe " << i;
}

}  // namespace
}  // namespace kvd::blend
