#!/usr/bin/env bash
# Peer engines for `draftwise bench --endpoint` (docs/peers.md), kept out of draftwise's own
# environment, under .peers/ (ignored by git). Idempotent.
#   llama-server: built from the pinned llama-cpp-python sdist's vendored llama.cpp, the same code
#   draftwise's llama.cpp backend runs (~10 min on 2 cores, once) -> .peers/bin/llama-server, and
#   llama-bench beside it (benchmarks/cost_curves.py native) -> .peers/llama-build/bin/llama-bench
# Usage: scripts/setup_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ver=0.3.36
py=.venv/bin/python
[ -x $py ] || { echo "run scripts/setup.sh first (it makes .venv)"; exit 1; }
mkdir -p .peers/bin
if [ ! -x .peers/bin/llama-server ] || [ ! -x .peers/llama-build/bin/llama-bench ]; then
    src=.peers/llama_cpp_python-$ver
    if [ ! -d "$src" ]; then
        $py -m pip download --quiet --no-deps --no-binary :all: -d .peers llama-cpp-python==$ver
        tar -xzf .peers/llama_cpp_python-$ver.tar.gz -C .peers
    fi
    args="-DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
          -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
    if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then  # as scripts/setup.sh: AMX kernels crash here
        args="$args -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
        for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C avx512f:AVX512 avx512_vnni:AVX512_VNNI \
                 avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
            grep -qw "${f%%:*}" /proc/cpuinfo && args="$args -DGGML_${f##*:}=ON"
        done
    fi
    cmake -S "$src/vendor/llama.cpp" -B .peers/llama-build $args >/dev/null
    cmake --build .peers/llama-build --target llama-server llama-bench -j "$(nproc)"
    ln -sf "$(pwd)/.peers/llama-build/bin/llama-server" .peers/bin/llama-server
fi
.peers/bin/llama-server --version 2>&1 | head -2
