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
# (src/cuda/trace.cuh; TERN_PHASE_TRACE=FILE at run time writes it).
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
# The one-token GEMV's cases again with each of its kernels forced (some run
# only when forced), with the norm's weights read after the wait, with the
# staged kernel's first tiles requested before the wait (the default: once
# the input's loads are issued), the
# attention's on the FP32 split kernel (16-bit KV
# takes the tensor-core one by default), with its splits merged by the
# combine kernel instead of inside their cluster (one token, contexts up to
# 1024), with every K/V chunk requested after the wait, the experts' on the float
# gate/up kernel (8-bit experts take the integer dots by default), with
# both MoE kernels launched the ordinary way (no PDL), in two launches
# instead of the one-token one launch, with x read after the weights, and
# with the routed blocks' digits built after the top k and the weight
# requests (the default builds them during the top k), and with the one
# launch's down taking h as floats (the default: as digits), and with its
# down rows staged by every thread's cp.async (the default: bulk copies).
# Then the GPU engine against the CPU engine (tests/gpu/check_engine.c), also
# with the router's epilogue taking the top k instead of the experts' one
# launch, with the router beside the output projection instead of its
# own launch (its linear part [M | N], and its products accumulated), and
# with the experts' one launch summing its chunks as floats (the default:
# fixed-point sums), and with the DeltaNet step and its output projection
# in one launch (the default: two).
test-cuda:
	$(MAKE) CUDA=1 B=build-cuda build-cuda/tern-cuda-tests build-cuda/tern-cuda-engine-tests build-cuda/tern
	build-cuda/tern-cuda-tests $(TEST_CUDA_ARGS)
	for k in regs staged int; do echo "TERN_GEMV1=$$k"; TERN_GEMV1=$$k build-cuda/tern-cuda-tests --only gemv || exit 1; done
	echo "TERN_GEMV1_NORM_PRE=0"; TERN_GEMV1_NORM_PRE=0 build-cuda/tern-cuda-tests --only gemv
	echo "TERN_GEMV1_PRE=2"; TERN_GEMV1_PRE=2 build-cuda/tern-cuda-tests --only gemv
	echo "TERN_ATTN_TC=0"; TERN_ATTN_TC=0 build-cuda/tern-cuda-tests --only attention
	echo "TERN_ATTN_CLUSTER=0"; TERN_ATTN_CLUSTER=0 build-cuda/tern-cuda-tests --only attention
	echo "TERN_ATTN_PRE=0"; TERN_ATTN_PRE=0 build-cuda/tern-cuda-tests --only attention
	echo "TERN_MOE_IDOT8=0"; TERN_MOE_IDOT8=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_MOE_GU_PDL=0 TERN_MOE_DN_TRIGGER=0"; TERN_MOE_GU_PDL=0 TERN_MOE_DN_TRIGGER=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_MOE_SEG=0"; TERN_MOE_SEG=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_MOE_X_FIRST=0"; TERN_MOE_X_FIRST=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_MOE_DIGITS_EARLY=0"; TERN_MOE_DIGITS_EARLY=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_MOE_DOWN_DIGITS=0"; TERN_MOE_DOWN_DIGITS=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_MOE_SEG_BULK=0"; TERN_MOE_SEG_BULK=0 build-cuda/tern-cuda-tests --only moe
	echo "TERN_SAMPLE_ONE=0"; TERN_SAMPLE_ONE=0 build-cuda/tern-cuda-tests --only sample
	echo "TERN_SAMPLE_FAST=0"; TERN_SAMPLE_FAST=0 build-cuda/tern-cuda-tests --only sample
	echo "TERN_SAMPLE_ONE=0 TERN_SAMPLE_FAST=0"; TERN_SAMPLE_ONE=0 TERN_SAMPLE_FAST=0 build-cuda/tern-cuda-tests --only sample
	echo "TERN_MOE_ROUTE=0"; TERN_MOE_ROUTE=0 build-cuda/tern-cuda-engine-tests
	echo "TERN_MOE_LIN=1"; TERN_MOE_LIN=1 build-cuda/tern-cuda-engine-tests
	echo "TERN_MOE_LIN=2"; TERN_MOE_LIN=2 build-cuda/tern-cuda-engine-tests
	echo "TERN_MOE_FX=0"; TERN_MOE_FX=0 build-cuda/tern-cuda-engine-tests
	echo "TERN_GDN_PROJ=1"; TERN_GDN_PROJ=1 build-cuda/tern-cuda-engine-tests
	echo "TERN_ID_DIRECT=0"; TERN_ID_DIRECT=0 build-cuda/tern-cuda-engine-tests
	echo "TERN_DECODE_AHEAD=0"; TERN_DECODE_AHEAD=0 build-cuda/tern-cuda-engine-tests
	build-cuda/tern-cuda-engine-tests
