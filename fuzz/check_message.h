// fuzz/check_message.h: what the fuzz targets ask of an error message: that it quotes a bad input
// by a short prefix, not whole. A message longer than 1,000 bytes aborts (a finding).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/check.h"

inline void check_message(const normtape::Error& e) {
    const std::string m = e.what();
    if (m.size() > 1000) {
        std::fprintf(stderr, "a message of %zu bytes: %.200s...\n", m.size(), m.c_str());
        std::abort();
    }
}
