// Golden frames captured from the real lmcache 0.5.6 client (tests/wire_golden/*.json,
// see its README): every request decodes with kvd's codec, field values match what the
// capture scenario sent, and kvd's encoders produce the reference server's reply bytes
// where the reply does not depend on state (ints, bools, strings, [handle, ok] shapes).
#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "wire/codec.h"

namespace kvd::wire {
namespace {

namespace fs = std::filesystem;

struct Golden {
  std::string name;
  std::string op;
  std::vector<std::string> request;   // [uid, op, payload...]
  std::vector<std::string> response;  // [uid, op(, reply)]
};

std::string Unhex(const std::string& h) {
  std::string out(h.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::vector<Golden> LoadAll() {
  std::vector<Golden> all;
  fs::path dir = fs::path(KVD_SOURCE_DIR) / "tests" / "wire_golden";
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".json" || e.path().stem() == "summary") continue;
    std::ifstream in(e.path());
    auto j = nlohmann::json::parse(in);
    Golden g;
    g.name = e.path().stem().string();
    g.op = j.at("op").get<std::string>();
    for (const auto& h : j.at("request_frames_hex")) g.request.push_back(Unhex(h.get<std::string>()));
    for (const auto& h : j.at("response_frames_hex")) g.response.push_back(Unhex(h.get<std::string>()));
    all.push_back(std::move(g));
  }
  std::sort(all.begin(), all.end(), [](const Golden& a, const Golden& b) { return a.name < b.name; });
  return all;
}

const Golden& Find(const std::vector<Golden>& all, const std::string& name) {
  for (const auto& g : all) {
    if (g.name == name) return g;
  }
  static Golden none;
  ADD_FAILURE() << "no golden file " << name;
  return none;
}

std::vector<std::string_view> Payloads(const Golden& g) {
  return std::vector<std::string_view>(g.request.begin() + 2, g.request.end());
}

TEST(Golden, CoversEveryOpOfANormalServeFlow) {
  auto all = LoadAll();
  std::set<std::string> ops;
  for (const auto& g : all) ops.insert(g.op);
  for (const char* want :
       {"get_chunk_size", "ping", "noop", "clear", "register_kv_cache", "unregister_kv_cache",
        "store", "retrieve", "lookup", "query_prefetch_status", "wait_prefetch_status",
        "free_lookup_locks", "end_session", "report_block_allocation", "get_experimental",
        "register_kv_cache_engine_driven_context", "unregister_kv_cache_engine_driven_context",
        "prepare_store", "commit_store", "prepare_retrieve", "commit_retrieve"}) {
    EXPECT_TRUE(ops.count(want)) << "missing golden exchange for " << want;
  }
}

TEST(Golden, EveryOpFrameDecodesToTheRecordedOp) {
  for (const auto& g : LoadAll()) {
    ASSERT_GE(g.request.size(), 2u) << g.name;
    auto op = DecodeOp(g.request[1]);
    ASSERT_TRUE(op.ok()) << g.name << ": " << op.status().ToString();
    EXPECT_EQ((*op)->name, g.op) << g.name;
    // The reference echoes uid and op byte for byte; so does kvd (tested in server_tests).
    ASSERT_GE(g.response.size(), 2u) << g.name;
    EXPECT_EQ(g.response[0], g.request[0]) << g.name;
    EXPECT_EQ(g.response[1], g.request[1]) << g.name;
    EXPECT_GE(g.request.size() - 2, (*op)->min_payloads) << g.name;
    EXPECT_LE(g.request.size() - 2, (*op)->max_payloads) << g.name;
  }
}

TEST(Golden, EveryRequestPayloadDecodes) {
  for (const auto& g : LoadAll()) {
    auto op = DecodeOp(g.request[1]);
    ASSERT_TRUE(op.ok());
    auto p = Payloads(g);
    Status st;
    switch ((*op)->op) {
      case Op::kRegisterKvCache: st = DecodeRegisterKvCache(p).status(); break;
      case Op::kUnregisterKvCache:
      case Op::kUnregisterEngineDrivenContext: st = DecodeInstanceId(p).status(); break;
      case Op::kStore: st = DecodeStore(p).status(); break;
      case Op::kRetrieve: st = DecodeRetrieve(p).status(); break;
      case Op::kLookup:
      case Op::kFreeLookupLocks: st = DecodeLookup(p).status(); break;
      case Op::kQueryPrefetchStatus:
      case Op::kEndSession: st = DecodeRequestId(p).status(); break;
      case Op::kWaitPrefetchStatus: st = DecodeWaitPrefetch(p).status(); break;
      case Op::kPing: st = DecodePing(p).status(); break;
      case Op::kClear: st = DecodeClear(p).status(); break;
      case Op::kRegisterEngineDrivenContext: st = DecodeRegisterEngineDriven(p).status(); break;
      case Op::kPrepareStore:
      case Op::kCommitStore:
      case Op::kPrepareRetrieve:
      case Op::kCommitRetrieve: st = DecodeEngineDriven(p).status(); break;
      case Op::kReportBlockAllocation: st = DecodeReportBlockAllocation(p).status(); break;
      case Op::kGetChunkSize:
      case Op::kNoop:
      case Op::kGetExperimental: EXPECT_TRUE(p.empty()) << g.name; break;
      default: ADD_FAILURE() << g.name << ": op " << (*op)->name << " not expected in a serve flow";
    }
    EXPECT_TRUE(st.ok()) << g.name << ": " << st.ToString();
  }
}

TEST(Golden, StoreAndRegisterFieldsMatchTheCapture) {
  auto all = LoadAll();
  auto store = DecodeStore(Payloads(Find(all, "store")));
  ASSERT_TRUE(store.ok());
  // TP=2 worker store of a 2-chunk prompt (+10 tokens) with 16-token blocks.
  EXPECT_EQ(store->key.model_name, "golden-model");
  EXPECT_EQ(store->key.world_size, 2);
  ASSERT_TRUE(store->key.worker_id.has_value());
  EXPECT_EQ(store->key.start % 256, 0);
  EXPECT_EQ(store->key.end, 512);
  EXPECT_EQ(store->key.token_ids.size(), 522u);
  EXPECT_GE(store->key.num_kv_readers, 1);
  ASSERT_EQ(store->block_ids.size(), 1u);
  EXPECT_EQ(store->block_ids[0].size(), 32u);
  auto reg = DecodeRegisterKvCache(Payloads(Find(all, "register_kv_cache")));
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->model_name, "golden-model");
  EXPECT_EQ(reg->engine_type, "vllm");
  ASSERT_EQ(reg->tensors.size(), 2u);
  for (const auto& t : reg->tensors) {
    EXPECT_EQ(t.memory, TensorMemory::kCpuShm);
    EXPECT_EQ(t.dtype, "bfloat16");
    EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 72, 16, 2, 64}));
    EXPECT_EQ(t.device_uuid, "cpu");
    EXPECT_EQ(t.shm_name.rfind("/lmcache_kv_", 0), 0u) << t.shm_name;
  }
  auto lookup = DecodeLookup(Payloads(Find(all, "lookup")));
  ASSERT_TRUE(lookup.ok());
  EXPECT_FALSE(lookup->key.worker_id.has_value());
  auto ed = DecodeRegisterEngineDriven(Payloads(Find(all, "register_kv_cache_engine_driven_context")));
  ASSERT_TRUE(ed.ok()) << ed.status().ToString();
  EXPECT_EQ(ed->dtype_str, "bfloat16");
  EXPECT_TRUE(ed->num_physical_slots.has_value());
}

