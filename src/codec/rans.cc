#include "codec/rans.h"

#include <array>

namespace kvd::codec {

const Reciprocal* ReciprocalTable() {
  static const std::array<Reciprocal, 4097> table = [] {
    std::array<Reciprocal, 4097> t{};
    for (uint32_t f = 1; f <= 4096; ++f) t[f] = ComputeReciprocal(f);
    return t;
  }();
  return table.data();
}

}  // namespace kvd::codec
