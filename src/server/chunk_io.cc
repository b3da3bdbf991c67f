#include "server/chunk_io.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "p2p/peer_node.h"
#include "server/tiers.h"

namespace kvd::server {

void ChunkIo::FormatRegistered(const Instance& inst) const {
  if (peers_ == nullptr) return;
  peers_->AddFormat(inst.model_name, inst.tier_format.layout_tag,
                    KeyModelName(inst.model_name, inst.key_namespace), inst.object_bytes);
}

// One L1 slot per rank.
static_assert(kMaxWorldSize <= l1::L1Cache::kMaxSlotsPerEntry);

Status KeyMatchesInstance(const char* op, const wire::CacheKey& key, const Instance& inst) {
  if (key.model_name == inst.model_name && key.world_size == inst.world_size) return Status::Ok();
  return Status::InvalidArgument(std::string(op) + ": key names model '" + key.model_name +
                                 "' world_size " + std::to_string(key.world_size) +
                                 ", the instance registered '" + inst.model_name + "' " +
                                 std::to_string(inst.world_size));
}

std::vector<l1::ChunkKey> ChunkWrites::CommitLastFirst(std::string_view lost_log) {
  std::vector<l1::ChunkKey> committed;
  l1::CommitInReverse(std::span<l1::WriteReservation>(reservations_), [&](size_t j, bool ok) {
    if (ok) {
      committed.push_back(keys_[j]);
    } else {
      spdlog::debug("{}", lost_log);
    }
  });
  return committed;
}

void ChunkWrites::Abort() {
  for (auto& r : reservations_) r.Abort();
}

void ChunkWrites::Truncate(size_t n) {
  if (n >= reservations_.size()) return;
  for (size_t j = n; j < reservations_.size(); ++j) {
    bytes_ -= reservations_[j].size();
    reservations_[j].Abort();
  }
  reservations_.resize(n);
  keys_.resize(n);
  chunks_.resize(n);
}

void ChunkPins::Release() {
  l1::ReleaseInReverse(pins_);
  TellTiers();
}

void ChunkPins::ReleaseFirstToLast() {
  pins_.clear();
  TellTiers();
}

void ChunkPins::TellTiers() {
  if (tiers_) tiers_->AfterRetrieve(keys_);
}

Result<RequestChunks> ChunkIo::KeysToWrite(const wire::CacheKey& key, const Instance& inst) const {
  auto chunks = RequestChunkKeys(*sessions_, l1_->namespaces(), chunk_size_, key,
                                 /*create_namespace=*/true, inst.key_namespace,
                                 SessionUse::kIfExists);
  if (chunks.ok()) BindStoredChunks(kv_events_, key, *chunks, chunk_size_);  // before any commit
  return chunks;
}

Result<RequestChunks> ChunkIo::KeysToRead(const wire::CacheKey& key, const Instance& inst) const {
  return RequestChunkKeys(*sessions_, l1_->namespaces(), chunk_size_, key,
                          /*create_namespace=*/false, inst.key_namespace, SessionUse::kIfExists);
}

Status ChunkIo::ReserveOne(ChunkWrites* writes, const l1::ChunkKey& key, int64_t chunk,
                           const Instance& inst, bool copy_in_flight) const {
  auto r = l1_->ReserveWrite(key, static_cast<uint32_t>(inst.world_size), writes->slot_,
                             inst.object_bytes);
  if (!r.ok()) {
    // Resident, or another writer's: this request leaves it to them.
    return r.status().code() == StatusCode::kAlreadyExists ? Status::Ok() : r.status();
  }
  // From here until its commit or abort, the memory is the copy's.
  if (copy_in_flight && !r->MarkCopyInFlight()) {
    return Status::Unavailable("store: chunk " + std::to_string(chunk) +
                               " lost its reservation before the copy started");
  }
  writes->bytes_ += r->size();
  writes->reservations_.push_back(std::move(r).value());
  writes->keys_.push_back(key);
  writes->chunks_.push_back(chunk);
  return Status::Ok();
}

bool ChunkIo::Pin(const RequestChunks& chunks, uint64_t n, uint32_t slot, uint64_t object_bytes,
                  ChunkPins* pins, PinMiss* miss) const {
  *pins = ChunkPins();
  pins->pins_.reserve(n);
  pins->tiers_ = tiers_;
  if (tiers_) pins->keys_ = chunks.keys;
  for (uint64_t i = 0; i < n; ++i) {
    auto pin = chunks.namespace_known ? l1_->PinForRead(chunks.keys[i], slot)
                                      : Result<l1::ReadPin>(Status::NotFound("unknown namespace"));
    if (!pin.ok() || pin->size() != object_bytes) {
      miss->chunk = i;
      miss->wrong_size = pin.ok() ? std::move(pin).value() : l1::ReadPin();
      return false;
    }
    pins->pins_.push_back(std::move(pin).value());
  }
  return true;
}

void StoreBehind(l2::TierSet* tiers, std::span<const l1::ChunkKey> committed, const Instance& inst,
                 const std::string& cache_salt, uint32_t slot) {
  if (!tiers || committed.empty()) return;
  tiers->StoreBehind(CommittedObjects(committed, inst.model_name, inst.world_size, cache_salt, slot,
                                      inst.tier_format),
                     inst.tier_format);
}

}  // namespace kvd::server
