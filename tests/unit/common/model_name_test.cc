// The one model-name rule (issue 27, finding 5): names that lmcache's tier object keys would
// confuse with another name are refused, ordinary names with '/' are not.
#include "common/model_name.h"

#include <gtest/gtest.h>

#include <string>

namespace kvd {
namespace {

TEST(ModelName, Finding5NamesThatShareTierKeysAreRefused) {
  EXPECT_TRUE(CheckModelName("meta-llama/Llama-3.1-8B").ok());
  EXPECT_TRUE(CheckModelName("MiniMaxAI/MiniMax-M3").ok());
  EXPECT_TRUE(CheckModelName("org-SE-P-model").ok());
  EXPECT_FALSE(CheckModelName("org-SEP-model").ok());
  EXPECT_NE(CheckModelName("a-SEP-b").message().find("-SEP-"), std::string::npos);
  EXPECT_FALSE(CheckModelName("org@model").ok());
  EXPECT_EQ(CheckModelName("").message(), "model_name must be non-empty and must not contain '@'");
  EXPECT_TRUE(CheckModelName("", /*allow_empty=*/true).ok());
  EXPECT_FALSE(CheckModelName("a-SEP-b", /*allow_empty=*/true).ok());
  EXPECT_TRUE(CheckModelName(std::string(kMaxModelNameBytes, 'm')).ok());
  EXPECT_FALSE(CheckModelName(std::string(kMaxModelNameBytes + 1, 'm')).ok());
}

}  // namespace
}  // namespace kvd
