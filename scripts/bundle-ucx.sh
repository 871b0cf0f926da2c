#!/usr/bin/env bash
# bundle-ucx.sh PYTHON DEST — puts a UCX built with CUDA transports in DEST (third_party/ucx) for the GPU machine,
# which has no UCX and no package index: the libraries of NVIDIA's libucx-cu13 wheel (from PyPI), debug sections
# stripped (about 3 MB instead of 30), laid out as UCX expects (its transport modules in lib/ucx/ beside libucs).
# scripts/test-gpu.sh puts DEST/lib first on LD_LIBRARY_PATH, so tensorwire's dlopen("libucp.so.0") finds it and
# CUDA tensors cross device memory to device memory ("ucx-cuda"). Idempotent; without network it says so and
# leaves DEST as it was (the GPU run then skips the network tests, as before).
set -euo pipefail
PY=$1
DEST=$2
WHEEL=${TW_UCX_WHEEL:-libucx-cu13==1.22.0}  # (the Makefile passes its UCX_WHEEL)
LAYOUT=2  # (2: the wheel's own libcudart beside the libraries: libucm_cuda needs it)
if [[ -f $DEST/.tw-source && $(cat "$DEST/.tw-source") == "$WHEEL" && $(cat "$DEST/.tw-layout" 2>/dev/null) == "$LAYOUT" ]]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp/wheel" "$WHEEL" >"$tmp/pip.log" 2>&1; then
  echo "bundle-ucx: could not download $WHEEL ($(tail -1 "$tmp/pip.log")): the GPU run will have no UCX" >&2
  exit 0
fi
mkdir -p "$tmp/x"
"$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$(ls "$tmp"/wheel/*.whl)" "$tmp/x"
src=$tmp/x/libucx/lib
out=$tmp/ucx
mkdir -p "$out/lib/ucx"
copy() {  # copy DIR NAME: NAME.so.0.0.0, stripped, as NAME.so.0 (the name the loader and UCX look for: a plain
          # file, since the device tool's carry may drop symbolic links)
  local dir=$1 name=$2 to=$out/lib${1#"$src"}
  mkdir -p "$to"
  cp "$dir/$name.so.0.0.0" "$to/$name.so.0"
  strip --strip-debug "$to/$name.so.0"
}
for l in libucp libucs libuct libucm; do copy "$src" "$l"; done
for m in libuct_cuda libucm_cuda libuct_cma; do copy "$src/ucx" "$m"; done
# The libraries the wheel vendors (libucm_cuda needs its libcudart, found through an RPATH into the wheel's
# libucx_cu13.libs/): beside the others, where LD_LIBRARY_PATH finds them. Without it UCX's CUDA memory hooks do
# not load, and UCX cannot tell device memory from host memory (src/net/ucx.cpp then stages CUDA tensors).
for f in "$tmp"/x/libucx_cu*.libs/libcudart*.so*; do
  if [[ -f $f ]]; then
    cp "$f" "$out/lib/"
    strip --strip-debug "$out/lib/$(basename "$f")"
  fi
done
echo "$WHEEL" >"$out/.tw-source"
echo "$LAYOUT" >"$out/.tw-layout"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$out" "$DEST"
echo "bundle-ucx: $DEST from $WHEEL ($(du -sh "$DEST" | cut -f1))"
