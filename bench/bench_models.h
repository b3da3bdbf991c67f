// kvd-bench's models: KV tensors in POSIX shared memory (unlinked on every exit path),
// registered the way the lmcache CPU client registers them, and the request helpers the
// suites share. Header-only; the segment registry is process-wide (signal-safe cleanup).
#pragma once

#include "bench_client.h"

namespace kvd::bench {

// ---------------------------------------------------------------------------------------
// POSIX shared memory segments, unlinked on every exit path
// ---------------------------------------------------------------------------------------

constexpr int kMaxSegments = 8192;
inline char g_seg_names[kMaxSegments][64];
inline std::atomic<bool> g_seg_live[kMaxSegments];
inline std::atomic<int> g_seg_count{0};

inline void UnlinkAllSegments() {
  const int n = std::min(g_seg_count.load(), kMaxSegments);
  for (int i = 0; i < n; ++i) {
    if (g_seg_live[i].exchange(false)) shm_unlink(g_seg_names[i]);
  }
}

inline void OnFatalSignal(int sig) {
  UnlinkAllSegments();  // shm_unlink is async-signal-safe
  signal(sig, SIG_DFL);
  raise(sig);
}

class ShmSegment {
 public:
  ShmSegment() = default;
  explicit ShmSegment(size_t bytes) : size_(bytes) {
    slot_ = g_seg_count.fetch_add(1);
    if (slot_ >= kMaxSegments) throw BenchError("too many shared-memory segments");
    std::snprintf(g_seg_names[slot_], sizeof(g_seg_names[slot_]), "/kvdbench_%d_%d",
                  static_cast<int>(getpid()), slot_);
    name_ = g_seg_names[slot_];
    int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw BenchError("shm_open " + name_ + ": " + std::strerror(errno));
    g_seg_live[slot_].store(true);
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int e = errno;
      close(fd);
      Release();
      throw BenchError("ftruncate " + name_ + ": " + std::strerror(e));
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      int e = errno;
      Release();
      throw BenchError("mmap " + name_ + ": " + std::strerror(e));
    }
    ptr_ = static_cast<uint8_t*>(p);
  }
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept {
    if (this != &o) {
      Release();
      slot_ = std::exchange(o.slot_, -1);
      name_ = std::move(o.name_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~ShmSegment() { Release(); }

  void Release() {
    if (ptr_) munmap(ptr_, size_);
    ptr_ = nullptr;
    if (slot_ >= 0 && g_seg_live[slot_].exchange(false)) shm_unlink(name_.c_str());
    slot_ = -1;
  }
  uint8_t* data() const { return ptr_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  int slot_ = -1;
  std::string name_;
  uint8_t* ptr_ = nullptr;
  size_t size_ = 0;
};

inline void FillPattern(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t* w = reinterpret_cast<uint64_t*>(p);
  const size_t words = n / 8;
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < words; ++i) w[i] = x + i * 0xD1B54A32D192ED03ull;
  for (size_t i = words * 8; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i);
}

inline uint64_t Checksum(const uint8_t* p, size_t n) {
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  const size_t words = n / 8;
  uint64_t a = 1, b = 2, c = 3, d = 4;
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    a = (a ^ w[i]) * 0x100000001B3ull;
    b = (b ^ w[i + 1]) * 0x100000001B3ull;
    c = (c ^ w[i + 2]) * 0x100000001B3ull;
    d = (d ^ w[i + 3]) * 0x100000001B3ull;
  }
  for (; i < words; ++i) a = (a ^ w[i]) * 0x100000001B3ull;
  for (size_t k = words * 8; k < n; ++k) b = (b ^ p[k]) * 0x100000001B3ull;
  return a ^ (b << 1) ^ (c << 2) ^ (d << 3);
}

// ---------------------------------------------------------------------------------------
// Models: KV tensors in shared memory, registered the way the lmcache CPU client does
// ---------------------------------------------------------------------------------------

struct TensorSpec {
  std::vector<int64_t> shape;  // bf16, contiguous; shape[0] is the block dimension
                               // except for kv-first tensors (shape[1])
  int block_dim = 0;
};

struct ModelSpec {
  std::string name;        // model_name on the wire
  std::string label;       // name in the results
  int world_size = 1;      // TP ranks, each one worker (instance)
  int block_size = 16;     // tokens per vLLM block
  std::string kv_layout;   // layout_hints.kv_layout
  std::vector<TensorSpec> tensors;            // per rank, registration order
  std::vector<std::vector<int>> group_infos;  // layer indices per engine_group_info
                                              // (all of engine group 0)
  int64_t num_blocks = 0;

  int64_t TensorElems(const TensorSpec& t) const {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    return n;
  }
  // Bytes of one block of one tensor.
  int64_t BlockBytes(const TensorSpec& t) const {
    return TensorElems(t) * 2 / t.shape[t.block_dim];
  }
  // Bytes of one chunk object of one rank (what a STORE copies per chunk).
  int64_t ObjectBytes(int64_t chunk_tokens) const {
    int64_t sum = 0;
    for (const auto& t : tensors) sum += BlockBytes(t) * (chunk_tokens / block_size);
    return sum;
  }
  int64_t RankBufferBytes() const {
    int64_t sum = 0;
    for (const auto& t : tensors) sum += TensorElems(t) * 2;
    return sum;
  }
};

// Llama-3-8B-like: 32 layers x [2, NB, 16, 8, 128] bf16 (vLLM FlashAttention, NHD), TP1.
inline ModelSpec LlamaModel(int layers, int64_t num_blocks) {
  ModelSpec m;
  m.name = "kvdbench/llama-8b-like";
  m.label = "llama8b_tp1";
  m.world_size = 1;
  m.block_size = 16;
  m.kv_layout = "NHD";
  m.num_blocks = num_blocks;
  std::vector<int> all;
  for (int l = 0; l < layers; ++l) {
    m.tensors.push_back({{2, num_blocks, 16, 8, 128}, 1});
    all.push_back(l);
  }
  m.group_infos = {all};
  return m;
}

// MiniMax-M3-like, per rank at TP8 (vllm_side.md §3.4): 60 main K/V tensors
// [NB, 1, 128, 256] (one KV head, K|V packed) and 57 key-only indexer tensors
// [NB, 128, 128] for layers 3..59, interleaved in vLLM's layer order, block size 128.
// The lmcache client splits them into two group infos of engine group 0.
inline ModelSpec MiniMaxModel(int layers, int dense_layers, int tp, int64_t num_blocks) {
  ModelSpec m;
  m.name = "kvdbench/minimax-m3-like";
  m.label = "minimax_m3_tp" + std::to_string(tp);
  m.world_size = tp;
  m.block_size = 128;
  m.kv_layout = "HND";
  m.num_blocks = num_blocks;
  std::vector<int> main_idx, indexer_idx;
  for (int l = 0; l < layers; ++l) {
    main_idx.push_back(static_cast<int>(m.tensors.size()));
    m.tensors.push_back({{num_blocks, 1, 128, 256}, 0});
    if (l >= dense_layers) {
      indexer_idx.push_back(static_cast<int>(m.tensors.size()));
      m.tensors.push_back({{num_blocks, 128, 128}, 0});
    }
  }
  m.group_infos = {main_idx};
  if (!indexer_idx.empty()) m.group_infos.push_back(indexer_idx);
  return m;
}

// A tiny model: 1 layer [2, NB, 16, 1, head] bf16; an object is 2*256*head*2 bytes.
inline ModelSpec TinyModel(const std::string& name, int64_t head, int64_t num_blocks) {
  ModelSpec m;
  m.name = name;
  m.label = name;
  m.world_size = 1;
  m.block_size = 16;
  m.kv_layout = "NHD";
  m.num_blocks = num_blocks;
  m.tensors.push_back({{2, num_blocks, 16, 1, head}, 1});
  m.group_infos = {{0}};
  return m;
}

inline std::string PackTensorDescriptor(const ShmSegment& seg, const TensorSpec& t) {
  wire::TensorDescriptor d;
  d.dtype = "bfloat16";
  d.shape = t.shape;
  d.stride.assign(t.shape.size(), 1);
  for (int k = static_cast<int>(t.shape.size()) - 2; k >= 0; --k) {
    d.stride[k] = d.stride[k + 1] * t.shape[k + 1];
  }
  d.device_uuid = "cpu";
  d.shm_name = seg.name();
  d.nbytes = seg.size();
  return wire::EncodeCpuShmDescriptorExt(d);
}

// One TP rank: its KV tensors (one shm segment each, like the lmcache CPU client) and its
// own DEALER socket.
struct Worker {
  int rank = 0;
  int64_t instance_id = 0;
  std::vector<ShmSegment> segments;
  std::unique_ptr<Conn> conn;

  uint64_t BufferChecksum() const {
    uint64_t c = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      c ^= Checksum(segments[i].data(), segments[i].size()) * (2 * i + 1);
    }
    return c;
  }
};

struct Registered {
  ModelSpec model;
  std::vector<std::unique_ptr<Worker>> workers;
};

inline int64_t NewInstanceId() {
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(getpid()));
  return static_cast<int64_t>(rng() >> 2);
}

