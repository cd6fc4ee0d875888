#!/usr/bin/env bash
# Side-by-side CPU benchmark: llama.cpp (llama-bench, llama-batched-bench) against `kiln bench`,
# same machine, same GGUF model, same thread count. Prints a markdown table (medians over RUNS
# repetitions, with the load average beside them) for docs/benchmarks.md.
#
# llama.cpp is built from the source that ships in the PyPI sdist of llama-cpp-python:
#   pip download --no-deps --no-binary :all: llama-cpp-python==$LLAMACPP_PY_VERSION
# into $LLAMACPP_DIR (outside the repository), with cmake, Release, CPU only, -DGGML_NATIVE=ON.
#
# Usage:
#   scripts/bench-llamacpp.sh            # build llama.cpp if needed, then run both engines
#   scripts/bench-llamacpp.sh --build    # only build llama.cpp
#   scripts/bench-llamacpp.sh --no-kiln  # only llama.cpp
# Environment (defaults in brackets):
#   MODEL [/work/models/SmolLM2-135M-Instruct.Q4_1.gguf]  THREADS [2]  PROMPT [128]  GEN [64]
#   PARALLEL [16]  RUNS [5]  LLAMACPP_DIR [/work/llamacpp]  LLAMACPP_PY_VERSION [0.3.36]
#   KILN [target/release/kiln; built with `cargo build --release` when missing]
#   LLAMACPP_REPACK [auto: 1 unless llama.cpp crashes with it, then 0]
set -euo pipefail

MODEL=${MODEL:-/work/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-128}
GEN=${GEN:-64}
PARALLEL=${PARALLEL:-16}
RUNS=${RUNS:-5}
LLAMACPP_DIR=${LLAMACPP_DIR:-/work/llamacpp}
LLAMACPP_PY_VERSION=${LLAMACPP_PY_VERSION:-0.3.36}
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
KILN=${KILN:-$REPO_ROOT/target/release/kiln}

build_only=0
run_kiln=1
for arg in "$@"; do
    case "$arg" in
        --build) build_only=1 ;;
        --no-kiln) run_kiln=0 ;;
        -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg" >&2; exit 2 ;;
    esac
done

log() { echo "[bench-llamacpp] $*" >&2; }

src_dir="$LLAMACPP_DIR/llama_cpp_python-$LLAMACPP_PY_VERSION/vendor/llama.cpp"
build_dir="$LLAMACPP_DIR/build-$LLAMACPP_PY_VERSION"
llama_bench="$build_dir/bin/llama-bench"
batched_bench="$build_dir/bin/llama-batched-bench"

build_llamacpp() {
    if [[ -x "$llama_bench" && -x "$batched_bench" ]]; then
        return
    fi
    mkdir -p "$LLAMACPP_DIR/sdist"
    local sdist="$LLAMACPP_DIR/sdist/llama_cpp_python-$LLAMACPP_PY_VERSION.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        log "Downloading the llama-cpp-python $LLAMACPP_PY_VERSION sdist from PyPI."
        python3 -m pip download --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMACPP_PY_VERSION" -d "$LLAMACPP_DIR/sdist" >&2
    fi
    if [[ ! -d "$src_dir" ]]; then
        tar -xzf "$sdist" -C "$LLAMACPP_DIR"
    fi
    command -v cmake >/dev/null || { log "cmake is missing: apt-get install -y cmake"; exit 1; }
    log "Configuring llama.cpp (Release, CPU only, GGML_NATIVE=ON) in $build_dir."
    cmake -S "$src_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DBUILD_SHARED_LIBS=OFF >&2
    log "Building llama-bench and llama-batched-bench (slow on 2 cores)."
    cmake --build "$build_dir" --config Release -j "$(nproc)" \
        --target llama-bench llama-batched-bench >&2
}

build_llamacpp
if [[ $build_only == 1 ]]; then
    log "Built: $llama_bench $batched_bench"
    exit 0
fi
[[ -f "$MODEL" ]] || { log "model not found: $MODEL"; exit 1; }

# On CPUs with AMX, GGML_NATIVE builds llama.cpp's AMX weight path ("extra buffer type"), which
# crashed (SIGSEGV in ggml_backend_amx_mul_mat) on our KVM guest. If a tiny run crashes, run
# without extra buffer types (llama-bench --repack 0, llama-batched-bench --no-repack), which
# for Q4_1 weights is llama.cpp's ordinary AVX-512 (VNNI) path. LLAMACPP_REPACK=0|1 forces it.
if [[ -z "${LLAMACPP_REPACK:-}" ]]; then
    if "$llama_bench" -m "$MODEL" -t "$THREADS" -p 8 -n 2 -r 1 >/dev/null 2>&1; then
        LLAMACPP_REPACK=1
    else
        log "llama-bench crashed with its default weight buffers; using --repack 0."
        LLAMACPP_REPACK=0
    fi
