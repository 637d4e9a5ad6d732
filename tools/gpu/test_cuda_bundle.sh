#!/usr/bin/env bash
# test_cuda_bundle.sh BIN_DIR — on a GPU machine without the build's
# dependencies: make test-cuda's commands (mk/cuda.mk's recipe, its build
# line left out) on binaries built elsewhere and copied into BIN_DIR
# (tern-cuda-tests, tern-cuda-engine-tests; ../shared/tools/bundle-binary
# puts them and their libraries in .bundle/bin and .bundle/lib). Run from
# the repository root; prints each command's exit status, exits non-zero
# if any failed.
set -u
bin=${1:?usage: test_cuda_bundle.sh BIN_DIR}
cd "$(dirname "$0")/../.."
fails=0
while IFS= read -r line; do
    echo "+ $line"
    bash -c "$line" || { echo "test_cuda_bundle: failed: $line"; fails=$((fails + 1)); }
done < <(awk '/^test-cuda:/ {f = 1; next} f && /^\t/ {print substr($0, 2)} f && !/^\t/ {f = 0}' mk/cuda.mk |
         tail -n +2 | sed -e "s#build-cuda/#$bin/#g" -e 's#\$\$#$#g' -e 's#\$(TEST_CUDA_ARGS)##')
echo "test_cuda_bundle: $fails command(s) failed"
[ "$fails" -eq 0 ]
