// kvd-first-touch-bench: what a copy into fresh memory costs on this machine, without kvd.
//
// The reference for the data suite's "first STORE into a fresh L1" (issue 12): kvd's L1 is
// a shared-memory segment whose pages its populator maps ahead of use with
// MADV_POPULATE_WRITE. This program does the same to a fresh segment of --gib GiB
// (MAP_SHARED | MAP_ANONYMOUS, as tmpfs backs kvd's pool), then copies a source buffer into
// it --passes times with --threads threads, and reports each step's GB/s and the minor
// faults it took. On bare metal the first pass after population runs as fast as the later
// ones (no fault is left); where it does not, the difference is outside the process: the
// pages are mapped, yet the first writes are slow (a hypervisor that backs guest memory on
// first use, or reworks it afterwards).
//
//   build/kvd-first-touch-bench [--gib 3] [--passes 3] [--threads 2] [--rounds 2]
//                               [--wait-seconds 0] [--prefill] [--distinct-pages]
//
// --prefill also writes every byte of the segment once (memset) after population, before
// the timed copies; --distinct-pages writes a different word into every 4 KiB page then (no
// two pages alike, so no content-based page sharing can apply). Each round uses a fresh
// segment.
#include <CLI/CLI.hpp>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

long MinorFaults() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_minflt;
}

// Runs fn(begin, end) over [0, n) split into `threads` parts, one thread each.
template <typename Fn>
void Split(size_t n, int threads, Fn fn) {
  std::vector<std::thread> ts;
  const size_t part = (n / static_cast<size_t>(threads) + 4095) & ~size_t{4095};
  for (int t = 0; t < threads; ++t) {
    const size_t b = std::min(n, part * static_cast<size_t>(t));
    const size_t e = std::min(n, b + part);
    ts.emplace_back([=] { fn(b, e); });
  }
  for (auto& t : ts) t.join();
}

struct Step {
  double gbps;
  long faults;
};

template <typename Fn>
Step Timed(size_t n, Fn fn) {
  const long f0 = MinorFaults();
  const double t0 = Now();
  fn();
  const double t1 = Now();
  return {static_cast<double>(n) / (t1 - t0) / 1e9, MinorFaults() - f0};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvd-first-touch-bench: copies into freshly populated shared memory, pass by pass"};
  double gib = 3;
  int passes = 3, threads = 2, rounds = 2, wait_seconds = 0;
  bool prefill = false, distinct = false;
  app.add_option("--gib", gib, "Segment size in GiB")->check(CLI::Range(0.01, 1024.0));
  app.add_option("--passes", passes, "Timed copies into the segment")->check(CLI::Range(1, 100));
  app.add_option("--threads", threads, "Copy threads")->check(CLI::Range(1, 256));
  app.add_option("--rounds", rounds, "Fresh segments, one after the other")->check(CLI::Range(1, 100));
  app.add_option("--wait-seconds", wait_seconds, "Sleep between population and the first copy")
      ->check(CLI::Range(0, 3600));
  app.add_flag("--prefill", prefill, "Write every byte once after population, before the copies");
  app.add_flag("--distinct-pages", distinct,
               "Write a different word into every page after population, before the copies");
  CLI11_PARSE(app, argc, argv);

  const size_t n = static_cast<size_t>(gib * 1024 * 1024 * 1024) & ~size_t{4095};
  // The source: private memory written twice, so its own first touch is not in the copies.
  auto* src = static_cast<uint8_t*>(
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (src == MAP_FAILED) {
    std::perror("mmap source");
    return 1;
  }
  for (int k = 0; k < 2; ++k) {
    Split(n, threads, [&](size_t b, size_t e) { std::memset(src + b, 0x5a + k, e - b); });
  }
  std::printf("%.2f GiB, %d thread(s), %d pass(es) per fresh segment%s%s\n", gib, threads, passes,
              prefill ? ", prefilled" : "", distinct ? ", distinct pages" : "");
  for (int round = 1; round <= rounds; ++round) {
    auto* dst = static_cast<uint8_t*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (dst == MAP_FAILED) {
      std::perror("mmap segment");
      return 1;
    }
    const Step pop = Timed(n, [&] {
      if (madvise(dst, n, MADV_POPULATE_WRITE) != 0) std::perror("madvise(MADV_POPULATE_WRITE)");
    });
    std::printf("round %d: populate %.2f GB/s (%ld faults)", round, pop.gbps, pop.faults);
    if (prefill) {
      const Step fill = Timed(n, [&] {
        Split(n, threads, [&](size_t b, size_t e) { std::memset(dst + b, 0, e - b); });
      });
      std::printf("; prefill %.2f GB/s (%ld faults)", fill.gbps, fill.faults);
    }
    if (distinct) {
      for (size_t off = 0; off < n; off += 4096) {
        const uint64_t word = off + 1;
        std::memcpy(dst + off, &word, sizeof(word));
      }
    }
    if (wait_seconds > 0) sleep(static_cast<unsigned>(wait_seconds));
    for (int p = 1; p <= passes; ++p) {
      const Step copy = Timed(n, [&] {
        Split(n, threads, [&](size_t b, size_t e) { std::memcpy(dst + b, src + b, e - b); });
      });
      std::printf("; copy %d %.2f GB/s (%ld faults)", p, copy.gbps, copy.faults);
    }
    std::printf("\n");
    std::fflush(stdout);
    munmap(dst, n);
  }
  munmap(src, n);
  return 0;
}
