// CacheBlend ops' codecs (wire/codec.h, "CacheBlend ops"): requests packed the way the
// lmcache 0.5.6 client packs them (one frame per parameter, dataclasses as maps, ext type 1
// descriptors) decode to exact field values; malformed, oversize and out-of-range inputs are
// refused with a message naming the field; the replies are msgspec's bytes. The captured
// golden frames are in blend_golden_test.cc.
#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <functional>

#include "wire/codec.h"
#include "wire/request_encoder.h"

namespace kvd::wire {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

std::string Pack(const std::function<void(Packer&)>& fn) {
  msgpack::sbuffer b;
  Packer pk(b);
  fn(pk);
  return std::string(b.data(), b.size());
}

void Str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void Bin(Packer& pk, std::string_view s) {
  pk.pack_bin(static_cast<uint32_t>(s.size()));
  pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
}

std::string PackInt(int64_t v) { return Pack([&](Packer& pk) { pk.pack_int64(v); }); }
std::string PackStr(std::string_view s) { return Pack([&](Packer& pk) { Str(pk, s); }); }
std::string PackBin(std::string_view s) { return Pack([&](Packer& pk) { Bin(pk, s); }); }
std::string PackBool(bool v) { return Pack([&](Packer& pk) { v ? pk.pack_true() : pk.pack_false(); }); }
const std::string kNil = "\xc0";

std::string PackInts(const std::vector<int64_t>& v) {
  return Pack([&](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(v.size()));
    for (int64_t x : v) pk.pack_int64(x);
  });
}

std::string PackIntLists(const std::vector<std::vector<int64_t>>& v) {
  return Pack([&](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(v.size()));
    for (const auto& l : v) {
      pk.pack_array(static_cast<uint32_t>(l.size()));
      for (int64_t x : l) pk.pack_int64(x);
    }
  });
}

// IPCCacheServerKey with `n` tokens, range [0, end), worker `worker` (nil: scheduler).
std::string PackKey(int64_t n, int64_t end, std::optional<int64_t> worker, std::string rid = "req-b") {
  return Pack([&](Packer& pk) {
    pk.pack_map(10);
    Str(pk, "model_name"); Str(pk, "llama");
    Str(pk, "world_size"); pk.pack_int64(2);
    Str(pk, "worker_id"); if (worker) pk.pack_int64(*worker); else pk.pack_nil();
    Str(pk, "token_ids"); pk.pack_array(static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; ++i) pk.pack_int64(i * 7 % 50000);
    Str(pk, "start"); pk.pack_int64(0);
    Str(pk, "end"); pk.pack_int64(end);
    Str(pk, "request_id"); Str(pk, rid);
    Str(pk, "cache_salt"); Str(pk, "");
    Str(pk, "request_configs"); pk.pack_nil();
    Str(pk, "num_kv_readers"); pk.pack_int64(1);
  });
}

std::string CosSinDescriptor(const std::string& tag = "cpu_shm") {
  std::string body = Pack([&](Packer& pk) {
    pk.pack_map(5);
    Str(pk, "type"); Str(pk, tag);
    Str(pk, "shm_name"); Str(pk, "/lmcache_kv_7_2");
    Str(pk, "nbytes"); pk.pack_int64(4096 * 64 * 2);
    Str(pk, "version"); pk.pack_int64(1);
    Str(pk, "metadata");
    pk.pack_map(5);
    Str(pk, "dtype"); Str(pk, "bfloat16");
    Str(pk, "shape"); pk.pack_array(2); pk.pack_int64(4096); pk.pack_int64(64);
    Str(pk, "stride"); pk.pack_array(2); pk.pack_int64(64); pk.pack_int64(1);
    Str(pk, "storage_offset"); pk.pack_int64(0);
    Str(pk, "device_uuid"); Str(pk, "cpu");
  });
  return body;
}

std::string PackExts(const std::vector<std::string>& bodies) {
  return Pack([&](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(bodies.size()));
    for (const auto& b : bodies) {
      pk.pack_ext(b.size(), 1);
      pk.pack_ext_body(b.data(), static_cast<uint32_t>(b.size()));
    }
  });
}

