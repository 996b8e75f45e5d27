#!/usr/bin/env bash
# Show vLLM's rule for engines sharing a GPU on a REAL GPU, with torch alone (Issue 39, part 2).
#
# vLLM 0.32.0 measures its memory with the GPU's free memory (torch.cuda.mem_get_info, i.e.
# cudaMemGetInfo: every process's) between a snapshot after its CUDA context exists and the end of
# its profiling run (vllm/utils/mem_utils.py MemorySnapshot and memory_profiling;
# vllm/v1/worker/gpu_worker.py Worker.init_device and determine_available_memory). Whatever another
# process allocates in that window it counts as its own; free memory that rises in it fails its
# assertion ("Error in memory profiling"). This script plays both processes with torch only, no vLLM:
#
#   lone      one process: its CUDA context and what else it holds outside torch before the
#             snapshot (vLLM's non_torch_memory), against labctl's reserve per engine (1994 MiB,
#             src/labctl/models.py CONTEXT_RESERVE_MIB)
#   together  A measures a window in which it allocates --gib GiB; B starts during A's window and
#             allocates --gib GiB too: A's window counts B's context and memory as A's
#   release   B holds --gib GiB before A's snapshot and exits during A's window: A's free memory
#             rises (vLLM's assertion would fail)
#   in-order  B starts only once A's window is over (A then holds its memory and idles, as a replica
#             that serves): B's own window sees no change but its own - the order the vllm role and
#             the replicas' units give the replicas of a shared GPU (roles/vllm/README.md)
#
# Usage, on the GPU machine, from the repository root:
#   scripts/shared-gpu-check.sh --run OUTDIR [--gpu N] [--gib G] [--window S] [--python PY]
# PY needs torch with CUDA (default: the lab's replicas' venv, /opt/labctl/vllm/current/bin/python,
# else python3). The GPU should be otherwise idle (the script records nvidia-smi's view before).
# Takes about a minute and --gib x 2 of the GPU's memory at most.
#
# OUTDIR receives:
#   shared-gpu-check.json   every measurement (MiB): per case and process the snapshot's free memory,
#                           the free memory after the window, the process's own torch reserve change,
#                           and what the window counted of the other process
#   shared-gpu-check.txt    the PASS/FAIL lines, then the JSON's summary
#   nvidia-smi.txt          nvidia-smi before the cases (GPU, driver, memory used by others)
# Exit status 0 only when nothing FAILed. Keep OUTDIR with the verification documents
# (docs/verification/shared-gpu/, docs/verification.md "Two engines on one GPU").
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RESERVE_MIB=1994

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

[ "${1:-}" = "--run" ] && [ -n "${2:-}" ] || usage
OUT=$2
shift 2
GPU=0 GIB=2 WINDOW=4 PY=
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) GPU=$2; shift 2 ;;
    --gib) GIB=$2; shift 2 ;;
    --window) WINDOW=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    *) usage ;;
  esac
done
if [ -z "$PY" ]; then
  PY=python3
  [ -x /opt/labctl/vllm/current/bin/python ] && PY=/opt/labctl/vllm/current/bin/python
fi
mkdir -p "$OUT"
{ nvidia-smi || echo "nvidia-smi failed"; } > "$OUT/nvidia-smi.txt" 2>&1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$OUT" "$WORK" "$GPU" "$GIB" "$WINDOW" "$RESERVE_MIB" "$REPO" <<'PYTHON'
"""Parent (no CUDA here): runs each case's two processes, `python - worker ...`, and judges."""
import json
import subprocess
import sys
import time
from pathlib import Path

out, work, gpu, gib, window, reserve, repo = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
MIB = 1 << 20

