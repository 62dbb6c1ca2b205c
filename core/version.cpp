// core/version.cpp: normtape::version(), the version compiled into the library.
#include "core/version.h"

namespace normtape {

const char* version() { return NORMTAPE_VERSION; }

}  // namespace normtape
