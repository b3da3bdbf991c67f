// Reclaiming what crashed kvds left in /dev/shm (issue 27, finding 10), on a fake /dev/shm and
// a fake /proc: only kvd_l1_pool_<pid> segments of this user whose pid is not a live kvd and
// that no process maps are removed.
#include "cli/stale_segments.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kvd::cli {
namespace {

namespace fs = std::filesystem;

class StaleSegmentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvd-stale-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    fs::create_directories(shm());
    fs::create_directories(proc());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string shm() const { return root_ + "/shm"; }
  std::string proc() const { return root_ + "/proc"; }
  void Segment(const std::string& name, size_t bytes = 8192) {
    std::ofstream f(shm() + "/" + name, std::ios::binary);
    f << std::string(bytes, 'x');
  }
  void Process(const std::string& pid, const std::string& comm, const std::string& maps = "") {
    fs::create_directories(proc() + "/" + pid);
    std::ofstream(proc() + "/" + pid + "/comm") << comm << "\n";
    std::ofstream(proc() + "/" + pid + "/maps") << maps;
  }
  bool Exists(const std::string& name) const { return fs::exists(shm() + "/" + name); }

  std::string root_;
};

TEST_F(StaleSegmentsTest, Finding10OnlySegmentsOfDeadKvdsNobodyMapsAreRemoved) {
  Segment("kvd_l1_pool_1001");                 // its kvd is gone: removed
  Segment("kvd_l1_pool_1002");                 // a live kvd: kept
  Process("1002", "kvd");
  Segment("kvd_l1_pool_1003");                 // pid reused by another program: removed
  Process("1003", "bash");
  Segment("kvd_l1_pool_1004");                 // dead kvd, but a worker still maps it: kept
  Process("2000", "python3",
          "7f0000000000-7f0000100000 rw-s 00000000 00:1a 42 " + shm() + "/kvd_l1_pool_1004\n");
  Segment("kvd_l1_pool_1005");                 // mapped as "(deleted)" elsewhere: still in use
  Process("2001", "python3",
          "7f0000000000-7f0000100000 rw-s 00000000 00:1a 43 " + shm() + "/kvd_l1_pool_1005 (deleted)\n");
  Segment("kvd_l1_pool_10061");                // a similar name is not the same segment
  Process("2002", "python3",
          "7f0000000000-7f0000100000 rw-s 00000000 00:1a 44 " + shm() + "/kvd_l1_pool_1006\n");
  Segment("kvd_l1_pool_abc");                  // not kvd's default name: untouched
  Segment("lmcache_kv_1001");                  // someone else's: untouched
  ASSERT_EQ(::symlink((shm() + "/lmcache_kv_1001").c_str(), (shm() + "/kvd_l1_pool_1007").c_str()), 0);

  const Reclaimed r = ReclaimDeadKvdSegments(shm(), proc());
  EXPECT_FALSE(Exists("kvd_l1_pool_1001"));
  EXPECT_TRUE(Exists("kvd_l1_pool_1002"));
  EXPECT_FALSE(Exists("kvd_l1_pool_1003"));
  EXPECT_TRUE(Exists("kvd_l1_pool_1004"));
  EXPECT_TRUE(Exists("kvd_l1_pool_1005"));
  EXPECT_FALSE(Exists("kvd_l1_pool_10061"));
  EXPECT_TRUE(Exists("kvd_l1_pool_abc"));
  EXPECT_TRUE(Exists("lmcache_kv_1001"));
  EXPECT_TRUE(fs::is_symlink(shm() + "/kvd_l1_pool_1007")) << "a link is never followed or removed";
  EXPECT_EQ(r.segments, 3u);
  EXPECT_GT(r.bytes, 0u);
}

TEST_F(StaleSegmentsTest, NothingToDoIsQuiet) {
  EXPECT_EQ(ReclaimDeadKvdSegments(shm(), proc()).segments, 0u);
  EXPECT_EQ(ReclaimDeadKvdSegments(root_ + "/absent", proc()).segments, 0u);
}

}  // namespace
}  // namespace kvd::cli
