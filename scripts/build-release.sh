#!/usr/bin/env bash
# The release build: the workspace, and on Linux the airlock binary linked
# statically (static-pie, so still address-randomised). A static binary
# starts without the dynamic loader mapping and binding libc, libm and
# libgcc_s, which is about a third of `airlock run -- /bin/true` on a
# small machine (docs/src/performance.md). Only the final link of airlock
# differs: its dependencies, and the build scripts and procedural macros
# that run on the host, are built as usual (RUSTFLAGS would reach those
# too, and a procedural macro cannot be linked statically). The binary is
# also optimised as one unit (fat LTO, one codegen unit): a minute more of
# build, 0.2 ms less of every `run` (a smaller image to map and relocate).
#
#     scripts/build-release.sh            # then target/release/airlock
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(uname -s)" = Linux ]; then
    cargo build --release --locked --workspace --exclude airlock "$@"
    cargo rustc --release --locked -p airlock --bin airlock "$@" -- \
        -C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs \
        -C lto=fat -C codegen-units=1
else
    cargo build --release --locked --workspace "$@"
fi
