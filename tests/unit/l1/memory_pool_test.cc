// MemoryPool: the mapping (shared segment lifecycle, stale segment replacement, name checks,
// sparse creation of a pool larger than the machine's memory), population ahead of use, and
// huge pages (--l1-use-hugepages). The allocator over it is
// tested in size_class_allocator_test.cc.
#include "l1/memory_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "page_residency.h"

namespace kvd::l1 {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;

std::unique_ptr<MemoryPool> MakePool(uint64_t capacity, uint64_t align = 4096,
                                     std::string shm_name = "") {
  MemoryPoolOptions options;
  options.capacity_bytes = capacity;
  options.align = align;
  options.shm_name = std::move(shm_name);
  auto pool = MemoryPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(pool).value() : nullptr;
}

// Unique per process and call, so parallel ctest runs do not collide.
std::string UniqueShmName(const char* tag) {
  static std::atomic<int> counter{0};
  return std::string("kvd_test_") + tag + "_" + std::to_string(getpid()) + "_" +
         std::to_string(counter++);
}

bool ShmExists(const std::string& name, off_t* size = nullptr) {
  struct stat st {};
  if (stat(("/dev/shm/" + name).c_str(), &st) != 0) return false;
  if (size != nullptr) *size = st.st_size;
  return true;
}

// Resident set size of this process in bytes, from /proc/self/status.
uint64_t RssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * kKiB;
  }
  return 0;
}

TEST(MemoryPoolTest, MemoryIsWritableAndZeroed) {
  auto pool = MakePool(16 * 4096);
  ASSERT_NE(pool, nullptr);
  uint8_t* p = pool->At(3 * 4096);
  EXPECT_EQ(p, pool->base() + 3 * 4096);
  for (uint64_t i = 0; i < 3 * 4096; ++i) ASSERT_EQ(p[i], 0);
  std::memset(p, 0xab, 3 * 4096);
  EXPECT_EQ(p[3 * 4096 - 1], 0xab);
}

TEST(MemoryPoolTest, BaseIsAlignedToTheAlignmentEvenAboveAPage) {
  for (const uint64_t align : {uint64_t{64}, uint64_t{4096}, uint64_t{64} * kKiB, 2 * kMiB,
                               16 * kMiB}) {
    for (const bool shared : {false, true}) {
      auto pool = MakePool(4 * align + 5, align, shared ? UniqueShmName("align") : "");
      ASSERT_NE(pool, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->base()) % align, 0u) << align << shared;
      EXPECT_EQ(pool->capacity(), 4 * align);
      // Every byte of the region is mapped and writable.
      pool->base()[0] = 1;
      pool->base()[pool->capacity() - 1] = 2;
      EXPECT_EQ(pool->base()[pool->capacity() - 1], 2);
    }
  }
}

