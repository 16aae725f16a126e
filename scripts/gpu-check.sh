#!/usr/bin/env bash
# memplan GPU check: runs the prebuilt pieces on a machine with an NVIDIA GPU and writes ONE
# JSON report. Needs no Rust toolchain: build the folder first with `cargo xtask gpu-check`
# (on any machine), copy it over, then run:
#
#   target/gpu-check/gpu-check.sh [--out REPORT.json] [--device N] [--python PYTHON]
#
# Steps (each one's output and exit code go into the report; a failing step does not stop the
# others):
#   env     nvidia-smi's view of the GPUs (when nvidia-smi exists)
#   tests   the CUDA backend's GPU tests: `memplan-backend-cuda-tests --ignored --test-threads=1`
#   devices `memplan devices --json`
#   probe   `memplan probe cuda:N --calibrate --json` (without --calibrate when the CLI lacks it)
#   graphs  `gpu_report graphs`: real graphs of several sizes, graph-pool window vs free drop
#   conformance  `memplan-conformance --device cuda:N` (when the bundle has it)
#   torch   with PyTorch: memplan's free vs torch.cuda.mem_get_info (same moment, both contexts
#           alive; must agree within 2 MiB) and the memory a torch.cuda.graph capture takes
#   python_engine  with PyTorch and the bundle's wheel: torch_engine.py, memplan's engine hooks
#           on torch.cuda, runs memplan.engine.start_up on cuda:N
# Exit status: 0 when the report was written and every check that ran passed, 1 otherwise.
set -u

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$PWD/gpu-report.json"
DEVICE=0
PYTHON="${PYTHON:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --device) DEVICE="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; exit 2 ;;
  esac
done

for f in memplan gpu_report memplan-backend-cuda-tests; do
  if [ ! -x "$HERE/$f" ]; then
    echo "gpu-check: $HERE/$f is missing: build this folder with \`cargo xtask gpu-check\`" >&2
    exit 2
  fi
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/memplan-gpu-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
export CUDA_DEVICE_ORDER="${CUDA_DEVICE_ORDER:-PCI_BUS_ID}"

# step NAME CMD...: run, keep stdout in $WORK/NAME, stderr in $WORK/NAME.err, rc in $WORK/NAME.rc
step() {
  local name="$1"; shift
  echo "gpu-check: $name: $*" >&2
  "$@" >"$WORK/$name" 2>"$WORK/$name.err"
  local rc=$?
  echo "$rc" >"$WORK/$name.rc"
  echo "gpu-check: $name: exit $rc" >&2
  return 0
}

if command -v nvidia-smi >/dev/null 2>&1; then
  step env nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,mig.mode.current --format=csv
fi
step tests env MEMPLAN_GPU_TEST_DEVICE="$DEVICE" "$HERE/memplan-backend-cuda-tests" --ignored --test-threads=1
step devices "$HERE/memplan" devices --json
step probe "$HERE/memplan" probe "cuda:$DEVICE" --calibrate --json
echo '"with --calibrate"' >"$WORK/probe_mode"
if [ "$(cat "$WORK/probe.rc")" != 0 ] && grep -qiE "unexpected argument|unknown (argument|option|flag)|--calibrate" "$WORK/probe.err"; then
  echo "gpu-check: probe: this CLI has no --calibrate; probing without it" >&2
  echo '"without --calibrate: this CLI does not have the flag"' >"$WORK/probe_mode"
  step probe "$HERE/memplan" probe "cuda:$DEVICE" --json
fi
step graphs "$HERE/gpu_report" graphs --device "$DEVICE"
# skip NAME WHY: the step did not run; the report says so (a piece without an exit code).
skip() {
  echo "gpu-check: $1: SKIPPED: $2" >&2
  echo "skipped: $2" >"$WORK/$1"
}

if [ -x "$HERE/memplan-conformance" ]; then
  step conformance "$HERE/memplan-conformance" --device "cuda:$DEVICE" --json "$WORK/conformance.json"
  [ -f "$WORK/conformance.json" ] && mv "$WORK/conformance.json" "$WORK/conformance.report"
else
  skip conformance "this bundle has no memplan-conformance (see the warning of \`cargo xtask gpu-check\`)"
fi

if "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  cat >"$WORK/torch_check.py" <<'PY'
import json, subprocess, sys
import torch

hold, dev = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
torch.cuda.set_device(dev)
torch.zeros(1, device="cuda")  # create torch's context first
torch.cuda.synchronize()
out = {"torch_version": torch.__version__, "torch_cuda": torch.version.cuda}