struct MatchSpec {
  int64_t old_st, old_ed, cur_st, cur_ed;
  std::string hash;
};

std::string PackMatches(const std::vector<MatchSpec>& ms) {
  return Pack([&](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(ms.size()));
    for (const auto& m : ms) {
      pk.pack_map(5);
      Str(pk, "old_st"); pk.pack_int64(m.old_st);
      Str(pk, "old_ed"); pk.pack_int64(m.old_ed);
      Str(pk, "cur_st"); pk.pack_int64(m.cur_st);
      Str(pk, "cur_ed"); pk.pack_int64(m.cur_ed);
      Str(pk, "hash"); Bin(pk, m.hash);
    }
  });
}

template <typename T>
void ExpectRefused(const Result<T>& r, const std::string& expect) {
  ASSERT_FALSE(r.ok()) << "accepted; wanted an error with '" << expect << "'";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(expect), std::string::npos)
      << "message '" << r.status().message() << "' lacks '" << expect << "'";
}

Result<CbRegisterRopeRequest> Rope(const std::vector<std::string>& frames) {
  std::vector<std::string_view> v(frames.begin(), frames.end());
  return DecodeCbRegisterRope(v);
}

// The 8 payloads of a full cb_register_rope; `with_kv_quant` false drops the last (7).
std::vector<std::string> RopeFrames(bool with_kv_quant = true) {
  std::vector<std::string> f = {PackInt(1234567890123), PackExts({CosSinDescriptor()}), PackInt(64),
                                PackBool(true), PackInts({0, -1}), PackIntLists({{0, 64}, {}}),
                                PackInts({128, 128}), PackStr("fp8_e4m3")};
  if (!with_kv_quant) f.pop_back();
  return f;
}

// ---- cb_register_rope -------------------------------------------------------------

TEST(CbRegisterRope, EightPayloadsDecodeToExactValues) {
  auto r = Rope(RopeFrames());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->instance_id, 1234567890123);
  ASSERT_EQ(r->cos_sin_caches.size(), 1u);
  EXPECT_EQ(r->cos_sin_caches[0].memory, TensorMemory::kCpuShm);
  EXPECT_EQ(r->cos_sin_caches[0].shape, (std::vector<int64_t>{4096, 64}));
  EXPECT_EQ(r->cos_sin_caches[0].shm_name, "/lmcache_kv_7_2");
  EXPECT_EQ(r->head_size, 64);
  EXPECT_TRUE(r->is_neox_style);
  EXPECT_EQ(r->group_to_cache, (std::vector<int64_t>{0, -1}));
  ASSERT_EQ(r->group_rot.size(), 2u);
  ASSERT_TRUE(r->group_rot[0].has_value());
  EXPECT_EQ(r->group_rot[0]->offset, 0);
  EXPECT_EQ(r->group_rot[0]->width, 64);
  EXPECT_FALSE(r->group_rot[1].has_value());
  EXPECT_EQ(r->group_head_size, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(r->kv_quant, "fp8_e4m3");
}

TEST(CbRegisterRope, SevenPayloadsAreAClientBeforeKvQuant) {
  auto r = Rope(RopeFrames(/*with_kv_quant=*/false));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->kv_quant, "");
  EXPECT_EQ(r->group_head_size, (std::vector<int64_t>{128, 128}));
}

