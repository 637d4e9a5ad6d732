#!/usr/bin/env bash
# Installs the Python packages of the server tests (requirements.txt) into build/pydeps, once per version of
# requirements.txt (a stamp file holds its hash), and prints the PYTHONPATH to use.
# Wheels in /tmp/pipdl are used when present; otherwise pip's configured index.
set -euo pipefail
cd "$(dirname "$0")/../.."
req=tests/server/requirements.txt
target=build/pydeps
stamp="$target/.requirements-$(sha256sum "$req" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "tests/server/setup.sh: installing $req into $target" >&2
    rm -rf "$target"
    links=()
    if [ -d /tmp/pipdl ]; then links=(--find-links /tmp/pipdl); fi
    python3 -m pip install --quiet --disable-pip-version-check --target "$target" "${links[@]}" -r "$req" >&2
    touch "$stamp"
fi
echo "$PWD/$target"
