// PoolPopulator: pages populated ahead of the allocator (resident afterwards: no page fault
// when written, RSS of the mapping), the window in front of the frontier, the committed
// region of a lazy pool, pausing when the host has no room, and a clean stop in the middle.
// host_memory's parsers are tested here too.
#include "l1/pool_populator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "l1/host_memory.h"
#include "page_residency.h"

namespace kvd::l1 {
namespace {

using testing::RssOfMapping;
using std::chrono::milliseconds;

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string UniqueShmName(const char* tag) {
  static std::atomic<int> counter{0};
  return std::string("kvd_test_pop_") + tag + "_" + std::to_string(getpid()) + "_" +
         std::to_string(counter++);
}

// A host with room to spare, whatever the real one has.
std::optional<MemoryRoom> Plenty() { return MemoryRoom{64 * kGiB, 64 * kGiB, "test host"}; }

struct Fixture {
  std::unique_ptr<MemoryPool> pool;
  std::unique_ptr<SizeClassAllocator> alloc;
};

Fixture Make(uint64_t capacity, std::string shm_name = "",
             uint64_t initial = SizeClassAllocator::kAll, uint64_t grow = 16 * kMiB) {
  MemoryPoolOptions po;
  po.capacity_bytes = capacity;
  po.shm_name = std::move(shm_name);
  auto pool = MemoryPool::Create(po);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  auto alloc = SizeClassAllocator::Create(capacity, 4096, initial, grow);
  EXPECT_TRUE(alloc.ok());
  return {std::move(pool).value(), std::move(alloc).value()};
}

PopulatorOptions Options(PopulateMode mode, uint64_t window = 8 * kMiB) {
  PopulatorOptions o;
  o.mode = mode;
  o.window_bytes = window;
  o.step_bytes = 2 * kMiB;
  o.room = Plenty;
  o.idle_poll = milliseconds(2);
  o.retry_after = milliseconds(10);
  return o;
}

// Waits until pred() or 30 s; returns pred().
template <class Pred>
bool WaitUntil(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!pred() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(2));
  }
  return pred();
}