TEST(CbRegisterRope, EmptyAndNilListsAndNoCaches) {
  // A model without RoPE: no caches, every list empty, kv_quant "" (the defaults).
  auto a = Rope({PackInt(5), PackExts({}), PackInt(128), PackBool(false), PackInts({}),
                 PackIntLists({}), PackInts({}), PackStr("")});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->cos_sin_caches.empty());
  EXPECT_FALSE(a->is_neox_style);
  EXPECT_TRUE(a->group_to_cache.empty());
  EXPECT_TRUE(a->group_rot.empty());
  EXPECT_TRUE(a->group_head_size.empty());
  // None passed for a list (the client encodes it as nil without checking): empty.
  auto b = Rope({PackInt(5), kNil, PackInt(128), PackBool(false), kNil, kNil, kNil, kNil});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_TRUE(b->cos_sin_caches.empty());
  EXPECT_EQ(b->kv_quant, "");
  // A None entry of group_rot (direct callers' form of "skip this group").
  std::string rot = Pack([](Packer& pk) { pk.pack_array(2); pk.pack_nil(); pk.pack_array(2); pk.pack_int64(32); pk.pack_int64(64); });
  auto c = Rope({PackInt(5), PackExts({CosSinDescriptor()}), PackInt(128), PackBool(true),
                 PackInts({0, 0}), rot, PackInts({}), PackStr("fp8_e5m2")});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->group_rot.size(), 2u);
  EXPECT_FALSE(c->group_rot[0].has_value());
  EXPECT_EQ(c->group_rot[1]->offset, 32);
  EXPECT_EQ(c->kv_quant, "fp8_e5m2");
}

TEST(CbRegisterRope, RefusesWhatLmcacheRefusesWithoutServerState) {
  auto with = [](size_t i, std::string frame) {
    auto f = RopeFrames();
    f[i] = std::move(frame);
    return Rope(f);
  };
  // group_to_cache outside [-1, number of caches): one cache was sent.
  ExpectRefused(with(4, PackInts({0, 1})), "group_to_cache[1]: 1 is outside [-1, 1)");
  ExpectRefused(with(4, PackInts({-2})), "group_to_cache[0]: -2 is outside [-1, 1)");
  ExpectRefused(Rope({PackInt(5), PackExts({}), PackInt(64), PackBool(true), PackInts({0}),
                      PackIntLists({}), PackInts({}), PackStr("")}),
                "outside [-1, 0)");
  ExpectRefused(with(7, PackStr("int8")), "kv_quant: 'int8' is not one of");
  ExpectRefused(with(5, PackIntLists({{0, 64, 1}})), "group_rot[0]: expected [offset >= 0, width > 0]");
  ExpectRefused(with(5, PackIntLists({{8}})), "group_rot[0]");
  ExpectRefused(with(5, PackIntLists({{-1, 64}})), "group_rot[0]");
  ExpectRefused(with(5, PackIntLists({{0, 64}, {0, 0}})), "group_rot[1]");
  // Types and structure.
  ExpectRefused(with(0, PackStr("1")), "cb_register_rope.instance_id: expected integer");
  ExpectRefused(with(1, PackInts({1})), "cos_sin_caches_ipc[0]: expected msgpack ext type 1");
  ExpectRefused(with(1, PackInt(1)), "cos_sin_caches_ipc: expected array");
  ExpectRefused(with(1, PackExts({CosSinDescriptor("musa")})), "unsupported wrapper type 'musa'");
  ExpectRefused(with(3, PackStr("yes")), "is_neox_style: expected bool");
  ExpectRefused(with(4, PackStr("0")), "group_to_cache: expected array of integers");
  ExpectRefused(with(5, PackInts({1, 2})), "group_rot[0]: expected array of integers");
  ExpectRefused(with(5, PackInt(3)), "group_rot: expected array");
  ExpectRefused(with(6, PackIntLists({{1}})), "group_head_size[0]: expected integer");
  ExpectRefused(with(7, PackInt(8)), "kv_quant: expected string");
  ExpectRefused(with(2, "\x92\x01"), "malformed msgpack");
  ExpectRefused(with(2, PackInt(1) + "x"), "trailing bytes");
  // Arity: 7..8 payload frames.
  auto six = RopeFrames(false);
  six.pop_back();
  ExpectRefused(Rope(six), "cb_register_rope: expected 7..8 payload frames, got 6");
  auto nine = RopeFrames();
  nine.push_back(kNil);
  ExpectRefused(Rope(nine), "got 9");
}

