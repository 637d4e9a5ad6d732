#!/usr/bin/env bash
# Installs the Debian packages tern's build and tests need. Idempotent: does
# nothing when every package is already present.
set -euo pipefail
# clang and libclang-rt-dev (libFuzzer, only recommended by clang) for make fuzz.
# libjs-marked and libjs-highlight.js: markdown and code highlighting on the chat
# page (tern serve reads them from /usr/share/javascript); chromium and
# chromium-driver: the page's browser test.
pkgs=(build-essential pkg-config libjansson-dev libcriterion-dev libpcre2-dev
      libutf8proc-dev libssl-dev libmicrohttpd-dev libcurl4-openssl-dev clang libclang-rt-dev
      libjs-marked libjs-highlight.js chromium chromium-driver)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