// Creates, fills and registers every rank's tensors. Throws on failure.
inline std::unique_ptr<Registered> RegisterModel(zmq::context_t& ctx, const std::string& url,
                                          const ModelSpec& m, double timeout_s) {
  auto reg = std::make_unique<Registered>();
  reg->model = m;
  for (int r = 0; r < m.world_size; ++r) {
    auto w = std::make_unique<Worker>();
    w->rank = r;
    w->instance_id = NewInstanceId();
    w->conn = std::make_unique<Conn>(ctx, url);
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      ShmSegment seg(static_cast<size_t>(m.TensorElems(m.tensors[t]) * 2));
      FillPattern(seg.data(), seg.size(), (static_cast<uint64_t>(r) << 32) + t + 1);
      w->segments.push_back(std::move(seg));
    }
    std::vector<std::string> ext;
    for (size_t t = 0; t < m.tensors.size(); ++t) {
      ext.push_back(PackTensorDescriptor(w->segments[t], m.tensors[t]));
    }
    const std::string descs = wire::EncodeArrayOf(ext);
    std::string groups = Pack([&](Packer& pk, msgpack::sbuffer&) {
      pk.pack_array(static_cast<uint32_t>(m.group_infos.size()));
      for (const auto& g : m.group_infos) {
        pk.pack_map(6);
        PackStr(pk, "engine_group_id");
        pk.pack_int64(0);
        PackStr(pk, "layer_indices");
        pk.pack_array(static_cast<uint32_t>(g.size()));
        for (int i : g) pk.pack_int64(i);
        PackStr(pk, "tokens_per_block");
        pk.pack_int64(0);
        PackStr(pk, "sw_size_tokens");
        pk.pack_int64(-1);
        PackStr(pk, "extra_object_group_tag");
        pk.pack_int64(0);
        PackStr(pk, "recurrent_state");
        pk.pack_false();
      }
    });
    std::string hints = Pack([&](Packer& pk, msgpack::sbuffer&) {
      pk.pack_map(1);
      PackStr(pk, "kv_layout");
      PackStr(pk, m.kv_layout);
    });
    const std::string p_inst = PackInt(w->instance_id), p_model = PackString(m.name),
                      p_ws = PackInt(m.world_size), p_engine = PackString("vllm");
    auto reply = w->conn->Call(op().register_kv_cache,
                               {p_inst, descs, p_model, p_ws, p_engine, hints, groups}, timeout_s);
    if (!reply) {
      throw BenchError("register_kv_cache of " + m.label + " rank " + std::to_string(r) +
                       ": no reply within " + std::to_string(timeout_s) + " s");
    }
    reg->workers.push_back(std::move(w));
  }
  return reg;
}

