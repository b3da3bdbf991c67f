// The policy registry: names accepted by --eviction-policy and their factories.
#include <algorithm>
#include <cctype>

#include "eviction/eviction_policy.h"

namespace kvd::eviction {
namespace {

struct Entry {
  const char* name;
  std::unique_ptr<EvictionPolicy> (*make)(const PolicyContext&);
};

const Entry kPolicies[] = {
    {"LRU", MakeLruPolicy},
    {"ARC", MakeArcPolicy},
    {"S3-FIFO", MakeS3FifoPolicy},
    {"LHD", MakeLhdPolicy},
    {"IsolatedLRU", MakeIsolatedLruPolicy},
    {"noop", MakeNoopPolicy},
};

bool SameName(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::optional<std::string> CanonicalPolicyName(std::string_view name) {
  for (const auto& p : kPolicies) {
    if (SameName(name, p.name)) return std::string(p.name);
  }
  return std::nullopt;
}

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& p : kPolicies) v.emplace_back(p.name);
    return v;
  }();
  return names;
}

std::unique_ptr<EvictionPolicy> MakePolicy(std::string_view name, const PolicyContext& context) {
  for (const auto& p : kPolicies) {
    if (SameName(name, p.name)) return p.make(context);
  }
  return nullptr;
}

std::unique_ptr<SharedState> MakeSharedState(std::string_view name) {
  auto canonical = CanonicalPolicyName(name);
  if (canonical && *canonical == "LHD") return MakeLhdSharedState();
  return nullptr;
}

}  // namespace kvd::eviction
