#include "cli/stale_segments.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <vector>

namespace kvd::cli {
namespace {

constexpr std::string_view kPrefix = "kvd_l1_pool_";

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// True when process `pid` exists and is a kvd.
bool IsLiveKvd(const std::string& proc_dir, std::string_view pid) {
  std::ifstream comm(proc_dir + "/" + std::string(pid) + "/comm");
  std::string name;
  return std::getline(comm, name) && name == "kvd";
}

// True when some process maps `path` (a line of its maps ends with it, or with it + " (deleted)").
bool MappedByAnyProcess(const std::string& proc_dir, const std::string& path) {
  std::error_code ec;
  for (const auto& dir : std::filesystem::directory_iterator(proc_dir, ec)) {
    const std::string pid = dir.path().filename().string();
    if (!AllDigits(pid)) continue;
    std::ifstream maps(dir.path() / "maps");
    for (std::string line; std::getline(maps, line);) {
      const size_t at = line.find(path);
      if (at == std::string::npos) continue;
      const size_t end = at + path.size();
      if (end == line.size() || line[end] == ' ') return true;
    }
  }
  return false;
}

}  // namespace

Reclaimed ReclaimDeadKvdSegments(const std::string& shm_dir, const std::string& proc_dir) {
  Reclaimed out;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(shm_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > kPrefix.size() && name.compare(0, kPrefix.size(), kPrefix) == 0 &&
        AllDigits(std::string_view(name).substr(kPrefix.size()))) {
      names.push_back(name);
    }
  }
  for (const auto& name : names) {
    const std::string pid = name.substr(kPrefix.size());
    const std::string path = shm_dir + "/" + name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (IsLiveKvd(proc_dir, pid) || MappedByAnyProcess(proc_dir, path)) continue;
    if (::unlink(path.c_str()) != 0) continue;
    out.segments++;
    out.bytes += static_cast<uint64_t>(st.st_blocks) * 512;  // resident bytes, not the size
  }
  if (out.segments > 0) {
    spdlog::info("removed {} L1 segment(s) left in {} by kvd processes that are gone ({:.2f} GiB "
                 "of memory freed)", out.segments, shm_dir, static_cast<double>(out.bytes) / (1ull << 30));
  }
  return out;
}

}  // namespace kvd::cli
