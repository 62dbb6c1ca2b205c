// tests/test_version.cpp: the configured version header agrees with the library and with CMake's
// project(VERSION).
#include <string>

#include "test_util.h"

TEST_CASE("version: header macros, runtime and CMake agree") {
    std::string parts = std::to_string(NORMTAPE_VERSION_MAJOR) + "." + std::to_string(NORMTAPE_VERSION_MINOR) + "." +
                        std::to_string(NORMTAPE_VERSION_PATCH);
    CHECK(parts == NORMTAPE_VERSION);
    CHECK(std::string(normtape::version()) == NORMTAPE_VERSION);
    CHECK(std::string(NORMTAPE_VERSION) == NORMTAPE_CMAKE_VERSION);
}
