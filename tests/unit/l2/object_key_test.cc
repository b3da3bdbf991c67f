// Object names as lmcache 0.5.6 writes them (checked against files and keys its fs,
// fs_native and resp adapters produced: see docs/tiers.md).
#include <gtest/gtest.h>

#include "l2/object_key.h"

namespace kvd::l2 {
namespace {

ObjectKey Sample() {
  ObjectKey k;
  k.model_name = "org/Model-1.5";
  k.kv_rank = KvRank(2, 1);
  k.object_group = 0;
  const char* hex = "b4490c4d8d6cecb96c741218113947516645bc6253ffba964d9a12e1ecc6108d";
  for (int i = 0; i < 32; ++i) k.chunk_hash[i] = static_cast<uint8_t>(std::stoi(std::string(hex + 2 * i, 2), nullptr, 16));
  return k;
}

TEST(ObjectKeyTest, KvRankPacksWorldAndRank) {
  EXPECT_EQ(KvRank(8, 3), 0x08030803u);
  EXPECT_EQ(KvRank(2, 0), 0x02000200u);
  EXPECT_EQ(KvRank(1, 0), 0x01000100u);
}

TEST(ObjectKeyTest, FileNameMatchesLmcache) {
  // A file the real lmcache 0.5.6 fs adapter wrote for rank 1 of TP=2.
  EXPECT_EQ(FileName(Sample()),
            "org-SEP-Model-1.5@0x02010201@0@b4490c4d8d6cecb96c741218113947516645bc6253ffba964d9a12e1ecc6108d.data");
  auto salted = Sample();
  salted.cache_salt = "tenant7";
  salted.object_group = 11;
  EXPECT_EQ(FileName(salted),
            "org-SEP-Model-1.5@0x02010201@b@b4490c4d8d6cecb96c741218113947516645bc6253ffba964d9a12e1ecc6108d@tenant7.data");
}

TEST(ObjectKeyTest, RespKeyMatchesLmcache) {
  EXPECT_EQ(RespKey(Sample()),
            "org/Model-1.5@02010201@0@b4490c4d8d6cecb96c741218113947516645bc6253ffba964d9a12e1ecc6108d");
  EXPECT_EQ(RespKey(Sample(), "prod"),
            "prod@org/Model-1.5@02010201@0@b4490c4d8d6cecb96c741218113947516645bc6253ffba964d9a12e1ecc6108d");
}

TEST(ObjectKeyTest, SpellingsRoundTrip) {
  auto k = Sample();
  k.cache_salt = "s-1";
  k.layout_tag = "00c0ffee";
  auto f = ParseFileName(FileName(k));
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(*f, k);
  auto r = ParseRespKey(RespKey(k, "pre"), "pre");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r, k);
  EXPECT_FALSE(ParseRespKey(RespKey(k, "pre"), "other").has_value());
  EXPECT_FALSE(ParseRespKey(RespKey(k, "pre")).has_value());
}

TEST(ObjectKeyTest, PrivateLayoutsAreNeverLmcacheNames) {
  auto k = Sample();
  k.layout_tag = "1234abcd";
  const std::string f = FileName(k);
  EXPECT_NE(f, FileName(Sample()));
  // lmcache parses the hash field with bytes.fromhex: "<hex>~k<tag>" is not hex.
  EXPECT_NE(f.find("~k1234abcd"), std::string::npos);
}

TEST(ObjectKeyTest, ForeignNamesDoNotParse) {
  EXPECT_FALSE(ParseFileName("notes.txt").has_value());
  EXPECT_FALSE(ParseFileName("m@0x02000200@0@abcd.data").has_value());  // short hash
  EXPECT_FALSE(ParseFileName(FileName(Sample()) + ".tmp").has_value());
  std::string tmp = FileName(Sample());
  tmp = tmp.substr(0, tmp.size() - 5) + ".tmp";
  EXPECT_FALSE(ParseFileName(tmp).has_value());
  EXPECT_FALSE(ParseRespKey("a@b").has_value());
  EXPECT_FALSE(ParseRespKey("m@zz@0@" + std::string(64, 'a')).has_value());
}

TEST(ObjectKeyTest, ValidationFollowsLmcacheInvariants) {
  auto k = Sample();
  EXPECT_TRUE(ValidateObjectKey(k).ok());
  k.model_name = "a@b";
  EXPECT_FALSE(ValidateObjectKey(k).ok());
  k = Sample();
  k.cache_salt = "a/b";
  EXPECT_FALSE(ValidateObjectKey(k).ok());
  k.cache_salt = std::string(129, 's');
  EXPECT_FALSE(ValidateObjectKey(k).ok());
  k.cache_salt = std::string(128, 's');
  EXPECT_TRUE(ValidateObjectKey(k).ok());
  k.model_name = "..";
  EXPECT_FALSE(ValidateObjectKey(k).ok());
}

}  // namespace
}  // namespace kvd::l2
