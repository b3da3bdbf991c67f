// Bounded JSON bodies (issue 27, finding 1): nesting is counted before parsing (brackets in
// strings do not count), a body past the bound is refused without being parsed, and error
// replies repeat at most kMaxEchoBytes of client input.
#include "http/json_body.h"

#include <gtest/gtest.h>

#include <string>

namespace kvd::http {
namespace {

TEST(JsonBody, NestingIsCountedOutsideStringsOnly) {
  EXPECT_EQ(JsonNestingDepth("{}"), 1u);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": []}]})"), 4u);
  EXPECT_EQ(JsonNestingDepth(R"(["[[[[", "\"[[[["])"), 1u);
  EXPECT_EQ(JsonNestingDepth("42"), 0u);
  // Stops at the bound.
  EXPECT_EQ(JsonNestingDepth(std::string(1'000'000, '['), 64), 65u);
}

TEST(JsonBody, Finding1DeepNestingIsRefusedBeforeParsing) {
  std::string why;
  const auto deep = ParseJsonBody(std::string(100'000, '[') + std::string(100'000, ']'), &why);
  EXPECT_TRUE(deep.is_discarded());
  EXPECT_NE(why.find("nested deeper than 64"), std::string::npos) << why;
  const auto at_bound = ParseJsonBody(std::string(64, '[') + std::string(64, ']'), &why);
  EXPECT_FALSE(at_bound.is_discarded());
  const auto bad = ParseJsonBody("{\"a\": ", &why);
  EXPECT_TRUE(bad.is_discarded());
  EXPECT_EQ(why, "invalid JSON");
}

TEST(JsonBody, EchoesAreBounded) {
  const nlohmann::json small = {{"a", 1}};
  EXPECT_EQ(BoundedEcho(small), small);
  nlohmann::json big = nlohmann::json::array();
  for (int i = 0; i < 10'000; ++i) big.push_back(i);
  const nlohmann::json echo = BoundedEcho(big);
  ASSERT_TRUE(echo.is_string());
  EXPECT_LE(echo.get<std::string>().size(), kMaxEchoBytes + 3);  // + the ellipsis
  EXPECT_EQ(echo.get<std::string>().rfind("[0,1,2", 0), 0u);
}

}  // namespace
}  // namespace kvd::http
