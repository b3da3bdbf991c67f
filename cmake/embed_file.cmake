# cmake -DINPUT=<file> -DOUTPUT=<file.cc> -DNAMESPACE=<ns> -DFUNCTION=<name> -P embed_file.cmake
# Writes OUTPUT, a C++ source defining `std::string_view <NAMESPACE>::<FUNCTION>()` that returns the
# bytes of INPUT exactly (no text conversion), so what the binary serves is the file itself.
foreach(var INPUT OUTPUT NAMESPACE FUNCTION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "embed_file.cmake: -D${var}=... is required")
  endif()
endforeach()
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_len)
math(EXPR size "${hex_len} / 2")
# 0xNN, per byte; a line break every 32 bytes keeps the generated file readable.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n    " bytes "${bytes}")
get_filename_component(name "${INPUT}" NAME)
file(WRITE "${OUTPUT}"
"// Generated at build time from ${name} by cmake/embed_file.cmake: do not edit.
#include <string_view>

namespace ${NAMESPACE} {
namespace {
constexpr unsigned char kBytes[${size} + 1] = {
    ${bytes}0x00};
}  // namespace

std::string_view ${FUNCTION}() {
  return std::string_view(reinterpret_cast<const char*>(kBytes), ${size});
}

}  // namespace ${NAMESPACE}
")
