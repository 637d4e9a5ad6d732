#!/usr/bin/env bash
# Runs the tern serve end-to-end tests: tests/server/run.sh [pytest args]
#   TERN_BIN=build-asan/tern tests/server/run.sh tests/server/test_corpus.py    (the ASan run)
# TERN_BIN: the tern binary (default build/tern), relative to the repository root or absolute.
set -euo pipefail
cd "$(dirname "$0")/../.."
pydeps=$(tests/server/setup.sh)
export TERN_BIN="${TERN_BIN:-build/tern}"
if [ ! -x "$TERN_BIN" ]; then
    echo "tests/server/run.sh: $TERN_BIN is missing (make, or make asan for build-asan/tern)" >&2
    exit 2
fi
# the whole directory unless the arguments name tests (a path or a node id)
named=0
for a in "$@"; do case "$a" in tests/*|*.py|*::*) named=1 ;; esac; done
if [ $named -eq 0 ]; then set -- tests/server "$@"; fi
PYTHONPATH="$pydeps" exec python3 -m pytest -q -p no:cacheprovider "$@"
