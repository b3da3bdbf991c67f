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

namespace kvd::transfer {
namespace {

// Issue 11, finding 1 (foreign segments): the owner, prefix and identity checks run on the
// opened descriptor.
TEST(ShmPolicyTest, Finding1SegmentOfAnotherUidIsRefusedUnlessAllowed) {
  Segment seg(8192);
  const uint32_t other = static_cast<uint32_t>(geteuid()) + 4242;
  ShmAccessPolicy strict;
  strict.allowed_uids = {other};  // kvd's own uid is not in the list: the segment is foreign
  auto m = ShmMapping::Open(seg.name(), 4096, strict);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("owned by uid"));
  EXPECT_THAT(m.status().message(), HasSubstr("--allowed-shm-uid"));
  ShmAccessPolicy both;
  both.allowed_uids = {other, static_cast<uint32_t>(geteuid())};
  EXPECT_TRUE(ShmMapping::Open(seg.name(), 4096, both).ok());
  EXPECT_TRUE(ShmMapping::Open(seg.name(), 4096).ok());  // default: kvd's own uid
}

TEST(ShmPolicyTest, Finding1PrefixIsEnforcedWhenSet) {
  Segment seg(4096);
  ShmAccessPolicy p;
  p.required_prefix = "vllm_kv_";
  auto m = ShmMapping::Open(seg.name(), 4096, p);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("--allowed-shm-prefix"));
  p.required_prefix = "kvd_shm_test_";
  EXPECT_TRUE(ShmMapping::Open(seg.name(), 4096, p).ok());
}

TEST(ShmPolicyTest, Finding1RefusedSegmentsAreRecognisedByInodeNotName) {
  Segment seg(4096);
  auto id = IdentifySegment(seg.name());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  ShmAccessPolicy p;
  p.refused = {*id};
  auto m = ShmMapping::Open(seg.name(), 4096, p);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("kvd's own memory"));
  // A hard link is another name for the same inode: refused all the same.
  const std::string alias = seg.name() + "_alias";
  ASSERT_EQ(link(("/dev/shm" + seg.name()).c_str(), ("/dev/shm" + alias).c_str()), 0);
  EXPECT_FALSE(ShmMapping::Open(alias, 4096, p).ok());
  shm_unlink(alias.c_str());
  // The mapping reports the identity it was checked with.
  auto ok = ShmMapping::Open(seg.name(), 4096);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->id(), *id);
}

TEST(ShmPolicyTest, Finding1SymlinksAndNonFilesAreNotFollowed) {
  Segment seg(4096);
  const std::string link_name = "/kvd_shm_test_symlink_" + std::to_string(getpid());
  ASSERT_EQ(symlink(("/dev/shm" + seg.name()).c_str(), ("/dev/shm" + link_name).c_str()), 0);
  EXPECT_FALSE(ShmMapping::Open(link_name, 4096).ok());
  unlink(("/dev/shm" + link_name).c_str());
}

}  // namespace
}  // namespace kvd::transfer
