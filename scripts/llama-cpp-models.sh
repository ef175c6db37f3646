#!/usr/bin/env bash
# llama.cpp's tokenizer test files (models/ggml-vocab-*.gguf with their .inp/.out vectors) and
# its collection of real chat templates (models/templates/*.jinja), taken from the llama-cpp-python
# sdist that the embedded engine is built from (tests and bench use them; never committed).
# Usage: llama-cpp-models.sh VERSION DEST PIP
set -euo pipefail
version=$1 dest=$2 pip=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$pip" download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work" --wildcards \
    "llama_cpp_python-$version/vendor/llama.cpp/models/ggml-vocab-*" \
    "llama_cpp_python-$version/vendor/llama.cpp/models/templates/*"
rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
mv "$work/llama_cpp_python-$version/vendor/llama.cpp/models/"* "$dest.tmp/"
rm -rf "$dest" && mv "$dest.tmp" "$dest"
echo "llama.cpp's vocabulary files and chat templates in $dest:" \
     "$(ls "$dest"/ggml-vocab-*.gguf | wc -l) vocabularies, $(ls "$dest"/templates | wc -l) templates"
