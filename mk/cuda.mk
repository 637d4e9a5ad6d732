# The CUDA backend, included by the Makefile after its object lists.
#   make CUDA=1            libtern.a with src/cuda/*.cu (nvcc, sm_90 + PTX), CFLAGS gets -DTERN_CUDA=1
#   make test-cuda         builds build-cuda/tern-cuda-tests with CUDA=1 and runs every op check, then
#                          the GPU engine against the CPU engine (build-cuda/tern-cuda-engine-tests)
# Without CUDA=1 nothing here touches the build, so machines without nvcc build as before.

NVCC       ?= /usr/local/cuda/bin/nvcc
CUDA_HOME  ?= /usr/local/cuda
CUDA_ARCH  ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS  ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra -Iinclude -Isrc

# TRACE=1: a measurement build with the decode kernels' phase trace
# (src/cuda/trace.cuh; tern_load_params.debug.phase_trace names the file
# a session writes it to).
ifeq ($(TRACE),1)
NVCCFLAGS  += -DTERN_PHASE_TRACE
endif

CUDA_SRC      := $(sort $(wildcard src/cuda/*.cu))
CUDA_TEST_SRC := $(sort $(wildcard tests/cuda/*.c))

ifeq ($(CUDA),1)
CUDA_OBJ      := $(CUDA_SRC:%.cu=$(B)/%.o)
CUDA_TEST_OBJ := $(CUDA_TEST_SRC:%.c=$(B)/%.o)
LIB_OBJ       += $(CUDA_OBJ)
CFLAGS        += -DTERN_CUDA=1
DEP_LIBS      += -L$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart -lstdc++

$(B)/src/cuda/%.o: src/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(B)/tern-cuda-tests: $(CUDA_TEST_OBJ) $(B)/libtern.a
	$(CC) $(CFLAGS) -o $@ $^ $(DEP_LIBS)

# A CUPTI injection library that records every kernel's start and end
# (tools/gpu/kernel_timeline.c; a profiling tool, not part of tern).
$(B)/libtern-timeline.so: tools/gpu/kernel_timeline.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -Wextra -fPIC -shared -I$(CUDA_HOME)/include -o $@ $< -L$(CUDA_HOME)/lib -L$(CUDA_HOME)/lib64 -lcupti

# (the Makefile includes the .d files of LIB_OBJ, which now holds CUDA_OBJ)
-include $(CUDA_TEST_OBJ:.o=.d)
endif

.PHONY: test-cuda
# Arguments for the checker (e.g. TEST_CUDA_ARGS="--time --out DIR").
# Every op check once, then the GPU engine against the CPU engine
# (tests/gpu/check_engine.c).
test-cuda:
	$(MAKE) CUDA=1 B=build-cuda build-cuda/tern-cuda-tests build-cuda/tern-cuda-engine-tests build-cuda/tern
	build-cuda/tern-cuda-tests $(TEST_CUDA_ARGS)
	build-cuda/tern-cuda-engine-tests
