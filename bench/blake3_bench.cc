// Standalone throughput benchmark for kvd's BLAKE3 and the chained token-chunk
// hasher, for every BLAKE3 implementation the CPU supports. Not part of the CMake
// build; build by hand, e.g.
//   g++ -std=c++20 -O3 -Isrc bench/blake3_bench.cc src/keys/*.cc src/common/status.cc -o /tmp/blake3_bench
// Usage: blake3_bench [MiB]   (default 256)
// Single-threaded; owns all its buffers.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "keys/blake3.h"
#include "keys/chunk_hasher.h"

namespace {

using kvd::keys::Blake3Impl;
using Clock = std::chrono::steady_clock;

// Runs fn() `reps` times and returns the best wall time in seconds.
template <typename Fn>
double BestSeconds(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s < best) best = s;
  }
  return best;
}

volatile uint8_t g_sink;

}  // namespace

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const size_t total = mib << 20;
  std::vector<uint8_t> data(total);
  for (size_t i = 0; i < total; ++i) data[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  std::vector<int64_t> tokens(total / 4);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 7919 + 13) % 128256);

  std::printf("input %zu MiB, auto impl: %s\n", mib, kvd::keys::Blake3ImplName(kvd::keys::Blake3ActiveImpl()));
  for (Blake3Impl impl : {Blake3Impl::kPortable, Blake3Impl::kSse41, Blake3Impl::kAvx2}) {
    if (!kvd::keys::SetBlake3ImplForTesting(impl)) continue;
    const char* name = kvd::keys::Blake3ImplName(impl);
    const double gb = static_cast<double>(total) / 1e9;

    for (size_t piece : {size_t{1} << 20, size_t{1} << 10}) {
      double s = BestSeconds(3, [&] {
        for (size_t off = 0; off < total; off += piece) g_sink = kvd::keys::Blake3(data.data() + off, piece)[0];
      });
      std::printf("%-9s blake3 one-shot, %7zu-byte pieces: %6.2f GB/s\n", name, piece, gb / s);
    }
    double s = BestSeconds(3, [&] {
      kvd::keys::Blake3Hasher h;
      for (size_t off = 0; off < total; off += 1 << 20) h.Update(data.data() + off, 1 << 20);
      g_sink = h.Finalize()[0];
    });
    std::printf("%-9s blake3 streaming 1 MiB updates:      %6.2f GB/s\n", name, gb / s);

    for (uint32_t chunk_size : {256u, 16u}) {
      std::vector<kvd::keys::Hash32> out;
      out.reserve(tokens.size() / chunk_size);
      s = BestSeconds(3, [&] {
        out.clear();
        if (!kvd::keys::AppendChainedChunkHashes(tokens, chunk_size, 0, kvd::keys::NoneHash(), &out).ok()) {
          std::abort();
        }
      });
      std::printf("%-9s chunk hasher C=%-3u: %6.2f M tokens/s (%5.2f GB/s of token bytes, %.0f ns/chunk)\n",
                  name, chunk_size, static_cast<double>(tokens.size()) / s / 1e6,
                  static_cast<double>(tokens.size()) * 4 / s / 1e9, s / static_cast<double>(out.size()) * 1e9);
    }
  }
  return 0;
}
