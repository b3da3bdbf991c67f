// Object states of the L1 cache and their legal transitions: the one place they are defined.
// L1Cache applies every change of state through the functions below, and
// tests/unit/l1/object_state_test.cc has a test per transition.
//
// An OBJECT is one slot of a chunk entry (one rank's bytes of one chunk). An ENTRY is the
// chunk: its slots are written by their ranks independently, looked up together (a hit needs
// every slot resident) and evicted together.
//
// SLOT STATES (SlotState, stored in the slot):
//
//                 Reserve                      Commit
//     ┌───────┐ ────────────▶ ┌─────────┐ ────────────▶ ┌──────────┐
//     │ EMPTY │               │ STAGING │               │ RESIDENT │
//     └───────┘ ◀──────────── └─────────┘               └──────────┘
//         ▲      Abort, or Reclaim (write       │ Evict          │ Evict
//         │      lock expired, memory freed)    ▼                ▼
//         │                                ┌──────────┐
//         └────────────── Free ─────────── │ EVICTING │  (memory being returned; the
//                                          └──────────┘   entry is out of the index)
//
//   STAGING   memory allocated, being written by the holder of its WriteReservation,
//             invisible to lookups and pins. The write lock expires write_ttl after Reserve.
//   RESIDENT  committed bytes, immutable until the entry goes; never overwritten (a second
//             Reserve of the slot is refused).
//   EVICTING  the entry was removed from the index (evicted or cleared); its memory is freed
//             at once, or for a pinned slot of a cleared entry when the last pin goes.
//   A STAGING slot is Evicted only by Clear (a live write lock) or after its write lock
//   expired; an expired one is Reclaimed by the next writer of the slot or by the lock sweep.
//
// ENTRY LOCKS (EntryLocks, counted on the entry). Each is a reason the entry may not be
// evicted; they are independent and may overlap:
//
//   writers   slots STAGING under a write reservation (live, or expired and not yet reclaimed)
//   holders   lookup requests that read-locked the chunk (LOOKUP). Owned by the request:
//             released only by that request's RETRIEVE / FREE_LOOKUP_LOCKS, its next LOOKUP,
//             or its read TTL. Holds past kMax (a hot chunk under a flood of lookups) are
//             counted beside the entry by its shard (Shard::extra_holds) while this count
//             stays at kMax; a hold is never refused for the count.
//   pins      ReadPins: copies out of the entry's RESIDENT slots in flight.
//
//                          first lock (WriteBegin, HoldBegin, PinBegin)
//     ┌───────────────┐ ─────────────────────────────────────────────▶ ┌──────────────────┐
//     │   EVICTABLE   │                                                 │ LOCKED           │
//     │ on the policy │ ◀───────────────────────────────────────────── │ writers, holders │
//     │ list          │     last lock released (WriteEnd, HoldEnd,      │ or pins > 0; off │
//     └───────────────┘     PinEnd)                                     │ the policy list  │
//                                                                       └──────────────────┘
//   Invariant: an entry in the index is on its policy's candidate list iff all three counts
//   are zero. Eviction therefore never walks a locked entry.
#pragma once

#include <cstdint>
#include <optional>

namespace kvd::l1 {

enum class SlotState : uint8_t { kEmpty = 0, kStaging = 1, kResident = 2, kEvicting = 3 };
enum class SlotEvent : uint8_t { kReserve, kCommit, kAbort, kReclaim, kEvict, kFree };

const char* SlotStateName(SlotState state);
const char* SlotEventName(SlotEvent event);

// The state after `event`, or nullopt when the event is illegal in `state`.
constexpr std::optional<SlotState> NextSlotState(SlotState state, SlotEvent event) {
  switch (state) {
    case SlotState::kEmpty:
      if (event == SlotEvent::kReserve) return SlotState::kStaging;
      break;
    case SlotState::kStaging:
      if (event == SlotEvent::kCommit) return SlotState::kResident;
      if (event == SlotEvent::kAbort || event == SlotEvent::kReclaim) return SlotState::kEmpty;
      if (event == SlotEvent::kEvict) return SlotState::kEvicting;
      break;
    case SlotState::kResident:
      if (event == SlotEvent::kEvict) return SlotState::kEvicting;
      break;
    case SlotState::kEvicting:
      if (event == SlotEvent::kFree) return SlotState::kEmpty;
      break;
  }
  return std::nullopt;
}

enum class LockEvent : uint8_t { kWriteBegin, kWriteEnd, kHoldBegin, kHoldEnd, kPinBegin, kPinEnd };
const char* LockEventName(LockEvent event);

// What a lock event did to the entry's place on the evictable list.
enum class ListChange : uint8_t { kNone, kBecameLocked, kBecameEvictable };

struct EntryLocks {
  static constexpr uint16_t kMax = 0xFFFF;
  uint16_t writers = 0;
  uint16_t holders = 0;
  uint16_t pins = 0;

  bool locked() const { return writers != 0 || holders != 0 || pins != 0; }

  // Applies `event`. nullopt (and no change) when it is illegal: an End with nothing to end,
  // or a Begin that would overflow the count (the caller refuses the lock instead).
  std::optional<ListChange> Apply(LockEvent event) {
    uint16_t* count = event == LockEvent::kWriteBegin || event == LockEvent::kWriteEnd ? &writers
                      : event == LockEvent::kHoldBegin || event == LockEvent::kHoldEnd ? &holders
                                                                                       : &pins;
    const bool begin = event == LockEvent::kWriteBegin || event == LockEvent::kHoldBegin ||
                       event == LockEvent::kPinBegin;
    const bool was_locked = locked();
    if (begin) {
      if (*count == kMax) return std::nullopt;
      ++*count;
      return was_locked ? ListChange::kNone : ListChange::kBecameLocked;
    }
    if (*count == 0) return std::nullopt;
    --*count;
    return locked() ? ListChange::kNone : ListChange::kBecameEvictable;
  }
};

}  // namespace kvd::l1
