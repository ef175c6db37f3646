#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from exactly the llama.cpp sources our llama-cpp-python
# vendors, with the same CPU variants (llama-cpp-source.sh), so that its numerics and kernels
# match the embedded engine's: it loads the best variant for the CPU from beside itself, as the
# engine does from llama_cpp/lib. For the tests and benchmarks that run tokenwire in front of a
# real llama-server. Usage: build-llama-server.sh VERSION OUT_DIR PIP
# Only the llama-server target is built (about 8 minutes on 2 cores); OUT_DIR gets the binary
# and its libraries.
set -euo pipefail
version=$1 out=$2 pip=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'tail -n 40 "$work"/*.log >&2 2>/dev/null' ERR
. "$(dirname "$0")/llama-cpp-source.sh" "$version" "$work" "$pip"
src="$sdist/vendor/llama.cpp"
# no network at build time: the web UI is not downloaded, HTTPS model downloads not linked;
# the libraries found beside the binary ($ORIGIN), wherever OUT_DIR is
# shellcheck disable=SC2086
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  $portable_cmake_args -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN' \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$work/configure.log" 2>&1
cmake --build "$work/build" --config Release --target llama-server -j"$(nproc)" > "$work/build.log" 2>&1
mkdir -p "$out.tmp"
cp -P "$work"/build/bin/*.so* "$out.tmp/"
install -m 0755 "$work/build/bin/llama-server" "$out.tmp/llama-server"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "built $out/llama-server from llama-cpp-python $version's llama.cpp ($(cd "$out" && ls libggml-cpu-*.so | sed 's/libggml-cpu-//; s/\.so//' | tr '\n' ' '))"
