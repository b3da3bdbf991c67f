// MemoryPool: the mapping (shared segment lifecycle, stale segment replacement, name checks,
// sparse creation of a pool larger than the machine's memory). The allocator over it is
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

}  // namespace
}  // namespace kvd::l1
