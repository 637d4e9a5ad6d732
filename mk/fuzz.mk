# libFuzzer harnesses (tests/fuzz/), included by the Makefile.
#   make fuzz                     builds every harness and runs each for FUZZ_SECONDS (600)
#   make fuzz FUZZ_SECONDS=3600   the hour-long runs of a release
#   make fuzz FUZZ_ONLY="config manifest"   some harnesses only
#   make fuzz-smoke               the same for 20 s each, FUZZ_JOBS (2) at a time (CI)
# Everything is built with clang in build-fuzz/ (the library with ASan, UBSan
# and coverage instrumentation; never the gcc objects). Each harness runs on a
# scratch copy of its seed corpus, build-fuzz/corpus/NAME, so the tree is
# never written; crash reproducers land in build-fuzz/artifacts/NAME/.
# tests/fuzz/run.sh prints executions, coverage and crashes per harness and
# fails on any crash, leak, timeout or out-of-memory.

FZ            := build-fuzz
FUZZ_CC       ?= clang
FUZZ_SECONDS  ?= 600
FUZZ_JOBS     ?= 1
FUZZ_SMOKE_JOBS ?= 2
FUZZ_ONLY     ?=
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS   := -g -O1 -std=c11 -Wall -Wextra -Wshadow -Wno-unused-parameter -D_GNU_SOURCE -pthread \
                 -Iinclude -Isrc -Itests/fuzz $(FUZZ_SAN) -DFUZZ_ROOT='"$(CURDIR)"'
FUZZ_LIB_SRC  := $(LIB_SRC) $(SRV_SRC)
FUZZ_LIB_OBJ  := $(FUZZ_LIB_SRC:%.c=$(FZ)/%.o)
FUZZ_SRC      := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_NAMES    := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
FUZZ_BINS     := $(FUZZ_NAMES:%=$(FZ)/fuzz_%)

.PHONY: fuzz fuzz-smoke fuzz-build

$(FZ)/src/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link $(DEP_CFLAGS) -MMD -MP -c $< -o $@

$(FZ)/libtern-fuzz.a: $(FUZZ_LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(FZ)/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz.h $(FZ)/libtern-fuzz.a
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(DEP_CFLAGS) -MMD -MP -o $@ $< $(FZ)/libtern-fuzz.a $(DEP_LIBS)

fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) tests/fuzz/run.sh $(FZ) $(or $(FUZZ_ONLY),$(FUZZ_NAMES))

fuzz-smoke:
	$(MAKE) fuzz FUZZ_SECONDS=20 FUZZ_JOBS=$(FUZZ_SMOKE_JOBS)

-include $(FUZZ_LIB_OBJ:.o=.d) $(FUZZ_BINS:=.d)
