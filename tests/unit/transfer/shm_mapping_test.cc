// ShmMapping: only plain /dev/shm names are opened, the segment must be as large as the
// client says, and the mapping is shared with the client's.
#include "transfer/shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kvd::transfer {
namespace {

using ::testing::HasSubstr;

// A segment the test creates the way a vLLM worker would; unlinked on destruction.
class Segment {
 public:
  explicit Segment(uint64_t size) {
    static std::atomic<int> counter{0};
    name_ = "/kvd_shm_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    data_ = static_cast<uint8_t*>(
        mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    size_ = size;
    close(fd);
  }
  ~Segment() {
    munmap(data_, size_);
    shm_unlink(name_.c_str());
  }
  const std::string& name() const { return name_; }
  uint8_t* data() const { return data_; }

 private:
  std::string name_;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

TEST(ShmNameTest, AcceptsPlainNames) {
  EXPECT_EQ(ValidateShmName("/psm_abc").value(), "/psm_abc");
  EXPECT_EQ(ValidateShmName("psm_abc").value(), "/psm_abc");
}

TEST(ShmNameTest, RefusesPathsAndEmptyNames) {
  for (const std::string& bad : std::initializer_list<std::string>{"", "/", "/a/b", "../etc/passwd", "/..", "a..b",
                                std::string(300, 'x'), std::string("a\0b", 3)}) {
    EXPECT_FALSE(ValidateShmName(bad).ok()) << "'" << bad << "'";
  }
}

TEST(ShmMappingTest, MapsTheClientsMemory) {
  Segment seg(8192);
  auto m = ShmMapping::Open(seg.name(), 8192);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->size(), 8192u);
  seg.data()[100] = 42;
  EXPECT_EQ(m->data()[100], 42);
  m->data()[8191] = 7;
  EXPECT_EQ(seg.data()[8191], 7);
  // A smaller view of a larger segment is fine.
  EXPECT_TRUE(ShmMapping::Open(seg.name(), 4096).ok());
}

TEST(ShmMappingTest, RefusesASegmentSmallerThanDescribed) {
  Segment seg(4096);
  auto m = ShmMapping::Open(seg.name(), 4097);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("is 4096 bytes, the client described 4097"));
}

TEST(ShmMappingTest, MissingSegmentAndZeroSize) {
  auto m = ShmMapping::Open("/kvd_shm_test_does_not_exist_" + std::to_string(getpid()), 10);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kNotFound);
  Segment seg(4096);
  EXPECT_FALSE(ShmMapping::Open(seg.name(), 0).ok());
}

TEST(ShmMappingTest, MoveKeepsOneOwner) {
  Segment seg(4096);
  auto m = ShmMapping::Open(seg.name(), 4096);
  ASSERT_TRUE(m.ok());
  ShmMapping a = std::move(m).value();
  uint8_t* p = a.data();
  ShmMapping b = std::move(a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  b = ShmMapping();
  EXPECT_EQ(b.data(), nullptr);
}

}  // namespace
}  // namespace kvd::transfer
