// Fuzz target "request": the frame envelope and op dispatch, down into the handlers.
//
// Each input is a sequence of ZMQ messages [uid, op, payload...] (format: fuzz_common.h).
// Every message goes through what ZmqServer::OnRequest does with it — frame-count check,
// wire::DecodeOp, server::HandleRequest — against one KvService per input with a tiny L1
// (16 objects), so stores evict, lookups lock, retrieves copy into real shared memory and
// engine-driven prepares hand out slots. A message that is a single frame starting with 't'
// advances the service's fake clock by data[1] seconds and runs Maintain() (TTL expiry,
// reaping, watermark eviction).
//
// Invariants checked beyond "no crash, no sanitizer report": every request gets exactly one
// reply frame that is one well-formed msgpack document, and L1 never reports more bytes in
// use than it has. CacheBlend's ops, which HandleRequest does not serve yet, also go through
// their wire decoders (fuzz_common.h: CheckBlendDecoders) and those decoders' invariants.
//
// Registered up front (so store/retrieve frames can reach the copy path): model "fz",
// instances 1 (world size 1) and 2, 3 (world size 2, ranks 0 and 1), each over its own
// shared-memory segment "/kvd_fuzz_kv_<id>" (no two instances may map one segment; 2 layers
// of [2, 16, 16, 1, 8] bf16; 16-token blocks, 32-token chunks), and engine-driven instance
// 9 (world size 1). "/kvd_fuzz_kv_5" is left free for inputs that register an instance.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>

#include "common/clock.h"
#include "fuzz_common.h"
#include "server/handlers.h"
#include "server/kv_service.h"
#include "wire/codec.h"

namespace kvd::fuzz {
namespace {

constexpr int64_t kChunk = 32, kBlock = 16, kBlocks = 16, kHeads = 1, kHead = 8, kLayers = 2;
constexpr int64_t kPlane = kBlocks * kBlock * kHeads * kHead;  // elements per K or V plane
constexpr int64_t kLayerElems = 2 * kPlane;
constexpr uint64_t kSegmentBytes = kLayerElems * 2 * kLayers;   // bf16
// Instances 1..3, and a free one that inputs may register (make_seeds.py: instance 5).
constexpr const char* kSegments[] = {"/kvd_fuzz_kv_1", "/kvd_fuzz_kv_2", "/kvd_fuzz_kv_3",
                                     "/kvd_fuzz_kv_5"};

// The worker-side KV segments (one per lmcache-driven instance), created once per process
// and unlinked at exit.
struct Segments {
  Segments() {
    for (const char* name : kSegments) {
      int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
      Check(fd >= 0, "shm_open /kvd_fuzz_kv_<id>");
      Check(ftruncate(fd, kSegmentBytes) == 0, "ftruncate /kvd_fuzz_kv_<id>");
      close(fd);
    }
    std::atexit([] {
      for (const char* name : kSegments) shm_unlink(name);
    });
  }
};

wire::RegisterKvCacheRequest Registration(int64_t id, int64_t world_size) {
  wire::RegisterKvCacheRequest r;
  r.instance_id = id;
  r.model_name = "fz";
  r.world_size = world_size;
  r.engine_type = "vllm";
  r.layout_hints.kv_layout = "NHD";
  for (int64_t l = 0; l < kLayers; ++l) {
    wire::TensorDescriptor t;
    t.dtype = "bfloat16";
    t.shape = {2, kBlocks, kBlock, kHeads, kHead};
    t.stride = {kPlane, kBlock * kHeads * kHead, kHeads * kHead, kHead, 1};
    t.storage_offset = l * kLayerElems;
    t.shm_name = kSegments[id - 1];
    t.nbytes = kSegmentBytes;
    t.device_uuid = "cpu";
    r.tensors.push_back(t);
  }
  return r;
}

server::ServerConfig Config() {
  server::ServerConfig c;
  c.host = "127.0.0.1";
  c.chunk_size = kChunk;
  c.l1_size_gb = 64.0 / (1024.0 * 1024.0);  // 64 KiB: 16 objects of 2 KiB (4 KiB aligned)
  c.eviction_policy = "LRU";
  c.l1_read_ttl_seconds = 30;
  c.l1_write_ttl_seconds = 60;
  c.worker_reap_timeout_seconds = 120;
  c.session_ttl_seconds = 100;
  c.shm_name = "";  // anonymous L1: nothing left in /dev/shm if the fuzzer dies
  return c;
}

}  // namespace
}  // namespace kvd::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvd;
  using namespace kvd::fuzz;
  static Segments segments;
  static bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;

  FakeClock clock;
  auto created = server::KvService::Create(Config(), &clock);
  Check(created.ok(), "KvService::Create");
  std::unique_ptr<server::KvService> svc = std::move(created).value();
  Check(svc->RegisterKvCache(Registration(1, 1)).ok(), "register instance 1");
  Check(svc->RegisterKvCache(Registration(2, 2)).ok(), "register instance 2");
  Check(svc->RegisterKvCache(Registration(3, 2)).ok(), "register instance 3");
  wire::RegisterEngineDrivenRequest ed;
  ed.instance_id = 9;
  ed.model_name = "fz";
  ed.world_size = 1;
  ed.block_size = kBlock;
  ed.num_layers = kLayers;
  ed.hidden_dim_size = kHeads * kHead;
  ed.dtype_str = "bfloat16";
  Check(svc->RegisterEngineDriven(ed).ok(), "register engine-driven instance 9");

  for (const Message& m : ParseInput(data, size)) {
    if (m.size() == 1 && !m[0].empty() && m[0][0] == 't') {
      clock.AdvanceSeconds(m[0].size() > 1 ? static_cast<uint8_t>(m[0][1]) : 1);
      svc->Maintain();
      continue;
    }
    // ZmqServer drops messages without [uid, op] (it never replies to them).
    if (m.size() < 2) continue;
    std::string reply;
    auto op = wire::DecodeOp(m[1]);
    if (!op.ok()) {
      reply = wire::EncodeNil();
    } else {
      wire::Frames payloads(m.data() + 2, m.size() - 2);
      reply = server::HandleRequest(*svc, **op, payloads, "fuzz");
      // CacheBlend ops: the server answers them as unsupported for now; decode them here.
      CheckBlendDecoders(payloads, *op);
    }
    Check(IsOneMsgpackDocument(reply), "reply is exactly one msgpack document");
    l1::L1Stats st = svc->l1_stats();
    Check(st.used_bytes <= st.capacity_bytes, "L1 used bytes within capacity");
  }
  clock.AdvanceSeconds(1000);
  svc->Maintain();
  return 0;
}