# 1. free memory at the same moment, both processes holding their contexts.
p = subprocess.Popen([hold, "hold", "--device", str(dev)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
first = json.loads(p.stdout.readline())
torch.cuda.synchronize()
tfree, ttotal = torch.cuda.mem_get_info(dev)
p.stdin.write("\n"); p.stdin.flush()
second = json.loads(p.stdout.readline())
p.wait()
diffs = [abs(tfree - first["free"]), abs(tfree - second["free"])]
out["free_compare"] = {
    "torch_free": tfree, "torch_total": ttotal,
    "memplan_free_before": first["free"], "memplan_free_after": second["free"],
    "memplan_total": first["total"], "max_diff_bytes": max(diffs),
    "within_2mib": max(diffs) <= 2 * MIB and first["total"] == ttotal,
}

# 2. memory a torch.cuda.graph capture of a small model takes.
def small_model():
    m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024))
    return m.cuda().half().eval()

def reading():
    torch.cuda.synchronize()
    free, _ = torch.cuda.mem_get_info(dev)
    return {"free": free, "reserved": torch.cuda.memory_reserved(dev), "allocated": torch.cuda.memory_allocated(dev)}

def window(a, b):
    w = {"free_drop": a["free"] - b["free"], "reserved_delta": b["reserved"] - a["reserved"],
         "allocated_delta": b["allocated"] - a["allocated"]}
    w["outside_allocator"] = w["free_drop"] - w["reserved_delta"]
    return w

def capture(model, batch, flush_before_baseline):
    x = torch.randn(batch, 1024, device="cuda", dtype=torch.half)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    if flush_before_baseline:
        torch.cuda.empty_cache()       # memplan's rule: release cached memory before the baseline
    else:
        junk = torch.empty(64 * MIB, dtype=torch.uint8, device="cuda"); del junk  # 64 MiB cached
    base = reading()
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):  # enters with empty_cache()
        y = model(x)
    after_capture = reading()
    g.replay()
    after_replay = reading()
    res = {"batch": batch, "flush_before_baseline": flush_before_baseline,
           "capture": window(base, after_capture), "capture_and_replay": window(base, after_replay)}
    del g, y, x
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    return res

model = small_model()
out["graph_capture"] = [capture(model, b, True) for b in (1, 8, 64, 256)]
out["graph_capture_without_flush"] = capture(model, 64, False)
print(json.dumps(out, indent=2))
PY
  step torch "$PYTHON" "$WORK/torch_check.py" "$HERE/gpu_report" "$DEVICE"
else
  skip torch "PyTorch with CUDA not found for $PYTHON (use --python): free memory was not compared with torch.cuda.mem_get_info"
fi

# python_engine: the Python package's measured start-up with a PyTorch engine
# (python/examples/torch_engine.py: memplan's engine hooks on torch.cuda), from the bundle's wheel.
WHEEL="$(ls "$HERE"/memplan-*.whl 2>/dev/null | head -n 1)"
if [ -z "$WHEEL" ] || [ ! -f "$HERE/torch_engine.py" ]; then
  skip python_engine "this bundle has no memplan wheel or torch_engine.py (\`cargo xtask gpu-check\` adds them where maturin is installed)"
elif ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  skip python_engine "PyTorch with CUDA not found for $PYTHON (use --python): the Python engine hooks were not run"
elif ! "$PYTHON" -m pip install --quiet --no-deps --target "$WORK/pylib" "$WHEEL" >"$WORK/pip.log" 2>&1; then
  skip python_engine "pip could not install $(basename "$WHEEL") for $PYTHON: $(tail -n 1 "$WORK/pip.log")"
else
  step python_engine env PYTHONPATH="$WORK/pylib" "$PYTHON" "$HERE/torch_engine.py" --device "$DEVICE"
fi

# Stderr of each step goes into the report too, as its own text piece.
pieces=()
pieces+=("probe_mode=$WORK/probe_mode")
[ -f "$WORK/conformance.report" ] && pieces+=("conformance.report=$WORK/conformance.report")
for name in env tests devices probe graphs conformance torch python_engine; do
  [ -f "$WORK/$name" ] || continue   # ran (with an .rc) or skipped (without one)
  pieces+=("$name=$WORK/$name")
  [ -s "$WORK/$name.err" ] && pieces+=("$name.stderr=$WORK/$name.err")
done
# assemble writes the report and judges its checks: 0 all passed (checks that did not run are
# null and listed), 3 written but a check failed, anything else: no report.
"$HERE/gpu_report" assemble --out "$OUT" "${pieces[@]}"
rc=$?
case $rc in
  0) echo "gpu-check: report written to $OUT; every check that ran passed" >&2; exit 0 ;;
  3) echo "gpu-check: report written to $OUT; some checks FAILED (see \"checks\" in the report)" >&2; exit 1 ;;
  *) echo "gpu-check: the report could not be written (gpu_report assemble exit $rc)" >&2; exit 1 ;;
esac