WORKER = r'''
import json, sys, time
from pathlib import Path
import torch

role, work, gpu, gib, window = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
MIB = 1 << 20
def mark(name, **data):
    (work / f"{role}.{name}").write_text(json.dumps(data))
def wait(name, timeout=120):
    deadline = time.monotonic() + timeout
    while not (work / name).exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{role}: no {name} within {timeout} s")
        time.sleep(0.01)
if (work / f"{role}.go-after").exists():
    wait((work / f"{role}.go-after").read_text())
torch.cuda.set_device(gpu)
torch.zeros(1, device="cuda")            # the CUDA context, as vLLM's init_device makes it before its snapshot
torch.cuda.synchronize()
torch.cuda.empty_cache()
free0, total = torch.cuda.mem_get_info()   # vLLM's MemorySnapshot: the whole GPU's free memory
reserved0 = torch.cuda.memory_reserved()
mark("snapshot", free=free0 // MIB, total=total // MIB, torch_reserved=reserved0 // MIB)
held = []
steps = 20
for step in range(steps):                  # the weights and the profiling run, within the window
    held.append(torch.empty(int(gib * (1 << 30) / steps), dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    time.sleep(window / steps)
torch.cuda.synchronize()
free1, _ = torch.cuda.mem_get_info()
reserved1 = torch.cuda.memory_reserved()
consumed = (free0 - free1) // MIB          # vLLM's total_consumed
own = (reserved1 - reserved0) // MIB
mark("window", free_before=free0 // MIB, free_after=free1 // MIB, consumed=consumed, own=own, counted_of_others=consumed - own)
if (work / f"{role}.release-on").exists():  # "release": free everything when told, then leave
    wait((work / f"{role}.release-on").read_text())
    del held
    torch.cuda.empty_cache()
    raise SystemExit(0)
wait("stop")
'''


def run_case(name, a_after=None, b_after=None, b_release_on=None, b_window=None):
    case = work / name
    case.mkdir()
    if a_after:
        (case / "A.go-after").write_text(a_after)
    if b_after:
        (case / "B.go-after").write_text(b_after)
    if b_release_on:
        (case / "B.release-on").write_text(b_release_on)
    windows = {"A": window, "B": window if b_window is None else b_window}
    procs = {role: subprocess.Popen([sys.executable, "-c", WORKER, role, str(case), str(gpu), str(gib), str(windows[role])])
             for role in ("A", "B") if role == "A" or name != "lone"}
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not all((case / f"{r}.window").exists() for r in procs):
        if any(p.poll() not in (None, 0) for p in procs.values()):
            break
        time.sleep(0.1)
    (case / "stop").write_text("")
    for p in procs.values():
        p.wait(timeout=120)
    return {r: {k: json.loads((case / f"{r}.{k}").read_text()) for k in ("snapshot", "window") if (case / f"{r}.{k}").exists()}
            for r in procs}


results = {"gpu": gpu, "gib": gib, "window_s": window, "labctl_reserve_mib": reserve}
lines = []
# lone: A alone; its non-torch memory right after the context (vLLM's non_torch_memory), less what
# nvidia-smi saw used before any process of ours.
try:
    used_before = subprocess.run(["nvidia-smi", "-i", str(gpu), "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, check=False).stdout.strip()
except OSError:
    used_before = ""
results["used_before_mib"] = int(used_before) if used_before.isdigit() else None
lone = results["lone"] = run_case("lone")
snap = lone["A"]["snapshot"]
context = snap["total"] - snap["free"] - snap["torch_reserved"] - (results["used_before_mib"] or 0)
results["context_mib"] = context
lines.append(f"{'PASS' if context <= reserve else 'FAIL'}: one process's CUDA context and non-torch memory before its snapshot: "
             f"{context} MiB (labctl reserves {reserve} MiB per engine)")
# together: B starts when A took its snapshot and allocates within A's window (in a quarter of it).
together = results["together"] = run_case("together", b_after="A.snapshot", b_window=window / 4)
counted = together["A"]["window"]["counted_of_others"]
lines.append(f"{'PASS' if counted >= 0.9 * gib * 1024 else 'FAIL'}: started together, A's window counted {counted} MiB of B's "
             f"context and memory as its own (vLLM would take it from its KV cache)")
# release: B holds memory before A's snapshot and frees it in A's window.
release = results["release"] = run_case("release", a_after="B.window", b_release_on="A.snapshot")
rose = release["A"]["window"]["free_after"] - (release["A"]["window"]["free_before"] - release["A"]["window"]["own"])
lines.append(f"{'PASS' if rose > 0 else 'FAIL'}: B freed memory in A's window: A's free memory rose by {rose} MiB beyond its own "
             f"use (vLLM asserts: \"Error in memory profiling\")")
# in order: B starts once A's window is over (A holds its memory, idle).
in_order = results["in-order"] = run_case("in-order", b_after="A.window")
b_counted = in_order["B"]["window"]["counted_of_others"]
lines.append(f"{'PASS' if abs(b_counted) < 64 else 'FAIL'}: one after another, B's window counted {b_counted} MiB of A's "
             "(under 64 MiB: the allocator's rounding)")
(out / "shared-gpu-check.json").write_text(json.dumps(results, indent=2) + "\n")
(out / "shared-gpu-check.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if any(line.startswith("FAIL") for line in lines) else 0)
PYTHON
