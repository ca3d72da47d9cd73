#!/usr/bin/env bash
# Runs the unit tests of the code whose soundness rests on hand-written unsafe code that
# Miri can execute: the fork-join thread team (crates/fusebox/src/cpu/team.rs: a
# lifetime-erased loop body shared with helper threads, completion by atomics) and the
# tensor storage (crates/fusebox/src/tensor.rs: aligned and taken-over allocations,
# disjoint writable partitions shared between threads). Miri checks them for undefined
# behaviour: out-of-bounds or misaligned accesses, use after free, deallocation with the
# wrong layout, aliasing violations and data races.
#
#   scripts/miri.sh                  # both modules
#   scripts/miri.sh cpu::team        # one test-name filter instead
#
# Needs a nightly toolchain with the miri component:
#   rustup toolchain install nightly --component miri
# MIRI_TOOLCHAIN names another toolchain that has it (default: nightly). MIRIFLAGS is
# passed through (for example -Zmiri-many-seeds=0..8 to try more thread schedules).
# The SIMD kernels are not run here: Miri executes only part of the x86 intrinsics.
# .ci/run installs nightly with miri and runs this.
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain=${MIRI_TOOLCHAIN:-nightly}
if ! cargo "+$toolchain" miri --version >/dev/null 2>&1; then
    cat >&2 <<MSG
scripts/miri.sh: 'cargo +$toolchain miri' is not available.
It needs rustup with a nightly toolchain that has the miri component:
    rustup toolchain install nightly --component miri
(or MIRI_TOOLCHAIN=<toolchain> naming an installed toolchain with miri).
MSG
    exit 2
fi

filters=("$@")
if [ ${#filters[@]} -eq 0 ]; then
    filters=(cpu::team::tests:: tensor::tests::)
fi
cargo "+$toolchain" miri setup
cargo "+$toolchain" miri test -p fusebox --lib -- "${filters[@]}"
