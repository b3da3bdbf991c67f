// The client-side encoders (wire/request_encoder.h) against the golden frames of the real
// lmcache 0.5.6 client: what kvd decodes from a captured request, encoded again, is the
// captured request byte for byte (keys, block ids, scalar frames, ext-1 descriptors), and
// every encoded integer width round-trips through the streaming decoder.
#include "wire/request_encoder.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <limits>

#include "wire/codec.h"

namespace kvd::wire {
namespace {

std::vector<std::string> Frames(const std::string& name) {
  std::ifstream in(std::string(KVD_SOURCE_DIR) + "/tests/wire_golden/" + name + ".json");
  auto j = nlohmann::json::parse(in);
  std::vector<std::string> out;
  for (const auto& h : j.at("request_frames_hex")) {
    const std::string hex = h.get<std::string>();
    std::string b(hex.size() / 2, '\0');
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<int64_t> Ints(const TokenIds& t) { return {t.data(), t.data() + t.size()}; }

TEST(RequestEncoder, ReproducesTheClientsLookupAndStoreFrames) {
  for (const char* name : {"lookup", "store", "retrieve", "free_lookup_locks"}) {
    SCOPED_TRACE(name);
    const auto f = Frames(name);
    std::vector<std::string_view> p(f.begin() + 2, f.end());
    const bool transfer = std::string(name) == "store" || std::string(name) == "retrieve";
    if (transfer) {
      auto r = std::string(name) == "store" ? DecodeStore(p) : DecodeRetrieve(p);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(EncodeCacheKey(r->key, EncodeTokenArray(Ints(r->key.token_ids))), f[2]);
      EXPECT_EQ(EncodeRequestInt(r->instance_id), f[3]);
      EXPECT_EQ(EncodeBlockIds(r->block_ids), f[4]);
      EXPECT_EQ(EncodeRequestBin(r->event_handle), f[5]);
    } else {
      auto r = DecodeLookup(p);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(EncodeCacheKey(r->key, EncodeTokenArray(Ints(r->key.token_ids))), f[2]);
      EXPECT_EQ(EncodeRequestInt(r->tp_size), f[3]);
    }
  }
}

TEST(RequestEncoder, ReproducesTheClientsCpuShmDescriptor) {
  const auto f = Frames("register_kv_cache");
  std::vector<std::string_view> p(f.begin() + 2, f.end());
  auto r = DecodeRegisterKvCache(p);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> descs;
  for (const auto& t : r->tensors) descs.push_back(EncodeCpuShmDescriptorExt(t));
  EXPECT_EQ(EncodeArrayOf(descs), f[3]);
  EXPECT_EQ(EncodeRequestInt(r->instance_id), f[2]);
  EXPECT_EQ(EncodeRequestStr(r->model_name), f[4]);
}

TEST(RequestEncoder, EveryIntegerWidthRoundTripsThroughTheDecoder) {
  const int64_t vals[] = {0, 1, 127, 128, 255, 256, 65535, 65536, 0xFFFFFFFFll, 0x100000000ll,
                          std::numeric_limits<int64_t>::max(), -1, -32, -33, -128, -129, -32768,
                          -32769, -2147483648ll, -2147483649ll, std::numeric_limits<int64_t>::min()};
  for (int64_t v : vals) {
    const std::string frame = EncodeRequestInt(v);
    std::string_view p[] = {frame};
    auto id = DecodeInstanceId(p);
    ASSERT_TRUE(id.ok()) << v << ": " << id.status().ToString();
    EXPECT_EQ(*id, v);
  }
  // Widths: fixint 1 byte, uint8 2, uint16 3, uint32 5, uint64 9.
  EXPECT_EQ(EncodeRequestInt(127).size(), 1u);
  EXPECT_EQ(EncodeRequestInt(200).size(), 2u);
  EXPECT_EQ(EncodeRequestInt(60000).size(), 3u);
  EXPECT_EQ(EncodeRequestInt(70000).size(), 5u);
  EXPECT_EQ(EncodeRequestInt(int64_t{1} << 40).size(), 9u);
}

}  // namespace
}  // namespace kvd::wire