// Stays at `value` for a while (the populator had time to go further and did not).
bool StaysAt(const PoolPopulator& p, uint64_t value) {
  for (int i = 0; i < 50; ++i) {
    if (p.populated_bytes() != value) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

void CheckWholePool(std::string shm_name) {
  Fixture f = Make(64 * kMiB, shm_name);
  PoolPopulator p(f.pool.get(), f.alloc.get(), Options(PopulateMode::kAll));
  EXPECT_EQ(p.populated_bytes(), 0u);
  p.Start();
  ASSERT_TRUE(WaitUntil([&] { return p.finished(); }));
  EXPECT_EQ(p.populated_bytes(), 64 * kMiB);
  EXPECT_FALSE(p.paused());
  if (!shm_name.empty()) {
    EXPECT_EQ(f.pool->backed_bytes(), 64 * kMiB);  // backed before populated
    EXPECT_GE(RssOfMapping(f.pool->base()).rss, 64 * kMiB);
  }
  // Every page is mapped: writing the pool takes (almost) no page fault.
  testing::ExpectPopulated(f.pool->base(), 64 * kMiB);
}

TEST(PoolPopulatorTest, PopulatesAWholeAnonymousPoolInTheBackground) { CheckWholePool(""); }
TEST(PoolPopulatorTest, PopulatesAWholeSharedPoolInTheBackground) {
  CheckWholePool(UniqueShmName("whole"));
}

TEST(PoolPopulatorTest, OffDoesNothing) {
  Fixture f = Make(16 * kMiB);
  PoolPopulator p(f.pool.get(), f.alloc.get(), Options(PopulateMode::kOff));
  p.Start();
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(p.populated_bytes(), 0u);
  testing::ExpectNotPopulated(f.pool->base(), 16 * kMiB);
}

// Ahead: a window past the allocator's frontier and no further; it follows the frontier.
TEST(PoolPopulatorTest, AheadStaysOneWindowPastTheFrontier) {
  Fixture f = Make(64 * kMiB);
  PoolPopulator p(f.pool.get(), f.alloc.get(), Options(PopulateMode::kAhead, 8 * kMiB));
  p.Start();
  ASSERT_TRUE(WaitUntil([&] { return p.populated_bytes() == 8 * kMiB; }));
  EXPECT_TRUE(StaysAt(p, 8 * kMiB));
  // The allocator hands out 12 MiB: the populator follows to 12 + 8 MiB.
  auto cls = f.alloc->ClassFor(4 * kMiB);
  ASSERT_TRUE(cls.ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.alloc->Allocate(*cls, i).has_value());
  ASSERT_TRUE(WaitUntil([&] { return p.populated_bytes() == 20 * kMiB; }));
  EXPECT_TRUE(StaysAt(p, 20 * kMiB));
  EXPECT_FALSE(p.finished());
  p.Stop();
  EXPECT_TRUE(p.finished());
  testing::ExpectPopulated(f.pool->At(12 * kMiB), 8 * kMiB);     // the window
  testing::ExpectNotPopulated(f.pool->At(20 * kMiB), 8 * kMiB);  // past it
}

// Stores that outrun the populator: it jumps to the frontier instead of populating what the
// writers already have.
TEST(PoolPopulatorTest, JumpsToAFrontierThatPassedIt) {
  Fixture f = Make(64 * kMiB);
  auto cls = f.alloc->ClassFor(40 * kMiB);
  ASSERT_TRUE(cls.ok());
  ASSERT_TRUE(f.alloc->Allocate(*cls, 1).has_value());  // before the populator starts
  PoolPopulator p(f.pool.get(), f.alloc.get(), Options(PopulateMode::kAhead, 8 * kMiB));
  p.Start();
  ASSERT_TRUE(WaitUntil([&] { return p.populated_bytes() == 48 * kMiB; }));
  p.Stop();
  testing::ExpectNotPopulated(f.pool->At(0), 8 * kMiB);  // left to its writer
  testing::ExpectPopulated(f.pool->At(40 * kMiB), 8 * kMiB);
}

// A lazy pool: its committed region, then each step it grows by, never the rest.
TEST(PoolPopulatorTest, LazyPoolIsPopulatedAsFarAsItHasGrown) {
  Fixture f = Make(64 * kMiB, "", 16 * kMiB, 16 * kMiB);
  PoolPopulator p(f.pool.get(), f.alloc.get(), Options(PopulateMode::kAll, 4 * kMiB));
  p.Start();
  ASSERT_TRUE(WaitUntil([&] { return p.populated_bytes() == 16 * kMiB; }));
  EXPECT_TRUE(StaysAt(p, 16 * kMiB));
  auto cls = f.alloc->ClassFor(4 * kMiB);
  ASSERT_TRUE(cls.ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(f.alloc->Allocate(*cls, i).has_value());  // grows
  EXPECT_EQ(f.alloc->committed_bytes(), 32 * kMiB);
  ASSERT_TRUE(WaitUntil([&] { return p.populated_bytes() == 32 * kMiB; }));
  EXPECT_TRUE(StaysAt(p, 32 * kMiB));
  EXPECT_FALSE(p.finished());
}

// No room on the host: population waits (and says so), then resumes when there is.
TEST(PoolPopulatorTest, PausesWhileTheHostHasNoRoomToSpare) {
  Fixture f = Make(32 * kMiB);
  std::atomic<uint64_t> available{512 * kMiB};
  PopulatorOptions o = Options(PopulateMode::kAll);
  o.reserve_bytes = 1 * kGiB;
  o.room = [&]() -> std::optional<MemoryRoom> {
    return MemoryRoom{available.load(), 16 * kGiB, "test host"};
  };
  PoolPopulator p(f.pool.get(), f.alloc.get(), o);
  p.Start();
  ASSERT_TRUE(WaitUntil([&] { return p.paused(); }));
  EXPECT_TRUE(StaysAt(p, 0));
  available = 8 * kGiB;
  ASSERT_TRUE(WaitUntil([&] { return p.finished(); }));
  EXPECT_EQ(p.populated_bytes(), 32 * kMiB);
  EXPECT_FALSE(p.paused());
}

// The default reserve: 1 GiB, or 1/16 of the memory when that is more.
TEST(PoolPopulatorTest, DefaultReserveIsASixteenthOfTheMemoryAndAtLeastOneGiB) {
  Fixture f = Make(32 * kMiB);
  PopulatorOptions o = Options(PopulateMode::kAll);
  o.room = []() -> std::optional<MemoryRoom> {
    return MemoryRoom{4 * kGiB - 4 * kMiB, 64 * kGiB, "test host"};  // < 64/16 GiB left
  };
  PoolPopulator p(f.pool.get(), f.alloc.get(), o);
  p.Start();
  ASSERT_TRUE(WaitUntil([&] { return p.paused(); }));
  p.Stop();
  EXPECT_EQ(p.populated_bytes(), 0u);
  o.room = []() -> std::optional<MemoryRoom> {
    return MemoryRoom{4 * kGiB + 64 * kMiB, 64 * kGiB, "test host"};
  };
  PoolPopulator q(f.pool.get(), f.alloc.get(), o);
  q.Start();
  ASSERT_TRUE(WaitUntil([&] { return q.finished(); }));
  EXPECT_EQ(q.populated_bytes(), 32 * kMiB);
}

// Stop in the middle of a large pool returns within a step, and leaves nothing running.
TEST(PoolPopulatorTest, StopInTheMiddleIsClean) {
  for (const bool shared : {false, true}) {
    Fixture f = Make(1 * kGiB, shared ? UniqueShmName("stop") : "");
    auto p = std::make_unique<PoolPopulator>(f.pool.get(), f.alloc.get(),
                                             Options(PopulateMode::kAll));
    p->Start();
    ASSERT_TRUE(WaitUntil([&] { return p->populated_bytes() > 0; }));
    const auto t0 = std::chrono::steady_clock::now();
    p->Stop();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
    EXPECT_TRUE(p->finished());
    const uint64_t at_stop = p->populated_bytes();
    EXPECT_LE(at_stop, 1 * kGiB);
    std::this_thread::sleep_for(milliseconds(20));
    EXPECT_EQ(p->populated_bytes(), at_stop);
    p->Stop();   // again: nothing to do
    p.reset();   // the destructor stops too
  }
}

// Population while the allocator hands out ranges and their owners write them: every
// writer's bytes survive (population never writes a byte), and the pool ends populated.
TEST(PoolPopulatorTest, WritersKeepTheirBytesWhilePopulationRuns) {
  Fixture f = Make(128 * kMiB, UniqueShmName("writers"));
  PopulatorOptions o = Options(PopulateMode::kAll, 4 * kMiB);
  o.step_bytes = 1 * kMiB;
  PoolPopulator p(f.pool.get(), f.alloc.get(), o);
  p.Start();
  auto cls = f.alloc->ClassFor(256 * 1024);
  ASSERT_TRUE(cls.ok());
  std::vector<std::thread> writers;
  std::atomic<int> bad{0};
  for (int t = 0; t < 2; ++t) {
    writers.emplace_back([&, t] {
      std::vector<uint32_t> mine;
      for (int i = 0; i < 100; ++i) {
        auto u = f.alloc->Allocate(*cls, static_cast<uint32_t>(t * 1000 + i));
        if (!u) break;
        ASSERT_TRUE(f.pool->EnsureBacked(uint64_t{*u} * 4096, 256 * 1024).ok());
        std::memset(f.pool->At(uint64_t{*u} * 4096), 0x40 + t, 256 * 1024);
        mine.push_back(*u);
      }
      for (uint32_t u : mine) {
        const uint8_t* b = f.pool->At(uint64_t{u} * 4096);
        for (uint64_t i = 0; i < 256 * 1024; i += 512) {
          if (b[i] != 0x40 + t) ++bad;
        }
      }
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(bad.load(), 0);
  ASSERT_TRUE(WaitUntil([&] { return p.finished(); }));
  EXPECT_EQ(p.populated_bytes(), 128 * kMiB);
}

TEST(PoolPopulatorTest, ModeNames) {
  EXPECT_EQ(ParsePopulateMode("off"), PopulateMode::kOff);
  EXPECT_EQ(ParsePopulateMode("ahead"), PopulateMode::kAhead);
  EXPECT_EQ(ParsePopulateMode("all"), PopulateMode::kAll);
  EXPECT_FALSE(ParsePopulateMode("All").has_value());
  EXPECT_FALSE(ParsePopulateMode("").has_value());
  for (auto m : {PopulateMode::kOff, PopulateMode::kAhead, PopulateMode::kAll}) {
    EXPECT_EQ(ParsePopulateMode(PopulateModeName(m)), m);
  }
}

// ---- host_memory ----------------------------------------------------------------------------

TEST(HostMemoryTest, ParsesSysfsChoices) {
  EXPECT_EQ(ParseSysfsChoice("always [madvise] never\n"), "madvise");
  EXPECT_EQ(ParseSysfsChoice("[always] madvise never"), "always");
  EXPECT_EQ(ParseSysfsChoice("always madvise [never]"), "never");
  EXPECT_EQ(ParseSysfsChoice("always madvise never"), "");
  EXPECT_EQ(ParseSysfsChoice(""), "");
}

TEST(HostMemoryTest, ParsesMemInfo) {
  auto r = ParseMemInfo("MemTotal:       24684084 kB\nMemFree:        20000000 kB\n"
                        "MemAvailable:   23393128 kB\nBuffers: 1 kB\n");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->limit, 24684084ull * 1024);
  EXPECT_EQ(r->available, 23393128ull * 1024);
  EXPECT_FALSE(ParseMemInfo("MemTotal: 5 kB\n").has_value());
  EXPECT_FALSE(ParseMemInfo("MemTotal: x kB\nMemAvailable: 3 kB\n").has_value());
  EXPECT_FALSE(ParseMemInfo("").has_value());
}

TEST(HostMemoryTest, FindsTheMemoryCgroupInV1AndV2) {
  bool v1 = false;
  auto p = ParseMemoryCgroupPath("5:devices:/\n4:memory:/process_api/abc\n0::/\n", &v1);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, "/process_api/abc");
  EXPECT_TRUE(v1);
  p = ParseMemoryCgroupPath("3:cpu,memory,pids:/a/b\n", &v1);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, "/a/b");
  EXPECT_TRUE(v1);
  p = ParseMemoryCgroupPath("0::/system.slice/kvd.service\n", &v1);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(*p, "/system.slice/kvd.service");
  EXPECT_FALSE(v1);
  EXPECT_FALSE(ParseMemoryCgroupPath("4:cpu:/x\n", &v1).has_value());
  EXPECT_FALSE(ParseMemoryCgroupPath("garbage", &v1).has_value());
}

TEST(HostMemoryTest, ReadsThisHost) {
  auto room = ReadMemoryRoom();
  ASSERT_TRUE(room.has_value());
  EXPECT_GT(room->limit, 0u);
  EXPECT_LE(room->available, room->limit);
  EXPECT_FALSE(room->where.empty());
}

}  // namespace
}  // namespace kvd::l1
