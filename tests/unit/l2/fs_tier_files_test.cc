// The fs tier and files it did not write (issue 27, finding 4): a symbolic link, a FIFO or a
// directory in an object's place is never read (and never blocks the tier); an object
// overwritten in place with bytes of the same size is not served (the checksum kvd keeps
// beside it); an object another server wrote, without a checksum, is read as before.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "l2/fs_tier.h"
#include "tier_backends.h"
#include "tier_test_util.h"

namespace kvd::l2 {
namespace {

using namespace kvd::l2::testing;

class FsTierFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FsTierOptions o;
    o.base_path = dir_.path() + "/kv";
    o.num_workers = 2;
    auto t = FsTier::Create(o);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::move(t).value();
  }
  void TearDown() override { tier_->Close(); }

  void WriteFile(const std::string& path, const std::vector<uint8_t>& v) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
  }

  TempDir dir_;
  std::unique_ptr<FsTier> tier_;
};

TEST_F(FsTierFilesTest, Finding4SameSizeOverwriteIsNotServed) {
  const auto k = Key(1);
  const auto v = Bytes(64 * 1024, 1);
  ASSERT_TRUE(StoreOne(*tier_, k, v).status.ok());
  EXPECT_TRUE(std::filesystem::exists(tier_->PathOf(k) + ".kvdsum"));
  std::vector<uint8_t> out;
  ASSERT_TRUE(LoadOne(*tier_, k, &out, v.size()).status.ok());
  EXPECT_EQ(out, v);
  WriteFile(tier_->PathOf(k), Bytes(v.size(), 2));  // same size, other bytes
  auto l = LoadOne(*tier_, k, &out, v.size());
  EXPECT_EQ(l.status.code(), StatusCode::kInternal) << l.status.ToString();
  EXPECT_NE(l.status.message().find("checksum"), std::string::npos) << l.status.ToString();
}

TEST_F(FsTierFilesTest, Finding4ObjectsWithoutAChecksumAreReadAsBefore) {
  const auto k = Key(2);
  const auto v = Bytes(8192, 3);
  WriteFile(tier_->PathOf(k), v);  // as lmcache writes it: the bytes alone
  std::vector<uint8_t> out;
  auto l = LoadOne(*tier_, k, &out, v.size());
  ASSERT_TRUE(l.status.ok()) << l.status.ToString();
  EXPECT_EQ(out, v);
}

TEST_F(FsTierFilesTest, Finding4MalformedChecksumIsNotServed) {
  const auto k = Key(3);
  const auto v = Bytes(4096, 4);
  ASSERT_TRUE(StoreOne(*tier_, k, v).status.ok());
  std::ofstream(tier_->PathOf(k) + ".kvdsum", std::ios::trunc) << "garbage\n";
  std::vector<uint8_t> out;
  EXPECT_EQ(LoadOne(*tier_, k, &out, v.size()).status.code(), StatusCode::kInternal);
}

TEST_F(FsTierFilesTest, Finding4SymlinkToAFileOutsideIsNeverRead) {
  const auto k = Key(4);
  const auto secret = Bytes(4096, 5);
  const std::string outside = dir_.path() + "/outside.bin";
  WriteFile(outside, secret);
  ASSERT_EQ(::symlink(outside.c_str(), tier_->PathOf(k).c_str()), 0);
  std::vector<uint8_t> out;
  auto l = LoadOne(*tier_, k, &out, secret.size());
  EXPECT_EQ(l.status.code(), StatusCode::kInternal) << l.status.ToString();
  EXPECT_NE(out, secret);
  auto e = ExistsSync(*tier_, {k});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].status.code(), StatusCode::kNotFound);
}

TEST_F(FsTierFilesTest, Finding4FifoInPlaceNeitherBlocksNorIsRead) {
  const auto k = Key(5);
  ASSERT_EQ(::mkfifo(tier_->PathOf(k).c_str(), 0644), 0);
  std::vector<uint8_t> out;
  const auto t0 = std::chrono::steady_clock::now();
  auto l = LoadOne(*tier_, k, &out, 4096);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(l.status.code(), StatusCode::kInternal) << l.status.ToString();
  // The tier still works afterwards.
  const auto v = Bytes(4096, 6);
  ASSERT_TRUE(StoreOne(*tier_, Key(6), v).status.ok());
  ASSERT_TRUE(LoadOne(*tier_, Key(6), &out, v.size()).status.ok());
  EXPECT_EQ(out, v);
}

TEST_F(FsTierFilesTest, DeleteRemovesTheChecksumToo) {
  const auto k = Key(7);
  ASSERT_TRUE(StoreOne(*tier_, k, Bytes(4096, 7)).status.ok());
  ASSERT_TRUE(std::filesystem::exists(tier_->PathOf(k) + ".kvdsum"));
  auto d = DeleteSync(*tier_, {k});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].status.ok());
  EXPECT_FALSE(std::filesystem::exists(tier_->PathOf(k)));
  EXPECT_FALSE(std::filesystem::exists(tier_->PathOf(k) + ".kvdsum"));
}

}  // namespace
}  // namespace kvd::l2