inline void UnregisterModel(Registered& reg, double timeout_s) {
  for (auto& w : reg.workers) {
    const std::string p = PackInt(w->instance_id);
    (void)w->conn->Call(op().unregister_kv_cache, {p}, timeout_s);
  }
  reg.workers.clear();  // unmaps and unlinks the segments
}

// A request's tokens: `n` distinct ids starting at `base` (< 2^32).
inline std::vector<int64_t> Tokens(int64_t base, int64_t n) {
  std::vector<int64_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (base + i) % 4000000000ll;
  return t;
}

inline uint64_t RunNonce() {
  static uint64_t nonce = (static_cast<uint64_t>(std::random_device{}()) << 16) ^
                          static_cast<uint64_t>(getpid()) ^
                          static_cast<uint64_t>(Now() * 1e6);
  return nonce;
}

inline std::string Hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "%" PRIx64, v);
  return b;
}

// LOOKUP then QUERY_PREFETCH_STATUS until non-nil. Returns hit chunks (or nullopt on
// timeout / bad reply); *polls counts the QUERY requests.
inline std::optional<int64_t> LookupAndWait(Conn& c, const std::string& key_frame,
                                     const std::string& tp_frame, const std::string& rid_frame,
                                     double timeout_s, int* polls, double* ack_s = nullptr) {
  const double t0 = Now();
  auto ack = c.Call(op().lookup, {key_frame, tp_frame}, timeout_s);
  if (!ack) return std::nullopt;
  if (ack_s) *ack_s = Now() - t0;
  const double deadline = Now() + timeout_s;
  int n = 0;
  for (;;) {
    auto r = c.Call(op().query_prefetch_status, {rid_frame}, timeout_s);
    ++n;
    if (!r) return std::nullopt;
    if (!IsNil(*r)) {
      if (polls) *polls = n;
      return AsInt(*r);
    }
    if (Now() > deadline) return std::nullopt;
    // Back off gently: the first re-polls are immediate, later ones sleep (vLLM polls once
    // per scheduler step).
    if (n > 2) std::this_thread::sleep_for(std::chrono::microseconds(std::min(n * 20, 1000)));
  }
}

}  // namespace kvd::bench
