// crc32c: CRC-32C (Castagnoli), the checksum of the codec's byte format. Uses the SSE4.2
// crc32 instruction when the CPU has it, a table otherwise; both give the same value.
// Stateless and reentrant.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvd::codec {

// CRC-32C of data[0, n), continuing from `crc` (0 to start). Crc32c("123456789") = 0xe3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace kvd::codec
