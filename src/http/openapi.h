// kvd's OpenAPI document: docs/openapi.json, embedded byte for byte into the binary at build
// time (cmake/embed_file.cmake writes the definition) and served at GET /openapi.json.
#pragma once

#include <string_view>

namespace kvd::http {

std::string_view OpenApiDocument();

}  // namespace kvd::http