TEST(MemoryPoolTest, RejectsBadOptions) {
  MemoryPoolOptions options;
  options.capacity_bytes = 0;
  EXPECT_EQ(MemoryPool::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.capacity_bytes = 4095;  // smaller than one granule
  EXPECT_EQ(MemoryPool::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.capacity_bytes = 1 * kMiB;
  options.align = 3000;
  EXPECT_EQ(MemoryPool::Create(options).status().code(), StatusCode::kInvalidArgument);
  options.align = 0;
  EXPECT_EQ(MemoryPool::Create(options).status().code(), StatusCode::kInvalidArgument);
}

TEST(MemoryPoolTest, SharedSegmentIsVisibleAndRemovedOnDestruction) {
  const std::string name = UniqueShmName("vis");
  {
    auto pool = MakePool(8 * 4096, 4096, name);
    ASSERT_NE(pool, nullptr);
    EXPECT_TRUE(pool->is_shared());
    EXPECT_EQ(pool->shm_name(), "/" + name);
    off_t size = 0;
    ASSERT_TRUE(ShmExists(name, &size));
    EXPECT_EQ(static_cast<uint64_t>(size), 8 * 4096u);

    // Another mapping of the segment (as a worker process would do) sees our bytes and we
    // see its bytes.
    int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    void* other = mmap(nullptr, 8 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    ASSERT_NE(other, MAP_FAILED);
    const std::optional<uint64_t> off = 4096;
    std::memcpy(pool->At(*off), "hello", 6);
    EXPECT_STREQ(static_cast<char*>(other) + *off, "hello");
    static_cast<char*>(other)[*off + 4096 - 1] = 42;
    EXPECT_EQ(pool->At(*off)[4096 - 1], 42);
    munmap(other, 8 * 4096);
  }
  EXPECT_FALSE(ShmExists(name));
}

TEST(MemoryPoolTest, LeadingSlashNameIsAccepted) {
  const std::string name = UniqueShmName("slash");
  auto pool = MakePool(4096, 4096, "/" + name);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->shm_name(), "/" + name);
  EXPECT_TRUE(ShmExists(name));
  pool.reset();
  EXPECT_FALSE(ShmExists(name));
}

TEST(MemoryPoolTest, StaleSegmentIsReplaced) {
  const std::string name = UniqueShmName("stale");
  // A leftover from a "crashed run": different size and content.
  int fd = shm_open(("/" + name).c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(pwrite(fd, "stale", 5, 0), 5);
  struct stat old_st {};
  ASSERT_EQ(fstat(fd, &old_st), 0);
  close(fd);

  auto pool = MakePool(4 * 4096, 4096, name);
  ASSERT_NE(pool, nullptr);
  off_t size = 0;
  ASSERT_TRUE(ShmExists(name, &size));
  EXPECT_EQ(static_cast<uint64_t>(size), 4 * 4096u);
  EXPECT_EQ(pool->base()[0], 0);  // fresh memory, not the stale bytes
  struct stat new_st {};
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &new_st), 0);
  EXPECT_NE(new_st.st_ino, old_st.st_ino);
  pool.reset();
  EXPECT_FALSE(ShmExists(name));
}

TEST(MemoryPoolTest, BadNamesAreRejected) {
  const std::string too_long(MemoryPool::kMaxShmNameLength + 1, 'x');
  for (const std::string& bad :
       {std::string(""), std::string("/"), std::string("a/b"), std::string("/a/b"),
        std::string("//a"), std::string(".."), std::string("/.."), std::string("a..b"),
        std::string("."), too_long, std::string("a\0b", 3)}) {
    auto normalized = MemoryPool::NormalizeShmName(bad);
    EXPECT_FALSE(normalized.ok()) << "accepted '" << bad << "'";
    EXPECT_EQ(normalized.status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(normalized.status().message().empty());

    MemoryPoolOptions options;
    options.capacity_bytes = 4096;
    options.shm_name = bad;
    if (bad.empty()) continue;  // empty means anonymous memory for Create
    EXPECT_EQ(MemoryPool::Create(options).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  const std::string longest(MemoryPool::kMaxShmNameLength, 'x');
  EXPECT_EQ(MemoryPool::NormalizeShmName(longest).value(), "/" + longest);
  EXPECT_EQ(MemoryPool::NormalizeShmName("abc").value(), "/abc");
  EXPECT_EQ(MemoryPool::NormalizeShmName("/abc").value(), "/abc");
  EXPECT_EQ(MemoryPool::NormalizeShmName("a.b-c_d").value(), "/a.b-c_d");
}

// 64 GiB is more than this machine's memory: creation must be lazy and fast.
void CheckHugeSparsePool(const std::string& shm_name) {
  const uint64_t rss_before = RssBytes();
  const auto start = std::chrono::steady_clock::now();
  auto pool = MakePool(64 * kGiB, 4096, shm_name);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_NE(pool, nullptr);
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  EXPECT_EQ(pool->capacity(), 64 * kGiB);

  // Touch a page near the end and one at the start; only those become resident.
  pool->At(0)[0] = 1;
  pool->At(64 * kGiB - 4096)[4095] = 2;
  EXPECT_EQ(pool->At(64 * kGiB - 4096)[4095], 2);
  EXPECT_LT(RssBytes(), rss_before + 64 * kMiB);
}

TEST(MemoryPoolTest, HugeAnonymousPoolIsSparse) { CheckHugeSparsePool(""); }

TEST(MemoryPoolTest, HugeSharedPoolIsSparse) {
  const std::string name = UniqueShmName("huge");
  CheckHugeSparsePool(name);
  EXPECT_FALSE(ShmExists(name));
}

// ---- Populate ---------------------------------------------------------------------------

using testing::RssOfMapping;

// Populate maps every page of the range into this process, writable: writing it afterwards
// takes no page fault, while an untouched range of the same pool takes one per page. The
// bytes already there are kept.
void CheckPopulate(const std::string& shm_name, bool by_touch) {
  MemoryPoolOptions options;
  options.capacity_bytes = 32 * kMiB;
  options.shm_name = shm_name;
  options.populate_by_touch = by_touch;
  auto created = MemoryPool::Create(options);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  MemoryPool& pool = **created;
  std::memcpy(pool.At(5 * 4096 + 7), "kept", 5);  // written before population
  // (An anonymous mapping may share its smaps entry with adjacent anonymous memory: exact
  // RSS bounds only for the segment.)
  const bool exact = !shm_name.empty();
  if (exact) {
    EXPECT_LT(RssOfMapping(pool.base()).rss, 1 * kMiB);
  }

  ASSERT_TRUE(pool.Populate(0, 16 * kMiB).ok());
  EXPECT_STREQ(reinterpret_cast<const char*>(pool.At(5 * 4096 + 7)), "kept");
  const auto rss = RssOfMapping(pool.base());
  ASSERT_TRUE(rss.found);
  EXPECT_GE(rss.rss, 16 * kMiB);
  if (exact) {
    EXPECT_LT(rss.rss, 17 * kMiB);  // only the range asked for
  }
  EXPECT_EQ(pool.backed_bytes(), shm_name.empty() ? 0 : 16 * kMiB);
  testing::ExpectPopulated(pool.base(), 16 * kMiB);
  testing::ExpectNotPopulated(pool.At(16 * kMiB), 16 * kMiB);

  EXPECT_EQ(pool.Populate(32 * kMiB, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Populate(31 * kMiB, 2 * kMiB).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool.Populate(0, 0).ok());
}

TEST(MemoryPoolTest, PopulateMapsAnAnonymousPoolAheadOfUse) { CheckPopulate("", false); }
TEST(MemoryPoolTest, PopulateMapsASharedPoolAheadOfUse) {
  CheckPopulate(UniqueShmName("populate"), false);
}
// The path of kernels before 5.14 (no MADV_POPULATE_WRITE): one atomic no-op write per page.
TEST(MemoryPoolTest, PopulateByTouchMapsAnAnonymousPoolAheadOfUse) { CheckPopulate("", true); }
TEST(MemoryPoolTest, PopulateByTouchMapsASharedPoolAheadOfUse) {
  CheckPopulate(UniqueShmName("touch"), true);
}

// Another mapping of the shared segment (an engine-driven worker) sees what kvd wrote before
// and after population: populating changes no byte of the segment.
TEST(MemoryPoolTest, PopulatingASharedPoolKeepsWhatOthersWrote) {
  const std::string name = UniqueShmName("others");
  auto pool = MakePool(4 * kMiB, 4096, name);
  ASSERT_NE(pool, nullptr);
  int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* other = mmap(nullptr, 4 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(other, MAP_FAILED);
  ASSERT_TRUE(pool->EnsureBacked(0, 4 * kMiB).ok());
  for (uint64_t off = 0; off < 4 * kMiB; off += 4096) static_cast<uint8_t*>(other)[off] = 0x5a;
  ASSERT_TRUE(pool->Populate(0, 4 * kMiB).ok());
  for (uint64_t off = 0; off < 4 * kMiB; off += 4096) ASSERT_EQ(pool->At(off)[0], 0x5a) << off;
  munmap(other, 4 * kMiB);
}

// ---- Huge pages ---------------------------------------------------------------------------

HugePageInfo Host(int64_t free_2m, const char* thp) {
  HugePageInfo h;
  h.total_2m_pages = free_2m;
  h.free_2m_pages = free_2m;
  h.thp_enabled = thp;
  return h;
}

TEST(MemoryPoolTest, HugePagesComeFromTheReservedPoolThenTransparentOnesElseRefused) {
  std::string note;
  // Enough reserved pages: the reserved pool, as lmcache does, and nothing to say.
  EXPECT_EQ(MemoryPool::ChooseHugePages(4 * kGiB, Host(2048, "never"), &note).value(),
            PageKind::kHugeTlb);
  EXPECT_TRUE(note.empty());
  EXPECT_EQ(MemoryPool::ChooseHugePages(4 * kGiB + 1, Host(2049, "never"), &note).value(),
            PageKind::kHugeTlb);
  // Too few: transparent huge pages, with one line saying how many were missing.
  for (const char* thp : {"madvise", "always"}) {
    note.clear();
    EXPECT_EQ(MemoryPool::ChooseHugePages(4 * kGiB, Host(2047, thp), &note).value(),
              PageKind::kTransparentHuge);
    EXPECT_NE(note.find("2047 free 2 MiB huge pages, 2048 needed"), std::string::npos) << note;
    EXPECT_NE(note.find("sysctl vm.nr_hugepages=2048"), std::string::npos) << note;
    EXPECT_NE(note.find("transparent huge pages"), std::string::npos) << note;
  }
  // Neither: refused (lmcache refuses too), saying what to change.
  for (const char* thp : {"never", ""}) {
    auto r = MemoryPool::ChooseHugePages(4 * kGiB, Host(0, thp), &note);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("sysctl vm.nr_hugepages=2048"), std::string::npos);
    EXPECT_NE(r.status().message().find("transparent huge pages are off"), std::string::npos);
  }
  HugePageInfo unknown;  // sysfs unreadable
  unknown.thp_enabled = "madvise";
  EXPECT_EQ(MemoryPool::ChooseHugePages(kGiB, unknown, &note).value(), PageKind::kTransparentHuge);
}

TEST(MemoryPoolTest, HugePagesAreRefusedForASharedPool) {
  MemoryPoolOptions options;
  options.capacity_bytes = 8 * kMiB;
  options.shm_name = UniqueShmName("hugeshm");
  options.use_hugepages = true;
  options.huge_page_info = Host(0, "madvise");
  EXPECT_EQ(MemoryPool::Create(options).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ShmExists(options.shm_name));
}

// Transparent huge pages: the pool is 2 MiB aligned and populated with 2 MiB pages (where
// the kernel offers them at all).
TEST(MemoryPoolTest, TransparentHugePagesBackAnAnonymousPool) {
  const HugePageInfo real = ReadHugePageInfo();
  if (!real.thp_usable()) GTEST_SKIP() << "transparent huge pages are off on this host";
  MemoryPoolOptions options;
  options.capacity_bytes = 16 * kMiB + 4096;
  options.use_hugepages = true;
  options.huge_page_info = Host(0, real.thp_enabled.c_str());
  auto pool = MemoryPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ((*pool)->page_kind(), PageKind::kTransparentHuge);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*pool)->base()) % (2 * kMiB), 0u);
  EXPECT_EQ((*pool)->capacity(), 16 * kMiB + 4096);
  ASSERT_TRUE((*pool)->Populate(0, 16 * kMiB).ok());
  const auto rss = RssOfMapping((*pool)->base());
  EXPECT_GE(rss.rss, 16 * kMiB);
  EXPECT_GT(rss.anon_huge, 0u) << "no transparent huge page in the populated pool";
  testing::ExpectPopulated((*pool)->base(), 16 * kMiB);
  (*pool)->At(16 * kMiB)[4095] = 1;  // the last page of the capacity is mapped
}

// The reserved pool, where the host has one; where it has none, a pool that expected pages
// which are not there fails cleanly (no SIGBUS later) and says what to reserve.
TEST(MemoryPoolTest, ReservedHugePagesBackAnAnonymousPoolOrFailCleanly) {
  const HugePageInfo real = ReadHugePageInfo();
  MemoryPoolOptions options;
  options.capacity_bytes = 8 * kMiB;
  options.use_hugepages = true;
  if (real.free_2m_pages >= 4) {
    auto pool = MemoryPool::Create(options);
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    EXPECT_EQ((*pool)->page_kind(), PageKind::kHugeTlb);
    ASSERT_TRUE((*pool)->Populate(0, 8 * kMiB).ok());
    EXPECT_GE(RssOfMapping((*pool)->base()).private_hugetlb, 8 * kMiB);
    return;
  }
  options.huge_page_info = Host(1 << 20, "never");  // claims pages the host does not have
  auto pool = MemoryPool::Create(options);
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(pool.status().message().find("vm.nr_hugepages=4"), std::string::npos)
      << pool.status().message();
}

}  // namespace
}  // namespace kvd::l1
