#!/usr/bin/env bash
# Build llama-cpp-python as one wheel that runs on every x86-64 CPU: ggml's CPU kernels once per
# CPU family, the engine loading the best one at start (tokenwire.engines.cpu). pip's own wheel
# cache is keyed by the sdist, not by how it was built, so a `-march=native` wheel cached on one
# machine would be reused on another; this wheel lives in a folder of its own, named by the
# build's recipe. Usage: build-llama-cpp-python.sh VERSION WHEEL_DIR PIP (about 10 minutes on 2
# cores, once; the Makefile installs the wheel from WHEEL_DIR).
set -euo pipefail
version=$1 out=$2 pip=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/llama-cpp-source.sh" "$version" "$work" "$pip"
# the variant libraries beside libllama.so, in the package (ggml installs them in bin/)
export CMAKE_ARGS="$portable_cmake_args -DCMAKE_INSTALL_BINDIR=llama_cpp/lib"
"$pip" wheel --quiet --no-deps --no-cache-dir -w "$work/wheel" "$sdist" > "$work/build.log" 2>&1 \
  || { tail -n 40 "$work/build.log" >&2; exit 1; }
wheel=$(ls "$work"/wheel/llama_cpp_python-*.whl)
python3 - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
variants = sorted(n.split("libggml-cpu-")[1] for n in names if "/lib/libggml-cpu-" in n)
if not any(v.startswith("haswell") for v in variants) or any("sapphirerapids" in v for v in variants):
    sys.exit(f"unexpected CPU variants in the wheel: {variants}")
print("CPU variants:", " ".join(v.split(".")[0] for v in variants))
PY
mkdir -p "$out"
cp "$wheel" "$out/"
echo "built $out/$(basename "$wheel")"
