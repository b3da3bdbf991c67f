// BlendDevicePlan: a CacheBlend retrieve (blend::ScatterRequest) flattened into the plain
// arrays the CUDA scatter + re-RoPE kernel reads (blend_device_math.h), packed into one
// blob that is uploaded with one copy. Host-only C++: built and tested without CUDA.
// EmulateBlendScatter runs the kernel's exact per-piece code on the host, so the unit tests
// check the kernel's plan and arithmetic against blend::ExecuteScatter byte for byte.
//
// Addresses. The plan stores the addresses the request carries: tensor_bases are where the
// executor sees the registered tensors (device addresses for the kernel, host buffers for
// the emulator) and each match's `object` is where the executor reads it (a device
// staging copy, a mapped pinned host object for zero-copy reads, or a host buffer). The
// request is validated by blend::PlanScatter (nothing is dereferenced there); the rope
// tables it names are host RopeTables, read here to compute the deltas.
//
// Immutable once built; the blob must be uploaded (or, for the emulator, kept) unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blend/cuda/blend_device_math.h"
#include "blend/scatter.h"
#include "common/status.h"

namespace kvd::blend::cuda {

struct BlendDevicePlan {
  RetrieveReason reason = RetrieveReason::kOk;  // not kOk: nothing to launch
  uint64_t bytes = 0;                           // destination bytes written
  uint32_t num_pieces = 0;
  uint32_t num_jobs = 0;
  uint32_t rotated_jobs = 0;
  uint32_t min_copy_vec = 16;  // narrowest copy word of any shape (for logs)
  uint32_t min_win_word = 16;  // narrowest window word of any turned shape
  // The arrays, back to back, each 16-byte aligned inside the blob.
  std::vector<uint8_t> blob;
  struct Sections {
    uint64_t pieces = 0, jobs = 0, shapes = 0, layers = 0, runs = 0, ids = 0, delta = 0;
  } at;
};

// Rows per piece aim at about this many bytes.
inline constexpr uint32_t kBlendPieceBytes = 32 * 1024;

// Validates the request (blend::PlanScatter: the same errors and outcome) and builds the
// plan. A plan whose reason is not kOk has no pieces. InvalidArgument besides when the
// layout exceeds the kernel's 32-bit limits (rows over 2^31 bytes, more than 2^32 pieces)
// or an element of a turned row is not aligned to its own size in memory.
Result<BlendDevicePlan> BuildBlendDevicePlan(const ScatterRequest& req);

// The kernel's arguments when the blob's first byte is at `base`.
BlendArgs BlendArgsAt(const BlendDevicePlan& plan, uint64_t base);

// Host execution of the kernel's code: every piece, lane 0 of 1. The request's addresses
// must be host addresses.
void EmulateBlendScatter(const BlendDevicePlan& plan);

std::string DescribeBlendPlan(const BlendDevicePlan& plan);

}  // namespace kvd::blend::cuda
