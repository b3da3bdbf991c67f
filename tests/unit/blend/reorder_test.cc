// The reorder planner against lmcache 0.5.6's own answers (tests/unit/blend/data/
// reorder_goldens.json, written by tools/blend/make_reorder_goldens.py from lmcache's
// modules/blend/reorder.py): every plan (the same permutation, or none) and every
// PromptStore answer (resolve; candidates newest first, with the baseline) of the scripts,
// eviction by the token bound included. Then what lmcache does not pin down: a passed
// deadline gives no plan, out-of-range inputs give none, a plan is a permutation that keeps
// the prompt's end last.
#include "blend/reorder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "keys/chunk_hasher.h"

namespace kvd::blend {
namespace {

using nlohmann::json;

const json& Goldens() {
  static const json j = [] {
    std::ifstream in(std::string(KVD_SOURCE_DIR) + "/tests/unit/blend/data/reorder_goldens.json");
    EXPECT_TRUE(in.good());
    return json::parse(in);
  }();
  return j;
}

std::vector<uint32_t> Tokens(const json& segment_ids) {
  std::vector<uint32_t> t;
  for (const auto& s : segment_ids) {
    for (const auto& v : Goldens()["segments"][s.get<size_t>()]) t.push_back(v.get<uint32_t>());
  }
  return t;
}

// Runs [start, length] of a permutation.
json Runs(const std::vector<uint32_t>& perm) {
  json out = json::array();
  for (uint32_t i : perm) {
    if (!out.empty() && out.back()[0].get<uint32_t>() + out.back()[1].get<uint32_t>() == i) {
      out.back()[1] = out.back()[1].get<uint32_t>() + 1;
    } else {
      out.push_back(json::array({i, 1}));
    }
  }
  return out;
}

// The store's chain hashes (16-token chunks): equal exactly when the token prefixes are.
std::vector<ChainHash> Chain(const std::vector<uint32_t>& t) {
  std::vector<int64_t> wide(t.begin(), t.end());
  auto h = keys::ComputeChunkHashes(wide, 16);
  EXPECT_TRUE(h.ok());
  return {h->begin(), h->end()};
}

TEST(ReorderGolden, PlansAreLmcachesPlans) {
  FakeClock clock;
  const PlanDeadline never(&clock, INT64_MAX);
  size_t planned = 0;
  for (size_t c = 0; c < Goldens()["plans"].size(); ++c) {
    const json& g = Goldens()["plans"][c];
    SCOPED_TRACE("plan " + std::to_string(c));
    const std::vector<uint32_t> p = Tokens(g["prompt"]);
    std::vector<std::vector<uint32_t>> hs;
    for (const auto& h : g["candidates"]) hs.push_back(Tokens(h));
    std::vector<std::span<const uint32_t>> spans(hs.begin(), hs.end());
    auto perm = PlanReorder(p, spans, g["chunk_size"].get<int64_t>(), g["baseline_chunks"].get<int64_t>(),
                            never, g["keep_prefix"].get<size_t>());
    if (g["perm"].is_null()) {
      EXPECT_FALSE(perm.has_value()) << Runs(*perm).dump();
      continue;
    }
    ASSERT_TRUE(perm.has_value()) << "lmcache: " << g["perm"].dump();
    EXPECT_EQ(Runs(*perm), g["perm"]);
    ++planned;
  }
  EXPECT_GE(planned, 10u) << "the goldens exercise real plans";
}

TEST(ReorderGolden, PromptStoreAnswersAsLmcaches) {
  for (size_t sc = 0; sc < Goldens()["stores"].size(); ++sc) {
    const json& script = Goldens()["stores"][sc];
    SCOPED_TRACE("store script " + std::to_string(sc));
    PromptStore store(script["max_tokens"].get<size_t>());
    std::vector<std::vector<uint32_t>> recorded;
    for (const auto& ids : script["recorded"]) recorded.push_back(Tokens(ids));
    auto ns_of = [](const json& j) {
      return PromptNamespace{j[0].get<std::string>(), j[1].get<int64_t>(), j[2].get<std::string>()};
    };
    size_t step_no = 0;
    for (const auto& step : script["steps"]) {
      SCOPED_TRACE("step " + std::to_string(step_no++));
      const std::string op = step["op"];
      if (op == "record") {
        const auto& t = recorded[step["prompt"].get<size_t>()];
        store.Record(ns_of(step["ns"]), step["request_id"].get<std::string>(), t, Chain(t));
      } else if (op == "resolve") {
        const json& q = step["query"];
        auto r = store.Resolve(q[0].get<std::string>(), q[1].get<int64_t>(), q[2].get<std::string>());
        if (step["resolved"].is_null()) {
          EXPECT_FALSE(r.has_value());
        } else {
          ASSERT_TRUE(r.has_value());
          EXPECT_EQ(*r, ns_of(step["resolved"]));
        }
      } else {
        std::vector<ChainHash> hits;
        for (const auto& h : step["hits"]) hits.push_back(Chain(recorded[h[0].get<size_t>()])[h[1].get<size_t>()]);
        auto found = store.Find(ns_of(step["ns"]), hits, Chain(recorded[step["query"].get<size_t>()]));
        std::vector<size_t> got;
        for (const auto& p : found.prompts) {
          auto it = std::find(recorded.begin(), recorded.end(), *p);
          ASSERT_NE(it, recorded.end());
          got.push_back(static_cast<size_t>(it - recorded.begin()));
        }
        EXPECT_EQ(json(got), step["candidates"]);
        EXPECT_EQ(found.baseline_chunks, step["baseline_chunks"].get<int64_t>());
      }
    }
    // The bound holds, unless one prompt alone is over it (the newest is always kept).
    EXPECT_TRUE(store.tokens() <= script["max_tokens"].get<size_t>() || store.prompts() == 1)
        << store.tokens() << " tokens in " << store.prompts() << " prompts";
  }
}

// A prompt of two 40-token documents and a 20-token question; the stored one has them the
// other way round.
struct TwoDocs {
  std::vector<uint32_t> a, b, q;
  TwoDocs() {
    for (uint32_t i = 0; i < 40; ++i) a.push_back(1000 + i), b.push_back(2000 + i);
    for (uint32_t i = 0; i < 20; ++i) q.push_back(3000 + i);
  }
  std::vector<uint32_t> Join(std::initializer_list<const std::vector<uint32_t>*> parts) const {
    std::vector<uint32_t> out;
    for (auto* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
  }
};

TEST(Reorder, PlanIsAPermutationThatCopiesTheStoredOrderAndKeepsTheEndLast) {
  TwoDocs d;
  const auto stored = d.Join({&d.b, &d.a});
  const auto prompt = d.Join({&d.a, &d.b, &d.q});
  FakeClock clock;
  std::vector<std::span<const uint32_t>> cands{stored};
  auto perm = PlanReorder(prompt, cands, 16, 0, PlanDeadline(&clock, INT64_MAX), 0);
  ASSERT_TRUE(perm.has_value());
  std::vector<uint32_t> sorted = *perm;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], i);
  std::vector<uint32_t> served;
  for (uint32_t i : *perm) served.push_back(prompt[i]);
  EXPECT_TRUE(std::equal(stored.begin(), stored.end(), served.begin())) << "starts with the stored prompt";
  EXPECT_TRUE(std::equal(d.q.begin(), d.q.end(), served.end() - static_cast<std::ptrdiff_t>(d.q.size())));
  // Nothing to gain over the baseline, or the stored prompt already a prefix: no plan.
  EXPECT_FALSE(PlanReorder(prompt, cands, 16, 5, PlanDeadline(&clock, INT64_MAX), 0));
  std::vector<std::span<const uint32_t>> own{prompt};
  EXPECT_FALSE(PlanReorder(prompt, own, 16, 0, PlanDeadline(&clock, INT64_MAX), 0));
}

TEST(Reorder, PassedDeadlineAndOutOfRangeInputsGiveNoPlan) {
  TwoDocs d;
  const auto stored = d.Join({&d.b, &d.a});
  const auto prompt = d.Join({&d.a, &d.b, &d.q});
  FakeClock clock;
  std::vector<std::span<const uint32_t>> cands{stored};
  EXPECT_FALSE(PlanReorder(prompt, cands, 16, 0, PlanDeadline(&clock, clock.NowNanos() - 1), 0));
  const PlanDeadline never(&clock, INT64_MAX);
  EXPECT_FALSE(PlanReorder(prompt, cands, 16, 0, never, prompt.size() + 1)) << "keep_prefix past the prompt";
  EXPECT_FALSE(PlanReorder(prompt, cands, 0, 0, never, 0)) << "chunk size 0";
  EXPECT_FALSE(PlanReorder({}, cands, 16, 0, never, 0));
  EXPECT_FALSE(PlanReorder(prompt, {}, 16, 0, never, 0));
  // keep_prefix: a candidate that does not start with the kept tokens is not copied.
  EXPECT_FALSE(PlanReorder(prompt, cands, 16, 0, never, 5));
}

TEST(Reorder, StoreBoundEvictsTheOldestPromptAndItsHashes) {
  PromptStore store(100);
  const PromptNamespace ns{"m", 1, ""};
  std::vector<uint32_t> a(64, 7), b(64, 9);
  for (uint32_t i = 0; i < 64; ++i) a[i] += i, b[i] += 2 * i;
  store.Record(ns, "a", a, Chain(a));
  store.Record(ns, "b", b, Chain(b));  // 128 tokens > 100: "a" goes
  EXPECT_EQ(store.prompts(), 1u);
  EXPECT_EQ(store.tokens(), 64u);
  auto found = store.Find(ns, Chain(a), Chain(a));
  EXPECT_EQ(found.baseline_chunks, 0) << "a's hashes left with it";
  ASSERT_EQ(found.prompts.size(), 1u) << "the newest prompt is always a candidate";
  EXPECT_EQ(*found.prompts[0], b);
  EXPECT_FALSE(store.Resolve("m", 1, "other-salt"));
  EXPECT_EQ(store.Resolve("", 0, "").value(), ns);
}

}  // namespace
}  // namespace kvd::blend
