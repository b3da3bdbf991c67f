// The tier contract (src/l2/tier.h), run over every tier implementation: the in-memory
// reference, fs, fs_native with O_DIRECT, resp against a real redis-server, and valkey in
// cluster mode against a real 3-master Redis Cluster. Each backend also knows how to plant a
// truncated object, which every tier must report as Internal, never as data.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "l2/fault_tier.h"
#include "l2/fs_tier.h"
#include "l2/memory_tier.h"
#include "tier_backends.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using namespace testing;

class TierContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = MakeBackend(GetParam());
    ASSERT_NE(backend_, nullptr);
    auto t = backend_->Make();
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::move(t).value();
  }
  void TearDown() override {
    if (tier_) tier_->Close();
    tier_.reset();
    backend_.reset();
  }
  std::unique_ptr<TierBackend> backend_;
  std::shared_ptr<Tier> tier_;
};

TEST_P(TierContractTest, StoredObjectLoadsByteExact) {
  const auto k = Key(1);
  const auto v = Bytes(256 * 1024 + 17, 1);
  auto s = StoreOne(*tier_, k, v);
  ASSERT_TRUE(s.status.ok()) << s.status.ToString();
  EXPECT_EQ(s.bytes, v.size());
  auto e = ExistsSync(*tier_, {k});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_TRUE(e[0].status.ok()) << e[0].status.ToString();
  std::vector<uint8_t> out;
  auto l = LoadOne(*tier_, k, &out, v.size());
  ASSERT_TRUE(l.status.ok()) << l.status.ToString();
  EXPECT_EQ(l.bytes, v.size());
  EXPECT_EQ(out, v);
}

TEST_P(TierContractTest, AbsentObjectIsNotFound) {
  auto e = ExistsSync(*tier_, {Key(2)});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].status.code(), StatusCode::kNotFound);
  std::vector<uint8_t> out;
  EXPECT_EQ(LoadOne(*tier_, Key(2), &out, 4096).status.code(), StatusCode::kNotFound);
}

TEST_P(TierContractTest, WrongSizeIsAnErrorNotData) {
  const auto k = Key(3);
  const auto v = Bytes(8192, 3);
  ASSERT_TRUE(StoreOne(*tier_, k, v).status.ok());
  std::vector<uint8_t> out;
  EXPECT_EQ(LoadOne(*tier_, k, &out, 8192 + 4096).status.code(), StatusCode::kInternal);
  EXPECT_EQ(LoadOne(*tier_, k, &out, 4096).status.code(), StatusCode::kInternal);
  // A capacity-sized load takes the stored object whatever its size.
  out.assign(16384, 0);
  auto r = LoadSync(*tier_, {{k, out.data(), out.size(), true}});
  ASSERT_EQ(r.size(), 1u);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status.ToString();
  EXPECT_EQ(r[0].bytes, v.size());
  EXPECT_TRUE(std::equal(v.begin(), v.end(), out.begin()));
}

TEST_P(TierContractTest, TruncatedObjectIsInternal) {
  const auto k = Key(4);
  const auto v = Bytes(64 * 1024, 4);
  ASSERT_TRUE(StoreOne(*tier_, k, v).status.ok());
  ASSERT_TRUE(backend_->Truncate(*tier_, k, 1000).ok());
  std::vector<uint8_t> out;
  auto l = LoadOne(*tier_, k, &out, v.size());
  EXPECT_EQ(l.status.code(), StatusCode::kInternal) << l.status.ToString();
}

TEST_P(TierContractTest, FirstWriterWins) {
  const auto k = Key(5);
  const auto a = Bytes(4096, 50), b = Bytes(4096, 51);
  ASSERT_TRUE(StoreOne(*tier_, k, a).status.ok());
  auto s2 = StoreOne(*tier_, k, b);
  ASSERT_TRUE(s2.status.ok());
  EXPECT_EQ(s2.bytes, 0u);
  std::vector<uint8_t> out;
  ASSERT_TRUE(LoadOne(*tier_, k, &out, 4096).status.ok());
  EXPECT_EQ(out, a);
}

TEST_P(TierContractTest, DeleteRemovesAndIsIdempotent) {
  const auto k = Key(6);
  const auto v = Bytes(5000, 6);
  ASSERT_TRUE(StoreOne(*tier_, k, v).status.ok());
  auto d = DeleteSync(*tier_, {k, Key(7)});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(d[0].status.ok());
  EXPECT_TRUE(d[1].status.ok());
  EXPECT_EQ(ExistsSync(*tier_, {k})[0].status.code(), StatusCode::kNotFound);
}

