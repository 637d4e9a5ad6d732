# tern: build, test, run.
#   make            build build/tern and build/libtern.a
#   make test       install deps, build, run every test, again under ASan/UBSan, then the mutation check
#   make run        install deps, build, run tern on the default model
#   make asan       the tests built with AddressSanitizer/UBSan in build-asan/
#   make soak       the server under load for 10 minutes (SOAK_SECONDS)

CC      ?= cc
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=c11 -Wall -Wextra -Wshadow -Wno-unused-parameter -D_GNU_SOURCE -pthread -Iinclude -Isrc
DEPS    := jansson libpcre2-8 libutf8proc libcrypto libmicrohttpd libcurl
DEP_CFLAGS = $(shell pkg-config --cflags $(DEPS) 2>/dev/null)
DEP_LIBS   = $(shell pkg-config --libs $(DEPS) 2>/dev/null) -lm -pthread
TEST_LIBS  = $(shell pkg-config --libs criterion 2>/dev/null)

B       ?= build
LIB_SRC := $(sort $(shell find src -name '*.c' ! -path 'src/cli/*' ! -path 'src/server/*'))
# The server, like the CLI, speaks only tern.h; both are in the tern binary.
CLI_SRC := $(sort $(wildcard src/cli/*.c) $(wildcard src/server/*.c))
SRV_SRC := $(sort $(wildcard src/server/*.c))
TEST_SRC:= $(sort $(wildcard tests/*.c))
BENCH_SRC:= $(sort $(wildcard bench/*.c))
BENCHES := $(BENCH_SRC:bench/%.c=$(B)/bench/%)
LIB_OBJ := $(LIB_SRC:%.c=$(B)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(B)/%.o)
TEST_OBJ:= $(TEST_SRC:%.c=$(B)/%.o)
SRV_OBJ := $(SRV_SRC:%.c=$(B)/%.o)
# The chat page's files (src/server/web/), embedded into the binary as byte
# arrays generated at build time (never checked in).
WEB_FILES := $(sort $(wildcard src/server/web/*))
WEB_OBJ := $(B)/gen/web_assets.o
CLI_OBJ += $(WEB_OBJ)
SRV_OBJ += $(WEB_OBJ)

# The CUDA backend (make CUDA=1, make test-cuda): mk/cuda.mk adds its objects
# and libraries to the ones above when CUDA=1.
.DEFAULT_GOAL := all
-include mk/cuda.mk
-include mk/fuzz.mk

.PHONY: all deps test run asan check clean mutation-check bench test-server test-pull soak FORCE
all: $(B)/tern

deps:
	@scripts/install-deps.sh

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEP_CFLAGS) -MMD -MP -c $< -o $@

$(B)/gen/web_assets.c: $(WEB_FILES) scripts/embed_web.sh
	@mkdir -p $(dir $@)
	scripts/embed_web.sh $(WEB_FILES) > $@.tmp && mv $@.tmp $@

$(B)/gen/web_assets.o: $(B)/gen/web_assets.c
	$(CC) $(CFLAGS) $(DEP_CFLAGS) -MMD -MP -c $< -o $@

# tern bench prints the commit it was built from: that one object is rebuilt
# every time so the commit stays current.
$(B)/src/cli/cmd_bench.o: CFLAGS += -DTERN_COMMIT='"$(shell git describe --always --dirty 2>/dev/null || echo unknown)"'
$(B)/src/cli/cmd_bench.o: FORCE
FORCE:

$(B)/libtern.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(B)/tern: $(CLI_OBJ) $(B)/libtern.a
	$(CC) $(CFLAGS) -o $@ $^ $(DEP_LIBS)

$(B)/tern-tests: $(TEST_OBJ) $(SRV_OBJ) $(B)/libtern.a
	$(CC) $(CFLAGS) -o $@ $^ $(DEP_LIBS) $(TEST_LIBS)

# The GPU engine against the CPU engine: built with CUDA=1 and run by make
# test-cuda on a GPU machine.
$(B)/tern-cuda-engine-tests: $(B)/tests/gpu/check_engine.o $(B)/tests/gpu/check_tiers.o $(B)/tests/gpu/check_grammar.o \
                          $(B)/src/server/pcache.o $(B)/src/server/pcdisk.o $(B)/libtern.a
	$(CC) $(CFLAGS) -o $@ $^ $(DEP_LIBS)

# Benchmarks: each bench/NAME.c is a program built as build/bench/NAME.
bench: $(BENCHES)
$(B)/bench/%: bench/%.c $(B)/libtern.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(DEP_CFLAGS) -o $@ $< $(B)/libtern.a $(DEP_LIBS)

# The tests run from the repository root (fixtures live in tests/fixtures).
check: $(B)/tern $(B)/tern-tests
	$(B)/tern-tests --jobs 2

asan:
	$(MAKE) B=build-asan OPT="-O1 -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	        build-asan/tern-tests build-asan/tern

# The ASan suite runs in one job: criterion's parallel runner now and then
# leaks an allocation of its own in the runner process, which LeakSanitizer
# reports.
test: deps
	$(MAKE) check
	$(MAKE) asan
	ASAN_OPTIONS=detect_leaks=1 TERN_BIN=build-asan/tern build-asan/tern-tests --jobs 1
	$(MAKE) test-server
	$(MAKE) test-pull
	python3 tools/mutation_check.py

# tern serve end to end (tests/server, Python): the official SDKs and the real
# Codex and Claude Code CLIs, installed from PyPI at test time into
# build/pydeps, and the chat page in headless Chromium; then the
# malformed-request corpus, the concurrency, prefix cache and residency tests
# and the chat page's files again against the ASan build.
WEBUI_HTTP_TESTS := $(addprefix tests/server/test_webui.py::,test_page_files test_vendor_libraries \
                    test_page_open_with_api_key test_no_webui)
test-server: $(B)/tern
	TERN_BIN=$(B)/tern tests/server/run.sh
	TERN_BIN=build-asan/tern tests/server/run.sh tests/server/test_corpus.py tests/server/test_concurrency.py \
	    tests/server/test_prefix_cache.py tests/server/test_prefix_cache_disk.py tests/server/test_residency.py \
	    tests/server/test_prompt_view.py \
	    $(WEBUI_HTTP_TESTS)

# tern pull against a local mock of the Hugging Face hub (tests/pull), with
# the plain and the ASan build.
test-pull: $(B)/tern
	TERN_BIN=$(B)/tern tests/server/run.sh tests/pull
	TERN_BIN=build-asan/tern tests/server/run.sh tests/pull

# The server under load for SOAK_SECONDS (default 600): 32 streaming clients,
# disconnects, slow readers and malformed requests; memory and descriptors must
# stay flat (tools/soak.py, docs/RELIABILITY.md). Not part of make test.
SOAK_SECONDS ?= 600
soak: $(B)/tern
	python3 tools/soak.py --bin $(B)/tern --seconds $(SOAK_SECONDS)

# Each classic mistake in the model math must make a fixture test fail.
mutation-check: $(B)/tern-tests
	python3 tools/mutation_check.py

run: deps
	$(MAKE) all
	$(B)/tern run -p "And God said," -n 96

clean:
	rm -rf build build-asan

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(TEST_OBJ:.o=.d)
