// Codec tests: requests built the way the lmcache 0.5.6 client encodes them (maps keyed
// by field name, every field present, ext type 1 descriptors), malformed inputs, and
// the reply encodings.
#include "wire/codec.h"

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <functional>

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

struct KeySpec {
  std::string model = "llama";
  int64_t world_size = 2;
  std::optional<int64_t> worker_id = 1;
  int64_t n_tokens = 600;
  int64_t start = 0, end = 512;
  std::string request_id = "req-1";
  std::string salt = "";
  int64_t readers = 1;
  bool with_unknown_field = false;
};

std::string PackKey(const KeySpec& k) {
  return Pack([&](Packer& pk) {
    pk.pack_map(k.with_unknown_field ? 11 : 10);
    Str(pk, "model_name"); Str(pk, k.model);
    Str(pk, "world_size"); pk.pack_int64(k.world_size);
    Str(pk, "worker_id"); if (k.worker_id) pk.pack_int64(*k.worker_id); else pk.pack_nil();
    Str(pk, "token_ids"); pk.pack_array(static_cast<uint32_t>(k.n_tokens));
    for (int64_t i = 0; i < k.n_tokens; ++i) pk.pack_int64(i * 7 % 50000);
    Str(pk, "start"); pk.pack_int64(k.start);
    Str(pk, "end"); pk.pack_int64(k.end);
    Str(pk, "request_id"); Str(pk, k.request_id);
    Str(pk, "cache_salt"); Str(pk, k.salt);
    Str(pk, "request_configs"); pk.pack_nil();
    Str(pk, "num_kv_readers"); pk.pack_int64(k.readers);
    if (k.with_unknown_field) { Str(pk, "from_the_future"); pk.pack_true(); }
  });
}

std::string PackInt(int64_t v) { return Pack([&](Packer& pk) { pk.pack_int64(v); }); }

std::string PackBlockIds(std::vector<std::vector<int64_t>> g) {
  return Pack([&](Packer& pk) {
    pk.pack_array(static_cast<uint32_t>(g.size()));
    for (auto& l : g) {
      pk.pack_array(static_cast<uint32_t>(l.size()));
      for (auto v : l) pk.pack_int64(v);
    }
  });
}

std::string PackBin(std::string_view s) {
  return Pack([&](Packer& pk) {
    pk.pack_bin(static_cast<uint32_t>(s.size()));
    pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
  });
}

std::string CpuShmDescriptor(const std::string& tag = "cpu_shm") {
  return Pack([&](Packer& pk) {
    pk.pack_map(5);
    Str(pk, "type"); Str(pk, tag);
    Str(pk, "shm_name"); Str(pk, "/lmcache_kv_1_0");
    Str(pk, "nbytes"); pk.pack_int64(4096);
    Str(pk, "version"); pk.pack_int64(1);
    Str(pk, "metadata");
    pk.pack_map(5);
    Str(pk, "dtype"); Str(pk, "bfloat16");
    Str(pk, "shape"); pk.pack_array(2); pk.pack_int64(16); pk.pack_int64(128);
    Str(pk, "stride"); pk.pack_array(2); pk.pack_int64(128); pk.pack_int64(1);
    Str(pk, "storage_offset"); pk.pack_int64(0);
    Str(pk, "device_uuid"); Str(pk, "cpu");
  });
}

Result<TransferRequest> Store(const std::vector<std::string>& frames) {
  std::vector<std::string_view> v(frames.begin(), frames.end());
  return DecodeStore(v);
}

TEST(OpTable, FrozenIdsAndNamesRoundTrip) {
  for (const auto& info : Lmcache056Ops()) {
    EXPECT_EQ(&InfoOf(info.op), &info) << info.name;
    EXPECT_EQ(FindOpByName(info.name), &info);
    if (info.legacy_id >= 0) {
      EXPECT_EQ(FindOpById(info.legacy_id), &info);
    }
  }
  EXPECT_EQ(FindOpById(6)->op, Op::kStore);
  EXPECT_EQ(FindOpById(21)->op, Op::kGetChunkSize);
  EXPECT_EQ(FindOpById(32)->op, Op::kGetExperimental);
  EXPECT_EQ(FindOpById(40)->op, Op::kGetExperimental);
  EXPECT_EQ(FindOpById(99), nullptr);
}