TEST_P(TierContractTest, SaltedAndPrivateKeysAreDistinctObjects) {
  auto plain = Key(8);
  auto salted = Key(8, "org/Model-1", 0, "tenant-a");
  auto tagged = Key(8);
  tagged.layout_tag = "0123abcd";
  ASSERT_TRUE(StoreOne(*tier_, plain, Bytes(4096, 80)).status.ok());
  ASSERT_TRUE(StoreOne(*tier_, salted, Bytes(4096, 81)).status.ok());
  ASSERT_TRUE(StoreOne(*tier_, tagged, Bytes(4096, 82)).status.ok());
  std::vector<uint8_t> out;
  ASSERT_TRUE(LoadOne(*tier_, salted, &out, 4096).status.ok());
  EXPECT_EQ(out, Bytes(4096, 81));
  ASSERT_TRUE(LoadOne(*tier_, tagged, &out, 4096).status.ok());
  EXPECT_EQ(out, Bytes(4096, 82));
  ASSERT_TRUE(LoadOne(*tier_, plain, &out, 4096).status.ok());
  EXPECT_EQ(out, Bytes(4096, 80));
}

TEST_P(TierContractTest, ScanListsObjectsWithSizes) {
  std::set<std::string> want;
  for (int i = 0; i < 5; ++i) {
    auto k = Key(100 + i);
    ASSERT_TRUE(StoreOne(*tier_, k, Bytes(1000 + i, i)).status.ok());
    want.insert(RespKey(k) + "#" + std::to_string(1000 + i));
  }
  auto s = ScanSync(*tier_);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::set<std::string> got;
  for (const auto& o : *s) got.insert(RespKey(o.key) + "#" + std::to_string(o.bytes));
  for (const auto& w : want) EXPECT_TRUE(got.count(w)) << w;
}

TEST_P(TierContractTest, ConcurrentBatchesAnswerOnceInOrder) {
  constexpr int kThreads = 4, kPerThread = 24;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::vector<uint8_t>> values;
      std::vector<StoreItem> items;
      for (int i = 0; i < kPerThread; ++i) values.push_back(Bytes(3000 + 97 * i, t * 1000 + i));
      for (int i = 0; i < kPerThread; ++i) {
        items.push_back({Key(1000 + t * 100 + i), values[i].data(), values[i].size()});
      }
      auto r = StoreSync(*tier_, items);
      if (r.size() != items.size()) ++failures;
      for (auto& x : r) failures += !x.status.ok();
      std::vector<std::vector<uint8_t>> outs(kPerThread);
      std::vector<LoadItem> loads;
      for (int i = 0; i < kPerThread; ++i) {
        outs[i].resize(values[i].size());
        loads.push_back({items[i].key, outs[i].data(), outs[i].size(), false});
      }
      auto lr = LoadSync(*tier_, loads);
      if (lr.size() != loads.size()) ++failures;
      for (size_t i = 0; i < lr.size(); ++i) failures += !lr[i].status.ok() || outs[i] != values[i];
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_P(TierContractTest, EmptyBatchesAnswer) {
  EXPECT_TRUE(StoreSync(*tier_, {}).empty());
  EXPECT_TRUE(LoadSync(*tier_, {}).empty());
  EXPECT_TRUE(ExistsSync(*tier_, {}).empty());
}

TEST_P(TierContractTest, ClosedTierAnswersUnavailable) {
  tier_->Close();
  auto r = StoreSync(*tier_, {{Key(9), nullptr, 0}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.code(), StatusCode::kUnavailable);
  auto e = ExistsSync(*tier_, {Key(9)});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].status.code(), StatusCode::kUnavailable);
}

TEST_P(TierContractTest, FaultDecoratorFailsDelaysAndStalls) {
  auto fault = std::make_shared<FaultTier>(tier_);
  tier_ = fault;
  const auto k = Key(10);
  const auto v = Bytes(4096, 10);
  fault->FailOps(static_cast<uint8_t>(TierOp::kStore), StatusCode::kResourceExhausted);
  EXPECT_EQ(StoreOne(*fault, k, v).status.code(), StatusCode::kResourceExhausted);
  fault->FailOps(0);
  fault->Stall();
  auto p = std::make_shared<std::promise<std::vector<ItemResult>>>();
  auto f = p->get_future();
  fault->Store({{k, v.data(), v.size()}}, [p](std::vector<ItemResult> r) { p->set_value(std::move(r)); });
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  fault->Resume();
  auto r = Wait(f);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].status.ok());
  fault->SetDelayMs(50);
  auto t0 = std::chrono::steady_clock::now();
  std::vector<uint8_t> out;
  EXPECT_TRUE(LoadOne(*fault, k, &out, v.size()).status.ok());
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));
  EXPECT_EQ(out, v);
}

INSTANTIATE_TEST_SUITE_P(AllTiers, TierContractTest, ::testing::ValuesIn(BackendNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvd::l2
