#include "l2/serde.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "l2/codec_serde.h"

namespace kvd::l2 {
namespace {

class NoneSerde final : public Serde {
 public:
  std::string_view name() const override { return "none"; }
  bool identity() const override { return true; }
  uint64_t MaxStoredBytes(const ObjectLayout& layout) const override { return layout.bytes; }
  Result<uint64_t> Encode(std::span<const uint8_t> raw, const ObjectLayout& layout,
                          std::span<uint8_t> out) const override {
    if (raw.size() != layout.bytes || out.size() < raw.size()) {
      return Status::InvalidArgument("serde none: buffer sizes do not match the layout");
    }
    std::memcpy(out.data(), raw.data(), raw.size());
    return static_cast<uint64_t>(raw.size());
  }
  Status Decode(std::span<const uint8_t> stored, const ObjectLayout& layout,
                std::span<uint8_t> raw) const override {
    if (stored.size() != layout.bytes || raw.size() != layout.bytes) {
      return Status::Internal("serde none: stored object has " + std::to_string(stored.size()) +
                              " bytes, the layout needs " + std::to_string(layout.bytes));
    }
    std::memcpy(raw.data(), stored.data(), stored.size());
    return Status::Ok();
  }
};

using Factory = Result<std::shared_ptr<const Serde>> (*)(const nlohmann::json& spec);

Result<std::shared_ptr<const Serde>> MakeNone(const nlohmann::json& spec) {
  for (const auto& [k, v] : spec.items()) {
    if (k != "type") return Status::InvalidArgument("serde 'none' takes no key '" + k + "'");
  }
  return std::shared_ptr<const Serde>(std::make_shared<NoneSerde>());
}

// The serde types kvd knows. Other modules add a row here (name, factory).
struct Known {
  const char* name;
  Factory make;
};
constexpr Known kKnown[] = {
    {"none", &MakeNone},
    {"cachegen", &MakeCachegenSerde},
    {"fp8", &MakeFp8Serde},
};

}  // namespace

std::vector<std::string> KnownSerdeTypes() {
  std::vector<std::string> out;
  for (const auto& k : kKnown) out.emplace_back(k.name);
  return out;
}

Result<std::shared_ptr<const Serde>> MakeSerde(const nlohmann::json* spec) {
  static const nlohmann::json kNone = {{"type", "none"}};
  if (spec == nullptr) spec = &kNone;
  if (!spec->is_object()) return Status::InvalidArgument("'serde' must be a JSON object");
  auto t = spec->find("type");
  if (t == spec->end() || !t->is_string()) {
    return Status::InvalidArgument("'serde' needs a string 'type'");
  }
  const std::string type = t->get<std::string>();
  for (const auto& k : kKnown) {
    if (type == k.name) return k.make(*spec);
  }
  std::string known;
  for (const auto& k : kKnown) {
    known += known.empty() ? "" : ", ";
    known += k.name;
  }
  return Status::InvalidArgument("serde type '" + type + "' is not supported (known: " + known + ")");
}

}  // namespace kvd::l2
