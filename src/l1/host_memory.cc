#include "l1/host_memory.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace kvd::l1 {
namespace {

std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::optional<int64_t> ParseInt(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<int64_t> ReadInt(const std::string& path) {
  auto t = ReadText(path);
  return t ? ParseInt(*t) : std::nullopt;
}

// "Key:   123 kB" -> bytes.
std::optional<uint64_t> MemInfoField(std::string_view text, std::string_view key) {
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    if (line.size() <= key.size() || line.substr(0, key.size()) != key || line[key.size()] != ':') {
      continue;
    }
    line.remove_prefix(key.size() + 1);
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    const size_t sp = line.find(' ');
    auto v = ParseInt(line.substr(0, sp));
    if (!v || *v < 0) return std::nullopt;
    const bool kb = sp != std::string_view::npos && line.substr(sp + 1) == "kB";
    return static_cast<uint64_t>(*v) * (kb ? 1024 : 1);
  }
  return std::nullopt;
}

// Limits at or above this mean "none" (v1 reports 2^63 rounded down to a page).
constexpr uint64_t kNoLimit = uint64_t{1} << 62;

}  // namespace

std::string ParseSysfsChoice(std::string_view text) {
  const size_t open = text.find('[');
  const size_t close = text.find(']', open == std::string_view::npos ? 0 : open);
  if (open == std::string_view::npos || close == std::string_view::npos) return "";
  return std::string(text.substr(open + 1, close - open - 1));
}

HugePageInfo ReadHugePageInfo() {
  HugePageInfo info;
  const std::string base = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  if (auto v = ReadInt(base + "nr_hugepages")) info.total_2m_pages = *v;
  // Free pages that other mappings have reserved (mapped, not yet faulted) are not ours.
  if (auto v = ReadInt(base + "free_hugepages")) {
    info.free_2m_pages = std::max<int64_t>(0, *v - ReadInt(base + "resv_hugepages").value_or(0));
  }
  if (auto t = ReadText("/sys/kernel/mm/transparent_hugepage/enabled")) {
    info.thp_enabled = ParseSysfsChoice(*t);
  }
  return info;
}

std::optional<MemoryRoom> ParseMemInfo(std::string_view meminfo) {
  auto total = MemInfoField(meminfo, "MemTotal");
  auto avail = MemInfoField(meminfo, "MemAvailable");
  if (!total || !avail) return std::nullopt;
  return MemoryRoom{*avail, *total, "the machine"};
}

std::optional<std::string> ParseMemoryCgroupPath(std::string_view text, bool* v1) {
  std::optional<std::string> unified;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string_view path = line.substr(c2 + 1);
    if (controllers.empty()) {
      if (line.substr(0, c1) == "0") unified = std::string(path);
      continue;
    }
    // v1: a comma-separated controller list that names "memory".
    size_t p = 0;
    while (p <= controllers.size()) {
      const size_t q = std::min(controllers.find(',', p), controllers.size());
      if (controllers.substr(p, q - p) == "memory") {
        *v1 = true;
        return std::string(path);
      }
      p = q + 1;
    }
  }
  if (unified) *v1 = false;
  return unified;
}

std::optional<MemoryRoom> ReadMemoryRoom() {
  auto meminfo = ReadText("/proc/meminfo");
  if (!meminfo) return std::nullopt;
  auto room = ParseMemInfo(*meminfo);
  if (!room) return std::nullopt;
  auto cg = ReadText("/proc/self/cgroup");
  bool v1 = false;
  auto path = cg ? ParseMemoryCgroupPath(*cg, &v1) : std::nullopt;
  if (!path) return room;
  const std::string mount = v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup";
  const char* limit_file = v1 ? "/memory.limit_in_bytes" : "/memory.max";
  const char* usage_file = v1 ? "/memory.usage_in_bytes" : "/memory.current";
  // kvd's cgroup, then each ancestor up to the hierarchy's root: the tightest room wins. A
  // cgroup namespace shows the path as "/" while the mount is the cgroup itself.
  std::string rel = *path;
  for (;;) {
    const std::string dir = mount + (rel == "/" ? "" : rel);
    auto limit = ReadInt(dir + limit_file);  // v2 "max" does not parse: no limit
    auto usage = ReadInt(dir + usage_file);
    if (limit && usage && *limit > 0 && static_cast<uint64_t>(*limit) < kNoLimit) {
      const uint64_t l = static_cast<uint64_t>(*limit);
      const uint64_t u = static_cast<uint64_t>(std::max<int64_t>(*usage, 0));
      const uint64_t left = u >= l ? 0 : l - u;
      if (left < room->available) *room = MemoryRoom{left, l, "memory cgroup " + rel};
    }
    if (rel.empty() || rel == "/") break;
    const size_t slash = rel.rfind('/');
    rel = slash == 0 || slash == std::string::npos ? "/" : rel.substr(0, slash);
  }
  return room;
}

}  // namespace kvd::l1