TEST(CbRegisterRope, OversizeHeadersAreRefusedBeforeAllocation) {
  auto f = RopeFrames();
  f[1] = std::string("\xdd\x80\x00\x00\x00", 5);  // 2^31 descriptors announced, none sent
  ExpectRefused(Rope(f), "malformed msgpack");
  f = RopeFrames();
  f[5] = std::string(40, '\x91') + "\x90";        // nested deeper than DecodeLimits allow
  ExpectRefused(Rope(f), "malformed msgpack");
}

// ---- cb_retrieve_pre_computed --------------------------------------------------------

Result<CbRetrievePreComputedRequest> RetrievePre(const std::vector<std::string>& frames) {
  std::vector<std::string_view> v(frames.begin(), frames.end());
  return DecodeCbRetrievePreComputed(v);
}

const std::string kHash32(32, '\x5a');

std::vector<std::string> RetrievePreFrames(std::string matches) {
  return {PackKey(600, 600, 1), std::move(matches), PackIntLists({{3, 4, 5}, {9}}), PackInt(77),
          PackBin("stub_ipc_handle")};
}

TEST(CbRetrievePreComputed, DecodesEveryFieldExactly) {
  auto r = RetrievePre(RetrievePreFrames(
      PackMatches({{0, 256, 300, 556, kHash32}, {256, 300, 556, 600, std::string(8, '\x01')}})));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->key.model_name, "llama");
  EXPECT_EQ(r->key.worker_id, 1);
  EXPECT_EQ(r->key.token_ids.size(), 600u);
  ASSERT_EQ(r->match_results.size(), 2u);
  const CbMatchResult& m = r->match_results[0];
  EXPECT_EQ(m.old_st, 0);
  EXPECT_EQ(m.old_ed, 256);
  EXPECT_EQ(m.cur_st, 300);
  EXPECT_EQ(m.cur_ed, 556);
  EXPECT_EQ(m.hash, kHash32);
  EXPECT_EQ(r->match_results[1].hash, std::string(8, '\x01'));
  EXPECT_EQ(r->block_ids, (std::vector<std::vector<int64_t>>{{3, 4, 5}, {9}}));
  EXPECT_EQ(r->instance_id, 77);
  EXPECT_EQ(r->event_handle, "stub_ipc_handle");
}

TEST(CbRetrievePreComputed, SchedulerKeyUnknownFieldsAndNoMatches) {
  auto f = RetrievePreFrames(PackMatches({}));
  f[0] = PackKey(600, 512, std::nullopt);  // worker_id nil is allowed here (lmcache reads it as optional)
  auto r = RetrievePre(f);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->key.worker_id.has_value());
  EXPECT_TRUE(r->match_results.empty());
  // Field order does not matter, unknown and non-str keys are skipped, first occurrence wins.
  std::string m = Pack([](Packer& pk) {
    pk.pack_array(1);
    pk.pack_map(8);
    Str(pk, "hash"); Bin(pk, "h");
    pk.pack_int64(3); pk.pack_nil();
    Str(pk, "cur_ed"); pk.pack_int64(9);
    Str(pk, "future"); pk.pack_array(1); pk.pack_map(0);
    Str(pk, "cur_st"); pk.pack_int64(1);
    Str(pk, "old_ed"); pk.pack_int64(8);
    Str(pk, "old_st"); pk.pack_int64(0);
    Str(pk, "cur_ed"); pk.pack_int64(-5);
  });
  auto s = RetrievePre(RetrievePreFrames(m));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->match_results[0].cur_ed, 9);
  EXPECT_EQ(s->match_results[0].hash, "h");
}

