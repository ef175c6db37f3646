#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from exactly the llama.cpp sources our llama-cpp-python
# vendors (so its numerics match the embedded engine), for the tests and benchmarks that run
# tokenwire in front of a real llama-server. Usage: build-llama-server.sh VERSION OUT_DIR PIP
# The sdist comes from PyPI through pip (and its cache); only the llama-server target is built
# (about 7-9 minutes on 2 cores); the binary is installed as OUT_DIR/llama-server.
set -euo pipefail
version=$1 out=$2 pip=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'tail -n 40 "$work"/*.log >&2 2>/dev/null' ERR
"$pip" download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
# no network at build time: the web UI is not downloaded, HTTPS model downloads not linked
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$work/configure.log" 2>&1
cmake --build "$work/build" --config Release --target llama-server -j"$(nproc)" > "$work/build.log" 2>&1
mkdir -p "$out"
install -m 0755 "$work/build/bin/llama-server" "$out/llama-server.tmp"
mv "$out/llama-server.tmp" "$out/llama-server"
echo "built $out/llama-server from llama-cpp-python $version's llama.cpp"
