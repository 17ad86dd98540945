#!/usr/bin/env bash
# Type-check the macOS build from Linux (no linking): the Seatbelt spawn is
# the only macOS code, and this keeps it compiling. ring's build script
# wants a macOS C compiler; type-checking needs none, so a stand-in that
# preprocesses with gcc and writes empty objects is enough.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add x86_64-apple-darwin >/dev/null
fake="$(mktemp -d)"
cat > "$fake/cc" <<'CC'
#!/bin/sh
case "$1" in -\?) exit 1;; esac
for a in "$@"; do
  case "$a" in -E) last=""; for b in "$@"; do last="$b"; done; exec gcc -E "$last";; esac
done
out=""; prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
[ -n "$out" ] && : > "$out"
exit 0
CC
chmod +x "$fake/cc"
CC_x86_64_apple_darwin="$fake/cc" AR_x86_64_apple_darwin=ar \
  cargo clippy -p airlock --target x86_64-apple-darwin -- -D warnings
