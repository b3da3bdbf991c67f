// kvd-bench suite "hash": chained token-chunk hashing in-process.
#include "suites.h"

#include <time.h>

namespace kvd::bench {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs fn() for at least `secs` of this thread's CPU time (after one warm-up call); returns
// CPU seconds per call. CPU time, not wall time: on a shared machine the thread may wait
// for a core, which says nothing about the hash's speed per core.
template <typename Fn>
double SecondsPerCall(double secs, Fn fn) {
  fn();
  uint64_t reps = 0;
  const double t0 = ThreadCpuSeconds();
  double t1 = t0;
  do {
    fn();
    ++reps;
    if (reps % 4 == 0 || secs > 0) t1 = ThreadCpuSeconds();
  } while (t1 - t0 < secs);
  return (t1 - t0) / static_cast<double>(reps);
}

// The previous server code, for reference: one Blake3Hasher per chunk, fed prev and the
// tokens encoded byte by byte.
void HasherObjectChain(const std::vector<uint32_t>& tokens, size_t chunk, std::vector<keys::Hash32>* out) {
  keys::Hash32 prev = keys::NoneHash();
  std::vector<uint8_t> enc(chunk * 4);
  for (size_t c = 0; c + 1 <= tokens.size() / chunk; ++c) {
    keys::Blake3Hasher h;
    h.Update(prev.data(), prev.size());
    for (size_t i = 0; i < chunk; ++i) {
      const uint32_t v = tokens[c * chunk + i];
      enc[4 * i] = static_cast<uint8_t>(v >> 24);
      enc[4 * i + 1] = static_cast<uint8_t>(v >> 16);
      enc[4 * i + 2] = static_cast<uint8_t>(v >> 8);
      enc[4 * i + 3] = static_cast<uint8_t>(v);
    }
    h.Update(enc.data(), enc.size());
    prev = h.Finalize();
    (*out)[c] = prev;
  }
}

}  // namespace

// Per implementation: one chain (a request's chunks, as the server hashes them: the
// one-shot token-chunk hash of keys/token_hash.h), eight independent chains side by side
// (HashTokenChains: the same tokens cut into 8 requests), the previous per-chunk hasher
// object for reference, and plain BLAKE3 of 1 MiB. "Hash input" counts prev (32 bytes) and
// the 4-byte tokens of every chunk; rates are per second of the hashing thread's CPU time.
Json RunHash(const Options& o, int64_t chunk) {
  using kvd::keys::Blake3Impl;
  Json out = Json::Object();
  const Blake3Impl original = kvd::keys::Blake3ActiveImpl();
  out["active_impl"] = kvd::keys::Blake3ImplName(original);
  out["chunk_tokens"] = chunk;
  std::mt19937_64 rng(7);
  const size_t c = static_cast<size_t>(chunk);
  const size_t n_chunks = static_cast<size_t>(o.hash_tokens) / c / 8 * 8;  // 8 equal lanes
  std::vector<uint32_t> tokens(n_chunks * c);
  for (auto& t : tokens) t = static_cast<uint32_t>(rng() % 200000);
  std::vector<uint8_t> bulk(1 << 20);
  for (auto& b : bulk) b = static_cast<uint8_t>(rng());
  const double secs = o.quick ? 0.1 : 0.5;
  const double input_bytes = static_cast<double>(n_chunks) * (32.0 + 4.0 * static_cast<double>(c));
  std::vector<kvd::keys::Hash32> hashes(n_chunks), lane_hashes(n_chunks), ref(n_chunks);
  Json impls = Json::Array();
  // kAuto first: what the server runs (the best backend, with the one-chain kernel that
  // timed faster on this CPU), then each implementation forced.
  for (Blake3Impl impl : {Blake3Impl::kAuto, Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2}) {
    if (!kvd::keys::Blake3ImplSupported(impl)) continue;
    kvd::keys::SetBlake3ImplForTesting(impl);
    const double chain_s = SecondsPerCall(secs, [&] {
      kvd::keys::HashTokenChain(kvd::keys::NoneHash(), tokens, static_cast<uint32_t>(c), hashes);
    });
    std::vector<kvd::keys::TokenChainJob> jobs(8);
    const size_t per = n_chunks / 8;
    for (size_t j = 0; j < 8; ++j) {
      jobs[j] = {kvd::keys::NoneHash(), tokens.data() + j * per * c, per, lane_hashes.data() + j * per};
    }
    const double lanes_s = SecondsPerCall(secs, [&] { kvd::keys::HashTokenChains(jobs, static_cast<uint32_t>(c)); });
    const double object_s = SecondsPerCall(secs, [&] { HasherObjectChain(tokens, c, &ref); });
    if (ref != hashes) throw BenchError("one-shot chain hashes differ from the hasher object's");
    volatile uint8_t sink = 0;
    const double bulk_s = SecondsPerCall(secs, [&] {
      auto h = kvd::keys::Blake3(bulk.data(), bulk.size());
      sink = sink ^ h[0];
    });
    Json j = Json::Object();
    const std::string name = impl == Blake3Impl::kAuto
                                 ? "auto: " + kvd::keys::TokenChainDescription()
                                 : std::string(kvd::keys::Blake3ImplName(impl));
    j["impl"] = name;
    j["active"] = impl == Blake3Impl::kAuto;
    j["chain_tokens_per_s"] = static_cast<double>(tokens.size()) / chain_s;
    j["chain_input_gbps"] = input_bytes / chain_s / kGB;
    j["chain_ns_per_chunk"] = chain_s / static_cast<double>(n_chunks) * 1e9;
    j["lanes"] = static_cast<int64_t>(kvd::keys::TokenChainLanes());
    j["lanes8_input_gbps"] = input_bytes / lanes_s / kGB;
    j["hasher_object_input_gbps"] = input_bytes / object_s / kGB;
    j["bulk_1mib_gbps"] = static_cast<double>(bulk.size()) / bulk_s / kGB;
    Log("hash %s one chain: %.1f M tokens/s, %.2f GB/s of hash input (%.0f ns/chunk); 8 "
        "chains (%zu lanes): %.2f GB/s; hasher object per chunk: %.2f GB/s; bulk 1 MiB: %.2f GB/s",
        name.c_str(), static_cast<double>(tokens.size()) / chain_s / 1e6,
        input_bytes / chain_s / kGB, chain_s / static_cast<double>(n_chunks) * 1e9,
        kvd::keys::TokenChainLanes(), input_bytes / lanes_s / kGB, input_bytes / object_s / kGB,
        static_cast<double>(bulk.size()) / bulk_s / kGB);
    impls.push_back(std::move(j));
    if (impl == Blake3Impl::kAuto && o.quick) break;
  }
  kvd::keys::SetBlake3ImplForTesting(Blake3Impl::kAuto);
  out["tokens"] = static_cast<int64_t>(tokens.size());
  out["impls"] = std::move(impls);
  return out;
}

}  // namespace kvd::bench
