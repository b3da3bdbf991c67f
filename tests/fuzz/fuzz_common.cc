#include "fuzz_common.h"

#include <msgpack.hpp>

#include <cstdio>
#include <cstdlib>

namespace kvd::fuzz {

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "kvd fuzz invariant violated: %s\n", what);
  std::abort();
}

bool IsOneMsgpackDocument(std::string_view bytes) {
  try {
    size_t off = 0;
    msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size(), off);
    return off == bytes.size();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace kvd::fuzz
