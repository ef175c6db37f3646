#!/usr/bin/env bash
# The llama.cpp sources our llama-cpp-python vendors, prepared for a build that runs on every
# x86-64 CPU (sourced by build-llama-cpp-python.sh and build-llama-server.sh, so that the embedded
# engine and llama-server are built alike). Usage: . llama-cpp-source.sh VERSION WORK_DIR PIP
# Sets $sdist (the extracted sdist) and $portable_cmake_args.
#
# ggml's CPU kernels are built once per CPU family (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS) and
# the best one for the CPU is loaded at run time, so a wheel pip cached on one machine is right
# on the next. Of llama.cpp's 14 x86 variants we keep 7 (the others add little over these and
# each costs a minute of compiling on 2 cores): x64 (any x86-64), haswell (AVX2), alderlake
# (AVX2 + AVX-VNNI), skylakex (AVX-512), cascadelake (+VNNI), icelake (+VBMI), zen4 (+BF16: AMD
# Zen 4/5 and Intel Sapphire Rapids and later). sapphirerapids, the AMX variant, is left out:
# ggml_backend_amx_mul_mat segfaults on the first multi-token batch (llama.cpp #20824), and it
# scores highest on exactly the CPUs it crashes on. docs/engines.md says more.
version=$1 work=$2 pip=$3
"$pip" download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
sdist="$work/llama_cpp_python-$version"
keep="x64 haswell alderlake skylakex cascadelake icelake zen4"
cmakelists="$sdist/vendor/llama.cpp/ggml/src/CMakeLists.txt"
python3 - "$cmakelists" $keep <<'PY'
import re, sys
path, keep = sys.argv[1], set(sys.argv[2:])
lines = open(path).read().split("\n")
pattern = re.compile(r"^\s*ggml_add_cpu_backend_variant\((\w+)\s+.*\)|^\s*ggml_add_cpu_backend_variant\((x64)\)")
x86 = False
kept, out = set(), []
for line in lines:
    if 'GGML_SYSTEM_ARCH STREQUAL "x86"' in line:
        x86 = True
    elif "GGML_SYSTEM_ARCH STREQUAL" in line:
        x86 = False
    m = pattern.match(line)
    if x86 and m:
        name = m.group(1) or m.group(2)
        if name not in keep:
            continue
        kept.add(name)
    out.append(line)
if kept != keep:
    sys.exit(f"{path}: x86 CPU variants {sorted(keep - kept)} not found: the variant list changed")
open(path, "w").write("\n".join(out))
PY
portable_cmake_args="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON"
