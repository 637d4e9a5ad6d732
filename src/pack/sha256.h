/* SHA-256 lives in util/sha256.h; this name stays only until the fuzz
 * harness (tests/fuzz/fuzz_packed.c) includes that one. */
#include "util/sha256.h"
