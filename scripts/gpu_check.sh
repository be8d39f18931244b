#!/usr/bin/env bash
# GPU check of the CUDA kernels, for a bare GPU machine (torch, nvcc, Python 3.12; no network). Run from
# anywhere:
#
#   bash scripts/gpu_check.sh [OUT_DIR]        (default: $OUT, else ./gpu_check_out)
#
# 1. installs every wheel of the repository's .whl/ folder (ninja, pytest and its dependencies, when the
#    machine lacks them) into /tmp/site, put on PYTHONPATH and PATH;
# 2. builds the extension in place for Hopper only (RANGESWA_CUDA_ARCHS=90a, MAX_JOBS=16);
# 3. runs the CUDA tests (tests/test_ops_cuda.py, tests/test_build.py);
# 4. runs the GPU attention benchmark (benchmarks/bench_gpu_attention.py --quick);
# 5. runs the ELF-B sampling benchmark (benchmarks/bench_gpu_sampling.py --model elf-b: 32 steps, B = 16, bf16, 8k/4k/2k,
#    longest first, 2 repeats);
# 6. runs the LangFlow-OWT sampling benchmark (--model langflow-owt: 32 of its Euler steps, B = 16, bf16, 8k only,
#    2 repeats; per-step ms and the speed-up over full);
# and writes build.log, tests.log (all runs; crashes.txt names a test that crashed the interpreter), tests_run*.log, tests.xml, bench.json, bench.md, gpu_elf-b_sampling.{json,md},
# gpu_langflow-owt_sampling.{json,md}, summary.json and summary.md to OUT_DIR. Each step has a time limit so
# the whole check stays under 11 minutes on one H200.
# Exit status: 0 all passed, 1 a step failed, 2 no usable GPU or toolchain (nothing was run).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT_DIR="${1:-${OUT:-$ROOT/gpu_check_out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
PY="${PYTHON:-python3}"
START=$(date +%s)
log() { echo "[gpu_check $(( $(date +%s) - START ))s] $*"; }

# --- 0. a GPU and a toolchain, or stop at once -------------------------------------------------------
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.version.cuda else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA device visible to torch ($PY: torch.cuda.is_available() is False, or torch is not" \
       "a CUDA build); run this on a machine with an NVIDIA GPU" >&2
  exit 2
fi
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "gpu_check: nvcc not found at $CUDA_HOME/bin/nvcc; set CUDA_HOME to the CUDA toolkit" >&2
  exit 2
fi
export PATH="$CUDA_HOME/bin:$PATH"