TEST(CbRetrievePreComputed, RefusesBadMatchesNamingTheField) {
  auto missing = Pack([](Packer& pk) {
    pk.pack_array(1); pk.pack_map(4);
    Str(pk, "old_st"); pk.pack_int64(0); Str(pk, "old_ed"); pk.pack_int64(1);
    Str(pk, "cur_st"); pk.pack_int64(0); Str(pk, "cur_ed"); pk.pack_int64(1);
  });
  ExpectRefused(RetrievePre(RetrievePreFrames(missing)), "match_results[0].hash: missing field");
  auto str_st = Pack([](Packer& pk) {
    pk.pack_array(1); pk.pack_map(1); Str(pk, "old_st"); Str(pk, "0");
  });
  ExpectRefused(RetrievePre(RetrievePreFrames(str_st)), "match_results[0].old_st: expected integer");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackMatches({{0, 8, 0, 8, "h"}, {0, 8, 9, 8, "h"}}))),
                "match_results[1]: ranges [0, 8) and [9, 8) must satisfy 0 <= st <= ed");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackMatches({{-1, 8, 0, 8, "h"}}))), "match_results[0]: ranges");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackMatches({{0, 8, 0, 8, ""}}))), "hash: expected 1..64 bytes, got 0");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackMatches({{0, 8, 0, 8, std::string(65, 'h')}}))),
                "hash: expected 1..64 bytes, got 65");
  auto int_hash = Pack([](Packer& pk) {
    pk.pack_array(1); pk.pack_map(5);
    Str(pk, "old_st"); pk.pack_int64(0); Str(pk, "old_ed"); pk.pack_int64(1);
    Str(pk, "cur_st"); pk.pack_int64(0); Str(pk, "cur_ed"); pk.pack_int64(1);
    Str(pk, "hash"); pk.pack_int64(7);
  });
  ExpectRefused(RetrievePre(RetrievePreFrames(int_hash)), "match_results[0].hash: expected bytes");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackInts({1}))), "match_results[0]: expected map (CBMatchResult)");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackInt(1))), "match_results: expected array");
  // The first error in stream order wins; a malformed document is reported before any field.
  ExpectRefused(RetrievePre(RetrievePreFrames(PackMatches({{0, 8, 0, 8, ""}, {0, 1, 0, 2, "h"}}))), "[0].hash");
  std::string cut = PackMatches({{0, 8, 0, 8, ""}});
  cut.pop_back();
  ExpectRefused(RetrievePre(RetrievePreFrames(cut + "")), "malformed msgpack");
  ExpectRefused(RetrievePre(RetrievePreFrames(PackMatches({}) + "\xc0")), "trailing bytes");
  ExpectRefused(RetrievePre(RetrievePreFrames(std::string("\xdd\x80\x00\x00\x00", 5))), "array size overflow");
  ExpectRefused(RetrievePre(RetrievePreFrames("\x91" + std::string(20, '\x81') + "\xc0")), "malformed msgpack");
}

TEST(CbRetrievePreComputed, OtherPayloadsAndArity) {
  auto f = RetrievePreFrames(PackMatches({}));
  f[3] = PackStr("77");
  ExpectRefused(RetrievePre(f), "cb_retrieve_pre_computed.instance_id: expected integer");
  f = RetrievePreFrames(PackMatches({}));
  f[4] = PackInt(0);
  ExpectRefused(RetrievePre(f), "event_ipc_handle: expected bytes");
  f = RetrievePreFrames(PackMatches({}));
  f[2] = PackStr("x");
  ExpectRefused(RetrievePre(f), "cb_retrieve_pre_computed.block_ids: expected array");
  f = RetrievePreFrames(PackMatches({}));
  f[0] = PackKey(10, 20, 1);
  ExpectRefused(RetrievePre(f), "cb_retrieve_pre_computed.key: range [0, 20) not within 10 token ids");
  f.pop_back();
  ExpectRefused(RetrievePre(f), "expected 5 payload frames, got 4");
}

// ---- cb_unified_lookup, cb_protocol_handshake, cb_reorder_plan, cb_unregister_rope ------

TEST(CbUnifiedLookup, KeyAndTpSizeBothRequired) {
  std::vector<std::string> f = {PackKey(600, 512, std::nullopt, "req-u"), PackInt(2)};
  std::vector<std::string_view> v(f.begin(), f.end());
  auto r = DecodeCbUnifiedLookup(v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->key.request_id, "req-u");
  EXPECT_EQ(r->key.end, 512);
  EXPECT_EQ(r->tp_size, 2);
  ExpectRefused(DecodeCbUnifiedLookup(Frames(v).subspan(0, 1)), "cb_unified_lookup: expected 2 payload frames, got 1");
  f[1] = PackStr("2");
  v = {f.begin(), f.end()};
  ExpectRefused(DecodeCbUnifiedLookup(v), "cb_unified_lookup.tp_size: expected integer");
  f[0] = PackInt(1);
  v = {f.begin(), f.end()};
  ExpectRefused(DecodeCbUnifiedLookup(v), "cb_unified_lookup.key: expected map");
}

