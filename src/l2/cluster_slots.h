// Redis/Valkey Cluster slot routing, the part hiredis lacks: CRC16 key slots (with hash
// tags), the slot → master map read from CLUSTER SLOTS or CLUSTER SHARDS, and the
// MOVED/ASK redirects a node answers when a slot lives elsewhere. Pure functions and a plain
// value type: the tier that routes with them (resp_tier) keeps the map under its own lock.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "l2/resp_connection.h"

namespace kvd::l2 {

constexpr int kClusterSlots = 16384;

// CRC16-XMODEM, as Redis Cluster computes it.
uint16_t Crc16(std::string_view data);
// The slot of a key: CRC16 of the hash tag ("{...}", first non-empty one) or the whole key,
// mod 16384.
uint16_t KeySlot(std::string_view key);

struct SlotMap {
  std::vector<RespEndpoint> masters;        // distinct masters, in map order
  std::array<int16_t, kClusterSlots> owner; // index into masters, -1 = not served
  SlotMap() { owner.fill(-1); }
  // Slots no master serves.
  int uncovered() const;
  // The master of a slot, or nullptr.
  const RespEndpoint* MasterOf(uint16_t slot) const {
    int i = owner[slot];
    return i < 0 ? nullptr : &masters[static_cast<size_t>(i)];
  }
  // Points one slot at `to` (after a MOVED), adding the master if new.
  void Assign(uint16_t slot, const RespEndpoint& to);
};

// Parses a CLUSTER SLOTS reply. `asked` replaces an empty or "?" node address (a node that
// does not know its own address answers so).
Result<SlotMap> ParseClusterSlots(const redisReply* reply, const RespEndpoint& asked);
// Parses a CLUSTER SHARDS reply (Redis ≥ 7, Valkey); only masters that are not "fail" count.
Result<SlotMap> ParseClusterShards(const redisReply* reply, const RespEndpoint& asked);

struct Redirect {
  bool ask = false;  // ASK: this one command only; MOVED: the slot moved for good
  uint16_t slot = 0;
  RespEndpoint to;
};
// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"; nullopt for other errors.
std::optional<Redirect> ParseRedirect(std::string_view error, const RespEndpoint& asked);

}  // namespace kvd::l2