TEST(Golden, KvdRepliesMatchTheReferenceWhereStateless) {
  auto all = LoadAll();
  EXPECT_EQ(Find(all, "get_chunk_size").response.at(2), EncodeInt(256));
  EXPECT_EQ(Find(all, "noop").response.at(2), EncodeStr("OK"));
  EXPECT_EQ(Find(all, "ping").response.at(2), EncodeBool(true));
  EXPECT_EQ(Find(all, "query_prefetch_status__unknown").response.at(2), EncodeInt(0));
  EXPECT_EQ(Find(all, "query_prefetch_status").response.at(2), EncodeInt(2));
  EXPECT_EQ(Find(all, "commit_store").response.at(2), EncodeBool(true));
  // [event handle, ok]: same shape; kvd sends an empty handle (no device work), the
  // reference its CPU stub handle. The 0.5.6 client accepts both.
  auto store_ref = msgpack::unpack(Find(all, "store").response.at(2).data(), Find(all, "store").response.at(2).size());
  auto store_kvd = msgpack::unpack(EncodeHandleAndOk("", true).data(), EncodeHandleAndOk("", true).size());
  ASSERT_EQ(store_ref.get().type, msgpack::type::ARRAY);
  ASSERT_EQ(store_ref.get().via.array.size, 2u);
  EXPECT_EQ(store_ref.get().via.array.ptr[0].type, store_kvd.get().via.array.ptr[0].type);
  EXPECT_EQ(store_ref.get().via.array.ptr[1].via.boolean, true);
  // PREPARE_RETRIEVE miss: the reference's exact bytes.
  EXPECT_EQ(Find(all, "prepare_retrieve__miss").response.at(2), EncodePrepareRetrieveResponse(false, {}));
  // PREPARE_STORE when everything is cached: {"context": {"slots": [], "chunk_indices": []}}.
  EXPECT_EQ(Find(all, "prepare_store__all_cached").response.at(2),
            EncodePrepareStoreResponse(std::vector<ShmSlot>{}, {}));
  // The engine-driven registration response map has exactly these keys.
  const auto& reg = Find(all, "register_kv_cache_engine_driven_context").response.at(2);
  auto h = msgpack::unpack(reg.data(), reg.size());
  auto m = h.get().as<std::map<std::string, msgpack::object>>();
  EXPECT_EQ(m.size(), 2u);
  EXPECT_TRUE(m.count("shm_name"));
  EXPECT_TRUE(m.count("pool_size"));
}

TEST(Golden, PrepareStoreSlotFieldsMatchKvdEncoding) {
  auto all = LoadAll();
  const auto& r = Find(all, "prepare_store").response.at(2);
  auto h = msgpack::unpack(r.data(), r.size());
  auto top = h.get().as<std::map<std::string, msgpack::object>>();
  auto ctx = top.at("context").as<std::map<std::string, msgpack::object>>();
  auto slots = ctx.at("slots").as<std::vector<std::map<std::string, msgpack::object>>>();
  ASSERT_FALSE(slots.empty());
  std::set<std::string> keys;
  for (const auto& [k, v] : slots[0]) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"offset", "length", "shape", "dtype"}));
  auto idx = ctx.at("chunk_indices").as<std::vector<int64_t>>();
  EXPECT_EQ(idx.size(), slots.size());
  EXPECT_EQ(idx[0], 0);
}

}  // namespace
}  // namespace kvd::wire
