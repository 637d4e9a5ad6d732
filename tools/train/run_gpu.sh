#!/usr/bin/env bash
# Trains tern-tiny on the GPU machine (one H200; python3 with torch + transformers + tokenizers + safetensors).
#
#   bash tools/train/run_gpu.sh [extra train.py flags]          (from the repo root)
#
# Inputs (built on a machine with Debian's archive and carried along): data/corpus/{train,heldout}.txt,
# data/corpus/stats.json and data/tokenizer/ (build_corpus.py, train_tokenizer.py). Output: $OUT/tern-tiny/
# (or ./out/tern-tiny without $OUT) with exactly 8 files, each under 16 MiB: config.json, generation_config.json,
# model-0000{1,2,3}-of-00003.safetensors + model.safetensors.index.json (the BF16 weights split for the transfer
# limit; finalize.py merges them), reference.safetensors and metrics.json (losses, metrics, timings).
# Training stops after BUDGET seconds (default 300) or 6 epochs, whichever comes first (the batch is fitted to
# the budget after probing the step time); everything else (start, probe, tokenisation, saving, fp32 CPU references
# and their prompt choice, final held-out evaluation) takes about a minute more.
# Extra flags go to train.py and override the defaults, e.g. `--device cpu --max-steps 20 --batch 2` for a test.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST="${OUT:-$PWD/out}/tern-tiny"
mkdir -p "$DEST"
export PYTHONUNBUFFERED=1 USE_HUB_KERNELS=0 TOKENIZERS_PARALLELISM=true
for f in data/corpus/train.txt data/corpus/heldout.txt data/tokenizer/tokenizer.json; do
    [ -s "$f" ] || { echo "missing $f: build it with tools/train/build_corpus.py and train_tokenizer.py and carry data/corpus + data/tokenizer" >&2; exit 2; }
done
python3 -c 'import sys, torch, transformers, tokenizers, safetensors; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "safetensors", safetensors.__version__)'
start=$(date +%s)
python3 tools/train/train.py --device cuda --out "$DEST" --time-budget-s "${BUDGET:-300}" \
    --shard-mib 15.5 --no-tokenizer-copy "$@"
echo "run_gpu.sh: done in $(( $(date +%s) - start )) s"
ls -l "$DEST"
