#include "l2/store_behind.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvd::l2 {

// One Submit's objects, shared by the tiers' callbacks.
struct StoreBehind::Batch {
  SkipL1Chunks* skip_l1 = nullptr;
  std::vector<CommittedObject> objects;
  std::vector<l1::ReadPin> pins;        // parallel to objects
  // Per object: some tier holds it. Set by the tiers' callbacks (each under its own tier's
  // mutex, so concurrently: one byte per object, atomic), read after the last one.
  std::unique_ptr<std::atomic<bool>[]> stored;
  std::vector<std::shared_ptr<std::vector<std::vector<uint8_t>>>> encoded;  // serde forms
  std::atomic<int> remaining{0};        // tiers that have not answered

  // A tier is done with the batch. After the last: the pins go, then (skip_l1) the L1
  // copies a tier now holds.
  void TierDone() {
    if (remaining.fetch_sub(1) != 1) return;
    pins.clear();
    encoded.clear();
    if (skip_l1 != nullptr) skip_l1->Stored(objects, stored.get());
  }
};

void StoreBehind::Submit(std::vector<CommittedObject> objects, const ObjectFormat& format) {
  const auto storing = static_cast<int>(std::count_if(
      tiers_.begin(), tiers_.end(), [](const auto& t) { return t->spec.tier->stores(); }));
  if (storing == 0 || objects.empty()) return;
  if (closed_.load()) return;
  auto batch = std::make_shared<Batch>();
  batch->skip_l1 = skip_l1_;
  for (auto& o : objects) {
    auto pin = l1_->PinForRead(o.chunk, o.slot);
    if (!pin.ok()) continue;  // already gone from L1: nothing to write
    batch->pins.push_back(std::move(pin).value());
    batch->objects.push_back(std::move(o));
  }
  if (batch->objects.empty()) return;
  batch->remaining.store(storing);
  batch->stored = std::make_unique<std::atomic<bool>[]>(batch->objects.size());
  for (size_t i = 0; i < batch->objects.size(); ++i) batch->stored[i] = false;
  for (const auto& t : tiers_) {
    if (t->spec.tier->stores()) StoreTo(*t, batch, format);
  }
}

void StoreBehind::StoreTo(TierState& t, const std::shared_ptr<Batch>& batch, const ObjectFormat& format) {
  std::vector<StoreItem> items;
  std::vector<size_t> index;
  uint64_t bytes = 0;
  {
    MutexLock lock(&t.mu);
    t.st.store_requests++;
    t.st.store_objects += batch->objects.size();
    for (size_t i = 0; i < batch->objects.size(); ++i) {
      const uint64_t sz = batch->pins[i].size();
      const bool fits = t.inflight_batches < budget_.max_inflight_batches &&
                        t.st.inflight_store_bytes + bytes + sz <= budget_.max_inflight_bytes;
      if (!fits) {
        t.st.store_skipped_objects++;
        continue;
      }
      // Admission (issue 27, finding 3): a tier with a declared capacity never takes an
      // object that would put what it holds, plus what is being written, over it; the
      // write is skipped and counted as no space (eviction frees room at its next round).
      if (t.capacity > 0 && t.index.usage() + t.st.inflight_store_bytes + bytes + sz > t.capacity) {
        t.st.store_full_objects++;
        continue;
      }
      bytes += sz;
      items.push_back({batch->objects[i].key, batch->pins[i].data(), sz});
      index.push_back(i);
    }
    if (!items.empty()) {
      t.inflight_batches++;
      t.st.inflight_store_objects += items.size();
      t.st.inflight_store_bytes += bytes;
    }
  }
  if (items.empty()) {
    batch->TierDone();
    return;
  }
  // Counted in flight above (objects and raw bytes); released as a whole by the callback.
  const size_t n_items = items.size();
  if (!t.spec.serde->identity()) {
    // Encoded forms are owned by the tier's part of the batch. An object that fails to
    // encode is not written (an empty object would read back as a failed decode, and
    // skip_l1 would count it as held by the tier).
    auto enc = std::make_shared<std::vector<std::vector<uint8_t>>>();
    enc->reserve(items.size());
    std::vector<StoreItem> encoded_items;
    std::vector<size_t> encoded_index;
    uint64_t failed = 0;
    for (size_t j = 0; j < items.size(); ++j) {
      auto& it = items[j];
      std::vector<uint8_t> buf(t.spec.serde->MaxStoredBytes(format.layout));
      auto n = t.spec.serde->Encode({it.data, it.size}, format.layout, buf);
      if (!n.ok()) {
        ++failed;
        spdlog::warn("{}: {} encode failed: {}", t.name, t.spec.serde->name(), n.status().message());
        continue;
      }
      buf.resize(*n);
      enc->push_back(std::move(buf));
      encoded_items.push_back({it.key, enc->back().data(), enc->back().size()});
      encoded_index.push_back(index[j]);
    }
    items = std::move(encoded_items);
    index = std::move(encoded_index);
    batch->encoded.push_back(enc);
    if (failed > 0) {
      MutexLock lock(&t.mu);
      t.st.store_failed_objects += failed;
      if (items.empty()) {
        t.inflight_batches--;
        t.st.inflight_store_objects -= n_items;
        t.st.inflight_store_bytes -= bytes;
      }
    }
    if (items.empty()) {
      batch->TierDone();
      return;
    }
  }
  const int64_t t0 = clock_->NowNanos();
  calls_->Begin();
  t.spec.tier->Store(std::move(items), [this, &t, batch, index, bytes, t0, n_items](
                                           std::vector<ItemResult> results) {
    const double secs = static_cast<double>(clock_->NowNanos() - t0) * 1e-9;
    {
      MutexLock lock(&t.mu);
      t.inflight_batches--;
      t.st.inflight_store_objects -= n_items;
      t.st.inflight_store_bytes -= bytes;
      t.st.store_completed_requests++;
      t.st.store_seconds += secs;
      for (size_t j = 0; j < results.size() && j < index.size(); ++j) {
        const auto& r = results[j];
        const auto& obj = batch->objects[index[j]];
        if (r.status.ok()) {
          t.NoteSuccess();
          batch->stored[index[j]] = true;
          if (r.bytes > 0) {
            t.st.stored_objects++;
            t.st.stored_bytes += r.bytes;
          } else {
            t.st.store_existing_objects++;
          }
          const ChunkSlot slot{obj.chunk, obj.slot};
          t.AccountLocked(obj.key, r.bytes > 0 ? r.bytes : batch->pins[index[j]].size(), &slot);
        } else if (r.status.code() == StatusCode::kResourceExhausted) {
          t.st.store_full_objects++;
          t.NoteError(r.status.message());
        } else {
          t.st.store_failed_objects++;
          t.NoteError(r.status.message());
        }
      }
    }
    batch->TierDone();
    calls_->End();
  });
}

}  // namespace kvd::l2
