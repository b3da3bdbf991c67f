// Replays saved inputs of one fuzz target as a unit test: every file under
// tests/fuzz/regressions/<target>/ (inputs that once crashed kvd or broke an invariant,
// kept after the fix) is fed to the target's LLVMFuzzerTestOneInput. Built without libFuzzer
// in the normal build (and so also under ASan/UBSan and TSan with `make test-asan` /
// `make test-tsan`). A regression that comes back aborts this test.
//
// Each input runs in a forked child, which also checks the one thing libFuzzer flags that
// a plain run would not: memory. An input may not grow the child's peak virtual memory by
// more than kMaxVmGrowth (a 6-byte msgpack array header once made the decoder allocate
// 512 MiB; see the oom-* inputs).
//
// KVD_FUZZ_TARGET (the target's name) and KVD_FUZZ_REGRESSIONS (its directory) come from
// CMake; KVD_FUZZ_REPLAY_DIR in the environment adds one more directory (e.g. a corpus).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

constexpr long kMaxVmGrowthKiB = 256 * 1024;

// VmPeak of this process in KiB (0 if unknown).
long VmPeakKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmPeak:", 0) == 0) return std::strtol(line.c_str() + 7, nullptr, 10);
  }
  return 0;
}

// Runs one input in a child: exit 0 ok, 3 too much memory; a crash shows as a signal.
int RunInChild(const std::string& bytes) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    long before = VmPeakKiB();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    long grown = VmPeakKiB() - before;
    if (grown > kMaxVmGrowthKiB) {
      std::fprintf(stderr, "input grew peak virtual memory by %ld MiB\n", grown / 1024);
      std::exit(3);
    }
    std::exit(0);  // (not _exit: the target's atexit cleanup, e.g. shm_unlink, must run)
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

std::vector<std::filesystem::path> Inputs(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Replay(const std::vector<std::filesystem::path>& files) {
  for (const auto& f : files) {
    SCOPED_TRACE(f.string());
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    int status = RunInChild(bytes);
    EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 0) << "(3: used too much memory)";
    }
  }
}

TEST(FuzzReplay, Regressions) {
  auto files = Inputs(KVD_FUZZ_REGRESSIONS);
  std::printf("replaying %zu saved input(s) of fuzz target '%s'\n", files.size(), KVD_FUZZ_TARGET);
  Replay(files);
}

TEST(FuzzReplay, ExtraDirectory) {
  const char* dir = std::getenv("KVD_FUZZ_REPLAY_DIR");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "KVD_FUZZ_REPLAY_DIR not set";
  Replay(Inputs(std::filesystem::path(dir) / KVD_FUZZ_TARGET));
}

}  // namespace