TEST(CbProtocolHandshake, DecodesTheVersionAndAnswersLmcachesPair) {
  std::vector<std::string> f = {PackInt(1)};
  std::vector<std::string_view> v(f.begin(), f.end());
  EXPECT_EQ(*DecodeCbProtocolHandshake(v), 1);
  f = {PackInt(-3)};
  v = {f.begin(), f.end()};
  EXPECT_EQ(*DecodeCbProtocolHandshake(v), -3);
  f = {PackStr("1")};
  v = {f.begin(), f.end()};
  ExpectRefused(DecodeCbProtocolHandshake(v), "client_version: expected integer");
  ExpectRefused(DecodeCbProtocolHandshake({}), "expected 1 payload frames, got 0");
  EXPECT_EQ(EncodeCbProtocolHandshake(1), std::string("\x92\x01\xc3"));
  EXPECT_EQ(EncodeCbProtocolHandshake(2), std::string("\x92\x01\xc2"));
  EXPECT_EQ(EncodeCbProtocolHandshake(0), std::string("\x92\x01\xc2"));
}

TEST(CbReorderPlan, DecodesAndRefusesNegatives) {
  std::vector<std::string> f = {PackKey(600, 600, std::nullopt), PackInt(16), PackInt(50)};
  std::vector<std::string_view> v(f.begin(), f.end());
  auto r = DecodeCbReorderPlan(v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->key.token_ids.size(), 600u);
  EXPECT_EQ(r->keep_prefix, 16);
  EXPECT_EQ(r->budget_ms, 50);
  f[1] = PackInt(-1);
  v = {f.begin(), f.end()};
  ExpectRefused(DecodeCbReorderPlan(v), "cb_reorder_plan.keep_prefix: negative");
  f[1] = PackInt(0);
  f[2] = PackInt(-5);
  v = {f.begin(), f.end()};
  ExpectRefused(DecodeCbReorderPlan(v), "cb_reorder_plan.budget_ms: negative");
  ExpectRefused(DecodeCbReorderPlan(Frames(v).subspan(0, 2)), "expected 3 payload frames, got 2");
  // Reply: msgspec's list[int], smallest integer encodings.
  const uint32_t toks[] = {5, 200, 70000, 4294967295u};
  EXPECT_EQ(EncodeCbReorderPlan(toks),
            std::string("\x94\x05\xcc\xc8\xce\x00\x01\x11\x70\xce\xff\xff\xff\xff", 14));
  EXPECT_EQ(EncodeCbReorderPlan({}), std::string("\x90"));
}

TEST(CbUnregisterRope, IsTheInstanceIdDecoder) {
  std::vector<std::string> f = {PackInt(99)};
  std::vector<std::string_view> v(f.begin(), f.end());
  EXPECT_EQ(*DecodeInstanceId(v), 99);
}

