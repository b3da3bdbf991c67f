// The dashboard page served at GET /: one self-contained HTML document (inline CSS and
// JS, no fonts, scripts or images from elsewhere: operators' machines are often offline).
// It polls GET /status and GET /api/timeseries every second and draws its own charts on
// <canvas>. The document is src/http/dashboard.html, embedded byte for byte at build time
// (cmake/embed_file.cmake). Immutable; safe from any thread.
#pragma once

#include <string_view>

namespace kvd::http {

std::string_view DashboardHtml();

}  // namespace kvd::http