TEST(DecodeOp, IntStrAndGarbage) {
  auto a = DecodeOp(PackInt(8));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->op, Op::kLookup);
  auto b = DecodeOp(Pack([](Packer& pk) { Str(pk, "subscribe_kv_events"); }));
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->op, Op::kSubscribeKvEvents);
  EXPECT_EQ(DecodeOp(PackInt(77)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(DecodeOp(Pack([](Packer& pk) { Str(pk, "rm_rf"); })).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(DecodeOp("\xc1").status().code(), StatusCode::kInvalidArgument);   // never-used byte
  EXPECT_EQ(DecodeOp("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeOp(PackInt(6) + "x").status().code(), StatusCode::kInvalidArgument);  // trailing
}

TEST(DecodeStore, ReadsEveryField) {
  KeySpec k;
  auto r = Store({PackKey(k), PackInt(42), PackBlockIds({{3, 4, 5}}), PackBin("evt")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->key.model_name, "llama");
  EXPECT_EQ(r->key.world_size, 2);
  EXPECT_EQ(*r->key.worker_id, 1);
  ASSERT_EQ(r->key.token_ids.size(), 600u);
  EXPECT_EQ(r->key.token_ids[3], 21);
  EXPECT_EQ(r->key.end, 512);
  EXPECT_EQ(r->key.request_id, "req-1");
  EXPECT_EQ(r->key.num_kv_readers, 1);
  EXPECT_EQ(r->instance_id, 42);
  ASSERT_EQ(r->block_ids.size(), 1u);
  EXPECT_EQ(r->block_ids[0], (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(r->event_handle, "evt");
}

TEST(DecodeStore, UnknownMapKeysAreIgnoredAndFlatBlockIdsAreOneGroup) {
  KeySpec k;
  k.with_unknown_field = true;
  std::string flat = Pack([](Packer& pk) { pk.pack_array(2); pk.pack_int64(7); pk.pack_int64(8); });
  auto r = Store({PackKey(k), PackInt(1), flat, PackBin("")});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->block_ids.size(), 1u);
  EXPECT_EQ(r->block_ids[0], (std::vector<int64_t>{7, 8}));
}

TEST(DecodeStore, RejectsBadInputWithAMessageNamingTheField) {
  KeySpec k;
  struct Case {
    std::vector<std::string> frames;
    std::string expect;
  };
  KeySpec neg = k; neg.world_size = 0;
  KeySpec wid = k; wid.worker_id = 2;
  KeySpec nil = k; nil.worker_id.reset();
  KeySpec range = k; range.end = 1024;
  KeySpec salt = k; salt.salt = "a/b";
  KeySpec model = k; model.model = "x@y";
  std::vector<Case> cases = {
      {{PackKey(k), PackInt(1), PackBlockIds({{1}})}, "expected 4 payload frames"},
      {{PackKey(k), PackInt(1), PackBlockIds({{1}}), PackBin(""), PackInt(0)}, "expected 4 payload frames"},
      {{"\x93\x01", PackInt(1), PackBlockIds({{1}}), PackBin("")}, "malformed msgpack"},
      {{PackInt(5), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "expected map"},
      {{PackKey(neg), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "world_size"},
      {{PackKey(wid), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "worker_id"},
      {{PackKey(nil), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "worker_id: required"},
      {{PackKey(range), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "not within"},
      {{PackKey(salt), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "cache_salt"},
      {{PackKey(model), PackInt(1), PackBlockIds({{1}}), PackBin("")}, "model_name"},
      {{PackKey(k), Pack([](Packer& pk) { Str(pk, "1"); }), PackBlockIds({{1}}), PackBin("")}, "instance_id"},
      {{PackKey(k), PackInt(1), Pack([](Packer& pk) { pk.pack_array(1); pk.pack_array(1); Str(pk, "x"); }), PackBin("")}, "expected integer"},
  };
  for (const auto& c : cases) {
    auto r = Store(c.frames);
    ASSERT_FALSE(r.ok()) << c.expect;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos)
        << "message '" << r.status().message() << "' lacks '" << c.expect << "'";
  }
}

TEST(DecodeStore, OversizeArraysAreRefusedBeforeAllocation) {
  // An array header claiming 2^31 elements with no data behind it.
  std::string huge = "\xdd\x80\x00\x00\x00";
  KeySpec k;
  auto r = Store({PackKey(k), PackInt(1), huge, PackBin("")});
  ASSERT_FALSE(r.ok());
}

// Issue 27, finding 6: a request id is kept as long as the request's session and lookup hold
// (the read TTL, 300 s), so it is bounded where it is decoded: 1 KiB is accepted, one byte
// more is refused naming the field, in a key and as a bare request id frame.
TEST(DecodeLookup, Finding6RequestIdsOver1KiBAreRefused) {
  KeySpec k;
  k.worker_id.reset();
  k.request_id = std::string(kMaxRequestIdBytes, 'r');
  std::vector<std::string> f = {PackKey(k), PackInt(1)};
  std::vector<std::string_view> v(f.begin(), f.end());
  ASSERT_TRUE(DecodeLookup(v).ok());
  k.request_id.push_back('r');
  f[0] = PackKey(k);
  v.assign(f.begin(), f.end());
  auto r = DecodeLookup(v);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("request_id"), std::string::npos) << r.status().message();
  for (size_t n : {kMaxRequestIdBytes, kMaxRequestIdBytes + 1}) {
    const std::string id = Pack([&](Packer& pk) { Str(pk, std::string(n, 'q')); });
    std::vector<std::string_view> one = {id};
    EXPECT_EQ(DecodeRequestId(one).ok(), n == kMaxRequestIdBytes) << n;
    EXPECT_EQ(DecodeWaitPrefetch(one).ok(), n == kMaxRequestIdBytes) << n;
  }
}

TEST(DecodeRetrieve, SkipTokensIsOptionalAndNonNegative) {
  KeySpec k;
  std::vector<std::string> f = {PackKey(k), PackInt(1), PackBlockIds({{1, 2}}), PackBin("e")};
  std::vector<std::string_view> v(f.begin(), f.end());
  auto r = DecodeRetrieve(v);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->skip_first_n_tokens, 0);
  f.push_back(PackInt(16));
  v.assign(f.begin(), f.end());
  r = DecodeRetrieve(v);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->skip_first_n_tokens, 16);
  f.back() = PackInt(-1);
  v.assign(f.begin(), f.end());
  EXPECT_FALSE(DecodeRetrieve(v).ok());
}

TEST(DecodeLookup, NilWorkerAndTpSize) {
  KeySpec k;
  k.worker_id.reset();
  std::vector<std::string> f = {PackKey(k), PackInt(4)};
  std::vector<std::string_view> v(f.begin(), f.end());
  auto r = DecodeLookup(v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->key.worker_id.has_value());
  EXPECT_EQ(r->tp_size, 4);
}

// Token ids in every integer encoding a client may send, in runs and mixed, with the array
// ending at the very end of the frame (the bulk decoder stops 4 bytes before the end and the
// per-item path finishes): every value must come out as sent.
TEST(DecodeLookup, TokenIdsInEveryIntegerEncodingUpToTheFrameEnd) {
  std::vector<uint32_t> want;
  std::string frame = Pack([&](Packer& pk) {
    pk.pack_map(10);
    Str(pk, "model_name"); Str(pk, "llama");
    Str(pk, "world_size"); pk.pack_int64(1);
    Str(pk, "worker_id"); pk.pack_int64(0);
    Str(pk, "start"); pk.pack_int64(0);
    Str(pk, "end"); pk.pack_int64(0);
    Str(pk, "request_id"); Str(pk, "r");
    Str(pk, "cache_salt"); Str(pk, "");
    Str(pk, "request_configs"); pk.pack_nil();
    Str(pk, "num_kv_readers"); pk.pack_int64(1);
    Str(pk, "token_ids");
    const uint32_t n = 1000;
    pk.pack_array(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t kind = (i < 300) ? 3 : (i < 500 ? 0 : (i * 7 + i / 3) % 6);
      uint32_t v = 0;
      switch (kind) {
        case 0: v = i % 128; pk.pack_fix_uint8(static_cast<uint8_t>(v)); break;  // 0xcc, small
        case 1: v = (i * 37) % 128; pk.pack_uint8(static_cast<uint8_t>(v)); break;  // fixint
        case 2: v = 0xFF00u | (i & 0xFF); pk.pack_fix_uint16(static_cast<uint16_t>(v)); break;
        case 3: v = 0x89AB0000u + i * 0x10203u; pk.pack_fix_uint32(v); break;
        case 4: v = 200 + i % 50; pk.pack_fix_uint8(static_cast<uint8_t>(v)); break;
        case 5: v = 0xFFFFFFFFu - i; pk.pack_fix_uint64(v); break;  // 0xcf: per-item path
      }
      want.push_back(v);
    }
  });
  // token_ids is the last field, so its last ids sit in the frame's last bytes.
  std::vector<std::string> f = {frame, PackInt(1)};
  std::vector<std::string_view> v(f.begin(), f.end());
  auto r = DecodeLookup(v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->key.token_ids.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(r->key.token_ids[i], want[i]) << "at " << i;
  EXPECT_FALSE(r->key.token_ids.first_out_of_range().has_value());

  // Every tail length from 0 to 9 bytes after a run of uint32 ids: the last ids are exact.
  for (uint32_t tail = 0; tail < 10; ++tail) {
    std::vector<uint32_t> ids;
    std::string t = Pack([&](Packer& pk) {
      pk.pack_map(10);
      Str(pk, "model_name"); Str(pk, "m");
      Str(pk, "world_size"); pk.pack_int64(1);
      Str(pk, "worker_id"); pk.pack_int64(0);
      Str(pk, "start"); pk.pack_int64(0);
      Str(pk, "end"); pk.pack_int64(0);
      Str(pk, "request_id"); Str(pk, "r");
      Str(pk, "cache_salt"); Str(pk, "");
      Str(pk, "request_configs"); pk.pack_nil();
      Str(pk, "num_kv_readers"); pk.pack_int64(1);
      Str(pk, "token_ids");
      pk.pack_array(20 + tail);
      for (uint32_t i = 0; i < 20; ++i) { ids.push_back(0x01020304u * (i + 1)); pk.pack_fix_uint32(ids.back()); }
      for (uint32_t i = 0; i < tail; ++i) { ids.push_back(i + 1); pk.pack_uint8(static_cast<uint8_t>(i + 1)); }
    });
    std::vector<std::string> g = {t, PackInt(1)};
    std::vector<std::string_view> gv(g.begin(), g.end());
    auto rt = DecodeLookup(gv);
    ASSERT_TRUE(rt.ok()) << rt.status().ToString();
    ASSERT_EQ(rt->key.token_ids.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(rt->key.token_ids[i], ids[i]) << tail << "/" << i;
  }
}

TEST(DecodeTensorDescriptor, CpuShm) {
  auto d = DecodeTensorDescriptor(CpuShmDescriptor());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->memory, TensorMemory::kCpuShm);
  EXPECT_EQ(d->shm_name, "/lmcache_kv_1_0");
  EXPECT_EQ(d->nbytes, 4096u);
  EXPECT_EQ(d->dtype, "bfloat16");
  EXPECT_EQ(d->shape, (std::vector<int64_t>{16, 128}));
  EXPECT_EQ(d->stride, (std::vector<int64_t>{128, 1}));
}

TEST(DecodeTensorDescriptor, UnknownWrapperTypeIsRefusedByName) {
  auto d = DecodeTensorDescriptor(CpuShmDescriptor("pickled_evil"));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("pickled_evil"), std::string::npos);
  // A pickle (protocol 4 header) instead of a descriptor is malformed, never executed.
  EXPECT_FALSE(DecodeTensorDescriptor("\x80\x04\x95\x10\x00\x00\x00").ok());
}

TEST(DecodeRegisterKvCache, SevenFramesWithExtDescriptors) {
  std::string desc = CpuShmDescriptor();
  std::vector<std::string> f = {
      PackInt(123),
      Pack([&](Packer& pk) {
        pk.pack_array(2);
        for (int i = 0; i < 2; ++i) {
          pk.pack_ext(desc.size(), 1);
          pk.pack_ext_body(desc.data(), static_cast<uint32_t>(desc.size()));
        }
      }),
      Pack([](Packer& pk) { Str(pk, "llama"); }),
      PackInt(2),
      Pack([](Packer& pk) { Str(pk, "vllm"); }),
      Pack([](Packer& pk) { pk.pack_map(1); Str(pk, "kv_layout"); Str(pk, "NHD"); }),
      Pack([](Packer& pk) {
        pk.pack_array(1);
        pk.pack_map(2);
        Str(pk, "engine_group_id"); pk.pack_int64(0);
        Str(pk, "layer_indices"); pk.pack_array(2); pk.pack_int64(0); pk.pack_int64(1);
      }),
  };
  std::vector<std::string_view> v(f.begin(), f.end());
  auto r = DecodeRegisterKvCache(v);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->instance_id, 123);
  EXPECT_EQ(r->tensors.size(), 2u);
  EXPECT_EQ(r->engine_type, "vllm");
  EXPECT_EQ(*r->layout_hints.kv_layout, "NHD");
  ASSERT_EQ(r->group_infos.size(), 1u);
  EXPECT_EQ(r->group_infos[0].layer_indices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(r->group_infos[0].sw_size_tokens, -1);  // default filled
  // ext type 2 is not a device descriptor.
  f[1] = Pack([&](Packer& pk) {
    pk.pack_array(1);
    pk.pack_ext(desc.size(), 2);
    pk.pack_ext_body(desc.data(), static_cast<uint32_t>(desc.size()));
  });
  v.assign(f.begin(), f.end());
  EXPECT_FALSE(DecodeRegisterKvCache(v).ok());
}

TEST(Encoders, ExactBytes) {
  EXPECT_EQ(EncodeNil(), "\xc0");
  EXPECT_EQ(EncodeBool(true), "\xc3");
  EXPECT_EQ(EncodeBool(false), "\xc2");
  EXPECT_EQ(EncodeInt(256), std::string("\xcd\x01\x00", 3));
  EXPECT_EQ(EncodeStr("OK"), "\xa2OK");
  EXPECT_EQ(EncodeHandleAndOk("", true), std::string("\x92\xc4\x00\xc3", 4));
  EXPECT_EQ(EncodeStrList({}), "\x90");
  auto h = msgpack::unpack(EncodeRegisterEngineDrivenResponse("pool", 4096).data(),
                           EncodeRegisterEngineDrivenResponse("pool", 4096).size());
  auto m = h.get().as<std::map<std::string, msgpack::object>>();
  EXPECT_EQ(m.at("shm_name").as<std::string>(), "pool");
  EXPECT_EQ(m.at("pool_size").as<uint64_t>(), 4096u);
}

}  // namespace
}  // namespace kvd::wire