TEST(CbOps, OpTableRowsMatchTheClientContract) {
  // The rows the server already routes (as unsupported ops) carry lmcache 0.5.6's ids and
  // payload counts (transport/zmq_impl/wire.py, transport/base.py).
  struct Row {
    Op op;
    const char* name;
    int id;
    int min, max;
  };
  for (const Row& row : {Row{Op::kCbRegisterRope, "cb_register_rope", 25, 7, 8},
                         Row{Op::kCbUnregisterRope, "cb_unregister_rope", 26, 1, 1},
                         Row{Op::kCbRetrievePreComputed, "cb_retrieve_pre_computed", 27, 5, 5},
                         Row{Op::kCbUnifiedLookup, "cb_unified_lookup", 28, 2, 2},
                         Row{Op::kCbProtocolHandshake, "cb_protocol_handshake", 33, 1, 1},
                         Row{Op::kCbReorderPlan, "cb_reorder_plan", -1, 3, 3}}) {
    const OpInfo& info = InfoOf(row.op);
    EXPECT_EQ(info.name, row.name);
    EXPECT_EQ(info.legacy_id, row.id) << row.name;
    EXPECT_EQ(info.min_payloads, row.min) << row.name;
    EXPECT_EQ(info.max_payloads, row.max) << row.name;
    EXPECT_EQ(FindOpByName(row.name), &info);
    if (row.id >= 0) {
      EXPECT_EQ(FindOpById(row.id), &info);
    }
  }
  // cb_reorder_plan has no frozen id: the client sends its name as a msgpack str.
  auto op = DecodeOp(PackStr("cb_reorder_plan"));
  ASSERT_TRUE(op.ok());
  EXPECT_EQ((*op)->op, Op::kCbReorderPlan);
}

// ---- cb_unified_lookup reply ----------------------------------------------------------

TEST(CbUnifiedLookupResult, EncodesMsgspecsMapByteForByte) {
  CbUnifiedLookupResult r;
  r.prefix_coverage_tokens = 256;
  r.non_prefix_segments.push_back({0, 256, 300, 556, std::string(2, '\xab')});
  std::string want;
  want += "\x83";
  want += std::string("\xb6prefix_coverage_tokens\xcd\x01\x00", 26);
  want += "\xb3non_prefix_segments\x91\x85";
  want += std::string("\xa6old_st\x00", 8);
  want += std::string("\xa6old_ed\xcd\x01\x00", 10);
  want += "\xa6" "cur_st\xcd\x01\x2c";
  want += "\xa6" "cur_ed\xcd\x02\x2c";
  want += "\xa4hash\xc4\x02\xab\xab";
  want += "\xb9segmented_prefix_segments\x90";
  EXPECT_EQ(EncodeCbUnifiedLookupResult(r), want);
  // Nothing found: {prefix_coverage_tokens: 0, non_prefix_segments: [], segmented...: []}.
  std::string empty = "\x83\xb6prefix_coverage_tokens";
  empty += '\0';
  empty += "\xb3non_prefix_segments\x90\xb9segmented_prefix_segments\x90";
  EXPECT_EQ(EncodeCbUnifiedLookupResult({}), empty);
}

// ---- client-side encoders round-trip through the decoders ------------------------------

TEST(CbRequestEncoders, RoundTripThroughTheDecoders) {
  std::vector<CbMatchResult> ms = {{0, 256, 300, 556, kHash32}, {7, 9, 7, 9, "x"}};
  std::vector<std::string> f = RetrievePreFrames(EncodeCbMatchResults(ms));
  auto r = RetrievePre(f);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->match_results.size(), 2u);
  EXPECT_EQ(r->match_results[1].old_st, 7);
  EXPECT_EQ(EncodeCbMatchResults(r->match_results), f[1]);

  std::vector<std::optional<RopeWindow>> rot = {RopeWindow{0, 64}, std::nullopt, RopeWindow{64, 300}};
  std::vector<std::string> rf = {EncodeRequestInt(3), PackExts({}), EncodeRequestInt(128),
                                 EncodeRequestBool(false), EncodeIntList(std::vector<int64_t>{}),
                                 EncodeGroupRot(rot), EncodeIntList(std::vector<int64_t>{576, 64}),
                                 EncodeRequestStr("")};
  auto g = Rope(rf);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_EQ(g->group_rot.size(), 3u);
  EXPECT_EQ(g->group_rot[2]->width, 300);
  EXPECT_FALSE(g->group_rot[1].has_value());
  EXPECT_EQ(EncodeGroupRot(g->group_rot), rf[5]);
  EXPECT_EQ(EncodeIntList(g->group_head_size), rf[6]);
  EXPECT_EQ(EncodeRequestBool(true), std::string("\xc3"));
}

}  // namespace
}  // namespace kvd::wire
