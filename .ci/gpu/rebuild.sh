#!/usr/bin/env bash
# GPU machine: copies the plugin sources that differ from $HOME/src's and rebuilds incrementally.
set -euo pipefail
find plugins -type f | while read -r f; do
  cmp -s "$f" "$HOME/src/$f" || { mkdir -p "$(dirname "$HOME/src/$f")"; cp "$f" "$HOME/src/$f"; echo "changed $f"; }
done
cd "$HOME/src"
cmake --build build-dev -j"$(nproc)" > "$HOME/build.log" 2>&1 || { grep -m5 -A12 "error" "$HOME/build.log"; exit 1; }
tail -1 "$HOME/build.log"