# --- 1. wheels --------------------------------------------------------------------------------------
SITE=/tmp/site
if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
  log "installing $(ls "$ROOT"/.whl/*.whl | wc -l) wheels from .whl/ into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$ROOT"/.whl/*.whl || { echo "gpu_check: wheel install failed" >&2; exit 1; }
else
  log "no .whl/ folder: using the machine's packages"
fi
export PYTHONPATH="$ROOT/python:$SITE${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH"
command -v ninja >/dev/null || log "warning: ninja not found (put its wheel in .whl/): the build will be serial and slow"

# --- 2. build ---------------------------------------------------------------------------------------
log "building for sm_90a (MAX_JOBS=16)"
B0=$(date +%s)
(cd "$ROOT" && RANGESWA_CUDA_ARCHS=90a MAX_JOBS=16 timeout 300 "$PY" setup.py build_ext --inplace) >"$OUT_DIR/build.log" 2>&1
BUILD_RC=$?
BUILD_S=$(( $(date +%s) - B0 ))
log "build exit $BUILD_RC after ${BUILD_S}s"

# --- 3. tests ---------------------------------------------------------------------------------------
TESTS_RC=-1
if [ $BUILD_RC -eq 0 ]; then
  if "$PY" -c "import pytest" 2>/dev/null; then
    # A crash (signal) in one test would hide every test after it: the crashing test is read from the
    # faulthandler trace, deselected, and the run repeated (at most 3 crashes), all within 240 s.
    # First a probe: the CPU bad-input tests, so a crash on any C++ exception shows apart from the CUDA path.
    log "CPU bad-input probe"
    (cd "$ROOT" && timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_bad_inputs.py) >"$OUT_DIR/tests.log" 2>&1
    log "probe exit $?: $(tail -1 "$OUT_DIR/tests.log")"
    log "CUDA tests"
    DESELECT=()
    T0=$(date +%s)
    for attempt in 1 2 3 4; do
      left=$(( 240 - ($(date +%s) - T0) ))
      [ $left -gt 20 ] || break
      (cd "$ROOT" && timeout $left "$PY" -m pytest -q -p no:cacheprovider tests/test_ops_cuda.py tests/test_build.py \
          "${DESELECT[@]}" --junitxml="$OUT_DIR/tests.xml") >"$OUT_DIR/tests_run$attempt.log" 2>&1
      TESTS_RC=$?
      cat "$OUT_DIR/tests_run$attempt.log" >>"$OUT_DIR/tests.log"
      log "tests (run $attempt) exit $TESTS_RC: $(tail -1 "$OUT_DIR/tests_run$attempt.log")"
      [ $TESTS_RC -ge 128 ] || break   # finished (passed or failed) or timed out (124)
      crashed=$(grep -m1 -oE 'tests/[a-z_]+\.py", line [0-9]+ in test_[A-Za-z0-9_]+' "$OUT_DIR/tests_run$attempt.log" \
          | sed -E 's/", line [0-9]+ in /::/')
      [ -n "$crashed" ] || break
      log "crashed in $crashed; deselecting it and running the rest"
      echo "CRASHED: $crashed (exit $TESTS_RC)" >>"$OUT_DIR/crashes.txt"
      DESELECT+=(--deselect "$crashed")
    done
  else
    echo "pytest is not installed: put its wheels (pytest, iniconfig, pluggy, packaging) in .whl/" >"$OUT_DIR/tests.log"
    log "no pytest; tests skipped"
  fi
fi

# --- 4 and 5. benchmarks, each given what is left until its deadline (seconds after START) -----------
# run_budgeted NAME DEADLINE MARGIN LOGFILE SCRIPT [ARGS...]: runs SCRIPT with --budget-s (time left minus
# MARGIN) and --out, killed at the deadline; sets STEP_RC to its exit status, -1 when it did not run.
run_budgeted() {
  local name=$1 deadline=$2 margin=$3 logfile=$4
  shift 4
  local remain=$(( deadline - ($(date +%s) - START) ))
  STEP_RC=-1
  [ $BUILD_RC -eq 0 ] || return 0
  if [ $remain -le $(( margin + 15 )) ]; then
    log "no time left for the $name"
    return 0
  fi
  log "$name (budget $((remain - margin))s)"
  (cd "$ROOT" && timeout $remain "$PY" "$@" --budget-s $((remain - margin)) --out "$OUT_DIR") >>"$logfile" 2>&1
  STEP_RC=$?
  log "$name exit $STEP_RC"
}

run_budgeted "attention benchmark" 330 15 "$OUT_DIR/tests.log" benchmarks/bench_gpu_attention.py --quick
BENCH_RC=$STEP_RC
# ELF-B sampling: 32 steps, B = 16, bf16, 8k/4k/2k longest first, 2 repeats.
run_budgeted "ELF-B sampling benchmark" 470 30 "$OUT_DIR/elf.log" benchmarks/bench_gpu_sampling.py --model elf-b --repeats 2
ELF_RC=$STEP_RC
# LangFlow-OWT sampling: 32 Euler steps (of its 1024), B = 16, bf16, 8k, 2 repeats.
run_budgeted "LangFlow-OWT sampling benchmark" 650 30 "$OUT_DIR/langflow.log" benchmarks/bench_gpu_sampling.py \
    --model langflow-owt --steps 32 --lengths 8192 --batch 16 --repeats 2
LANGFLOW_RC=$STEP_RC
# LLaDA-8B-shaped attention layer (32 heads of 128, windows scaled to T = 4096): bf16 against SDPA-flash.
run_budgeted "LLaDA layer benchmark" 720 10 "$OUT_DIR/llada.log" benchmarks/bench_cpu_llada_layer.py \
    --device cuda --dtype bf16 --repeats 10 --full-repeats-32k 10
LLADA_RC=$STEP_RC

# --- summary ----------------------------------------------------------------------------------------
TOTAL_S=$(( $(date +%s) - START ))
"$PY" - "$OUT_DIR" "$BUILD_RC" "$BUILD_S" "$TESTS_RC" "$BENCH_RC" "$ELF_RC" "$LANGFLOW_RC" "$LLADA_RC" "$TOTAL_S" <<'EOF'
import glob, json, os, re, sys
out, build_rc, build_s, tests_rc, bench_rc, elf_rc, langflow_rc, llada_rc, total_s = sys.argv[1], *map(int, sys.argv[2:])
import torch
summary = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, cuda=torch.version.cuda,
               build_ok=build_rc == 0, build_seconds=build_s, tests_exit=tests_rc, bench_exit=bench_rc,
               elf_bench_exit=elf_rc, langflow_bench_exit=langflow_rc, llada_bench_exit=llada_rc,
               total_seconds=total_s)
def tests_line(log):
    """pytest's closing line; for a run that a crash or the time limit cut short (no closing line), the
    outcomes its progress characters show until then, so that a segfault does not read as "no test ran"."""
    closing = re.findall(r"=+ (.*) in [0-9.]+s", log)
    if closing:
        return closing[-1]
    # pytest -q: one character per test ("." passed, "F" failed, "E" error, "s" skipped), then "[ NN%]".
    progress = "".join(re.findall(r"^([.FEsxX]+)(?: +\[ *\d+%\]$|Fatal Python error)", log, re.M))
    if not progress:
        return None
    counts = {"passed": progress.count("."), "failed": progress.count("F"), "errors": progress.count("E"),
              "skipped": progress.count("s")}
    cut = "a crash (crashes.txt)" if "Fatal Python error" in log else "the time limit"
    return ", ".join(f"{n} {name}" for name, n in counts.items() if n) + f", then {cut}"


runs = sorted(glob.glob(os.path.join(out, "tests_run*.log")))
summary["tests"] = tests_line(open(runs[-1]).read()) if runs else None
crash_file = os.path.join(out, "crashes.txt")
summary["crashed_tests"] = open(crash_file).read().split("\n")[:-1] if os.path.exists(crash_file) else []
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
lines = ["# gpu_check", "", "| item | value |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in summary.items()]
names = ["bench.md", "gpu_elf-b_sampling.md", "gpu_langflow-owt_sampling.md"]
names += sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "gpu_llada_layer_*.md")))
for name in names:
    if os.path.exists(os.path.join(out, name)):
        lines += ["", open(os.path.join(out, name)).read()]
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:len(summary) + 4]))
EOF
[ $BUILD_RC -eq 0 ] && [ $TESTS_RC -eq 0 ] && [ $BENCH_RC -eq 0 ] && [ $ELF_RC -eq 0 ] && [ $LANGFLOW_RC -eq 0 ] \
  && [ $LLADA_RC -eq 0 ] && exit 0
exit 1
