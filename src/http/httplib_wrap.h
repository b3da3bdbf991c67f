// Includes cpp-httplib the way Debian's libcpp-httplib was built. Its build options change
// the layout of httplib's classes, so every file that includes httplib.h must define them
// identically (as `pkg-config --cflags cpp-httplib` would): include this header instead.
#pragma once

#ifndef CPPHTTPLIB_OPENSSL_SUPPORT
#define CPPHTTPLIB_OPENSSL_SUPPORT
#endif
#ifndef CPPHTTPLIB_ZLIB_SUPPORT
#define CPPHTTPLIB_ZLIB_SUPPORT
#endif
#ifndef CPPHTTPLIB_BROTLI_SUPPORT
#define CPPHTTPLIB_BROTLI_SUPPORT
#endif
#include <httplib.h>