fi
bench_repack=(--repack "$LLAMACPP_REPACK")
batched_repack=()
[[ $LLAMACPP_REPACK == 0 ]] && batched_repack=(--no-repack)

if [[ $run_kiln == 1 && ! -x "$KILN" ]]; then
    log "Building kiln (release)."
    (cd "$REPO_ROOT" && cargo build --release --bin kiln >&2)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One JSON object per line in $tmp/results.jsonl: {"engine", "metric", "value"} (tokens/s).
results="$tmp/results.jsonl"
: >"$results"
loads="$tmp/loads.txt"
: >"$loads"

for run in $(seq 1 "$RUNS"); do
    uptime | sed 's/.*load average: //' >>"$loads"
    log "Run $run/$RUNS: llama-bench."
    "$llama_bench" -m "$MODEL" -t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 "${bench_repack[@]}" -o jsonl 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    metric = "prefill_b1" if r["n_prompt"] > 0 else "decode_b1"
    print(json.dumps({"engine": "llama.cpp", "metric": metric, "value": r["avg_ts"]}))
' >>"$results"
    log "Run $run/$RUNS: llama-batched-bench."
    ctx=$(((PROMPT + GEN) * PARALLEL + 64))
    "$batched_bench" -m "$MODEL" -t "$THREADS" -tb "$THREADS" -c "$ctx" -b 2048 -ub 512 \
        -npp "$PROMPT" -ntg "$GEN" -npl "1,$PARALLEL" "${batched_repack[@]}" --output-format jsonl 2>/dev/null |
        python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    b = r["pl"]
    print(json.dumps({"engine": "llama.cpp", "metric": f"prefill_b{b}", "value": r["speed_pp"]}))
    print(json.dumps({"engine": "llama.cpp", "metric": f"decode_b{b}", "value": r["speed_tg"]}))
' | grep -v '"prefill_b1"\|"decode_b1"' >>"$results" || true
    if [[ $run_kiln == 1 ]]; then
        log "Run $run/$RUNS: kiln bench."
        "$KILN" bench --device cpu --model "$MODEL" --threads "$THREADS" \
            --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --concurrency "1,$PARALLEL" --json |
            python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    b = r["concurrency"]
    print(json.dumps({"engine": "kiln", "metric": f"prefill_b{b}", "value": r["prefill_tokens_per_s"]}))
    print(json.dumps({"engine": "kiln", "metric": f"decode_b{b}", "value": r["decode_tokens_per_s"]}))
' >>"$results"
    fi
done

LLAMACPP_REPACK=$LLAMACPP_REPACK python3 - "$results" "$loads" "$MODEL" "$THREADS" "$PROMPT" "$GEN" "$PARALLEL" "$RUNS" <<'EOF'
import json, statistics, sys, os, platform, subprocess
results, loads, model, threads, prompt, gen, parallel, runs = sys.argv[1:]
vals = {}
for line in open(results):
    r = json.loads(line)
    vals.setdefault((r["engine"], r["metric"]), []).append(r["value"])
cpu = "unknown"
for line in open("/proc/cpuinfo"):
    if line.startswith("model name"):
        cpu = line.split(":", 1)[1].strip()
        break
load = [l.strip() for l in open(loads)]
print(f"Machine: {cpu}, {os.cpu_count()} CPUs; model `{os.path.basename(model)}`; threads {threads}; "
      f"prompt {prompt} tokens, {gen} generated; medians of {runs} runs.")
print(f"Load average (1, 5, 15 min) before each run: {'; '.join(load)}")
print(f"llama.cpp weight repacking / AMX: {os.environ.get('LLAMACPP_REPACK', '?')}")
print()
print("| metric (tokens/s) | llama.cpp | kiln | kiln / llama.cpp |")
print("|---|---:|---:|---:|")
rows = [("prefill, batch 1", "prefill_b1"), ("decode, batch 1", "decode_b1"),
        (f"prefill, {parallel} sequences (aggregate)", f"prefill_b{parallel}"),
        (f"decode, {parallel} sequences (aggregate)", f"decode_b{parallel}")]
def med(engine, key):
    v = vals.get((engine, key))
    return statistics.median(v) if v else None
for label, key in rows:
    l, k = med("llama.cpp", key), med("kiln", key)
    ratio = f"{k / l:.2f}" if (l and k) else "–"
    fmt = lambda x: f"{x:.1f}" if x is not None else "–"
    print(f"| {label} | {fmt(l)} | {fmt(k)} | {ratio} |")
EOF
