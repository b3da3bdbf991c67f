#include "common/hex.h"

#include <gtest/gtest.h>

#include <string>

namespace kvd {
namespace {

TEST(Hex, EncodesEveryByteLowercaseTwoDigitsEach) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string hex = HexEncode(all);
  ASSERT_EQ(hex.size(), 512u);
  EXPECT_EQ(hex.substr(0, 8), "00010203");
  EXPECT_EQ(hex.substr(2 * 0xab, 2), "ab");
  EXPECT_EQ(hex.substr(510), "ff");
  EXPECT_EQ(HexEncode("", 0), "");
}

TEST(Hex, AppendKeepsWhatIsThere) {
  std::string s = "client-";
  const unsigned char id[] = {0x00, 0x7f, 0x80};
  AppendHex(s, id, sizeof(id));
  EXPECT_EQ(s, "client-007f80");
}

TEST(Hex, DecodeRoundTripsAndTakesEitherCase) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(HexDecode(HexEncode(all)), all);
  EXPECT_EQ(HexDecode("ABcd"), std::string("\xab\xcd"));
  EXPECT_EQ(HexDecode(""), std::string());
}

TEST(Hex, DecodeRefusesWhatIsNotHex) {
  for (const char* bad : {"a", "abc", "0g", "+1", "-1", " 1", "1 ", "0x", "zz", "\x80\x80"}) {
    EXPECT_FALSE(HexDecode(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace kvd
