#!/usr/bin/env python3
"""Benchmark of model staging (not a test): labctl_model_stage vs rsync -a and sha256sum, on one set of files.

Usage: python3 scripts/bench-artifacts.py   (make bench-artifacts)

Environment: BENCH_FILES (8), BENCH_SIZE (1GiB), BENCH_WORKERS (4), BENCH_ROUNDS (3), BENCH_DIR
(build/bench-artifacts), BENCH_KEEP=1 keeps the copies (the source files are always kept and reused
when up to date).

On the same synthetic weights (scripts/make-synthetic-weights.py + a SHA256SUMS):
  1. rsync -a into a fresh directory, and rsync -a followed by sync (durable, like the staging);
  2. labctl_model_stage into a fresh model root (run through `ansible localhost -c local -m labctl_model_stage`,
     the module as the role runs it; its own duration is reported beside the wall time);
  3. labctl_model_stage again on the staged revision (quick check of the stamp);
  4. labctl_model_stage verify=full on the staged revision vs sha256sum over the same files in parallel
     (xargs -P BENCH_WORKERS).
The sequence runs BENCH_ROUNDS times (interleaved, so a noisy disk hits every kind of run alike) and
the median of each is reported (all figures in the JSON). The page cache is dropped before each timed
run (sync; echo 3 > /proc/sys/vm/drop_caches). Where the kernel refuses that, one untimed warm-up
round runs first and the figures are warm-cache ones.
Prints a table and writes build/bench-artifacts.json.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
FILES = int(os.environ.get("BENCH_FILES", "8"))
SIZE = os.environ.get("BENCH_SIZE", "1GiB")
WORKERS = int(os.environ.get("BENCH_WORKERS", "4"))
ROUNDS = max(1, int(os.environ.get("BENCH_ROUNDS", "3")))
WORK = Path(os.environ.get("BENCH_DIR", REPO / "build" / "bench-artifacts")).resolve()
KEEP = os.environ.get("BENCH_KEEP") == "1"
OUT = REPO / "build" / "bench-artifacts.json"
ANSIBLE = Path(sys.executable).parent / "ansible"


def log(text: str) -> None:
    print(f"bench-artifacts: {text}", file=sys.stderr, flush=True)


def drop_caches() -> bool:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def timed(cmd: list[str], **kwargs: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    took = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"bench-artifacts: {' '.join(cmd[:3])}... failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return took, result


def source() -> tuple[Path, int]:
    src = WORK / "src" / "r1"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make-synthetic-weights.py"), str(src),
                    "--files", str(FILES), "--size", SIZE], check=True, stdout=subprocess.DEVNULL)
    sums = src / "SHA256SUMS"
    names = sorted(p.name for p in src.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    newest = max((src / n).stat().st_mtime for n in names)
    if not sums.exists() or sums.stat().st_mtime < newest or len(sums.read_text().splitlines()) != len(names):
        log(f"hashing {len(names)} source files for SHA256SUMS")
        out = subprocess.run(["sha256sum", *names], cwd=src, capture_output=True, text=True, check=True).stdout
        sums.write_text(out)
    return src, sum((src / n).stat().st_size for n in names)


def module(args: dict[str, Any], tmp: Path) -> tuple[float, dict[str, Any]]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(tmp / "ansible.cfg"), ANSIBLE_LIBRARY=str(REPO / "roles" / "model_weights" / "library"),
               ANSIBLE_MODULE_UTILS=str(REPO / "roles" / "model_weights" / "module_utils"),
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    took, result = timed([str(ANSIBLE), "localhost", "-c", "local", "-m", "labctl_model_stage", "-a", json.dumps(args)], env=env)
    data = json.loads(result.stdout[result.stdout.index("{"):])
    res: dict[str, Any] = data["plays"][0]["tasks"][0]["hosts"]["localhost"]
    if res.get("failed"):
        raise SystemExit(f"bench-artifacts: labctl_model_stage failed: {res.get('msg')}")
    return took, res


class Runs:
    """Timed runs by name, each preceded by a cache drop (when the kernel allows it)."""

    def __init__(self, cold: bool) -> None:
        self.cold = cold
        self.runs: dict[str, list[dict[str, Any]]] = {}

    def measure(self, name: str, label: str, run: Any, record: bool = True, drop: bool = True) -> None:
        if self.cold and drop:
            drop_caches()
        took, extra = run()
        log(f"{label}: {took:.2f} s{'' if record else ' (warm-up, not recorded)'}")
        if record:
            self.runs.setdefault(name, []).append({"seconds": round(took, 3), **extra})

    def median(self, name: str) -> dict[str, Any]:
        runs = self.runs[name]
        out: dict[str, Any] = {"runs": runs}
        for key in runs[0]:
            values = sorted(r[key] for r in runs)
            out[key] = values[len(values) // 2] if len(values) % 2 else round(sum(values[len(values) // 2 - 1:len(values) // 2 + 1]) / 2, 3)
        return out


def main() -> None:
    if shutil.which("rsync") is None:
        raise SystemExit("bench-artifacts: rsync is not installed (apt-get install rsync)")
    WORK.mkdir(parents=True, exist_ok=True)
    src, total = source()
    cold = drop_caches()
    cache = "dropped before each run" if cold else "cannot be dropped here: warm-cache figures (second of two runs)"
    log(f"{FILES} x {SIZE} = {total / 2**30:.2f} GiB in {src}; page cache {cache}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=WORK) as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "ansible.cfg").write_text("[defaults]\n")
        rsync_dst = WORK / "rsync-dst"
        models = WORK / "models"
        dest = models / "bench" / "r1"

        def rsync(sync: bool) -> Any:
            def run() -> tuple[float, dict[str, Any]]:
                shutil.rmtree(rsync_dst, ignore_errors=True)
                started = time.monotonic()
                subprocess.run(["rsync", "-a", f"{src}/", f"{rsync_dst}/"], check=True)
                if sync:
                    subprocess.run(["sync"], check=True)
                return time.monotonic() - started, {}
            return run

        args = {"src": str(src), "dest": str(dest), "workers": WORKERS, "progress_file": str(tmp / "progress.json")}

        def stage() -> tuple[float, dict[str, Any]]:
            shutil.rmtree(models, ignore_errors=True)
            took, res = module(args, tmp)
            assert res["bytes_copied"] == total, res
            return took, {"module_seconds": res["duration_s"]}

        def rerun() -> tuple[float, dict[str, Any]]:
            took, res = module(args, tmp)
            assert res["changed"] is False and res["bytes_read"] == 0, res
            return took, {"module_seconds": res["duration_s"]}

        def full() -> tuple[float, dict[str, Any]]:
            took, res = module(dict(args, verify="full"), tmp)
            assert res["bytes_hashed"] == total, res
            return took, {"module_seconds": res["duration_s"]}

        def sha256sum() -> tuple[float, dict[str, Any]]:
            names = sorted(p.name for p in dest.iterdir() if p.is_file() and not p.name.startswith(".") and p.name != "SHA256SUMS")
            started = time.monotonic()
            subprocess.run(["xargs", "-P", str(WORKERS), "-n", "1", "sha256sum"], input="\n".join(names), text=True,
                           cwd=dest, check=True, stdout=subprocess.DEVNULL)
            return time.monotonic() - started, {}

        runs = Runs(cold)
        rounds = [(r, True) for r in range(1, ROUNDS + 1)]
        if not cold:
            rounds.insert(0, (0, False))  # warm the cache first
        for number, record in rounds:
            tag = f"round {number}/{ROUNDS}" if record else "warm-up"
            runs.measure("rsync", f"{tag}: rsync -a", rsync(False), record)
            runs.measure("rsync_sync", f"{tag}: rsync -a; sync", rsync(True), record)
            runs.measure("stage", f"{tag}: labctl_model_stage (fresh)", stage, record)
            runs.measure("rerun", f"{tag}: labctl_model_stage (re-run, staged)", rerun, record)
            # Again at once: Ansible's own files are cached now (a cold cache makes `ansible` itself load slowly).
            runs.measure("rerun_warm", f"{tag}: labctl_model_stage (re-run, staged, warm)", rerun, record, drop=False)
            runs.measure("full_verify", f"{tag}: labctl_model_stage verify=full", full, record)
            runs.measure("sha256sum", f"{tag}: sha256sum (xargs -P {WORKERS})", sha256sum, record)
        results = {name: runs.median(name) for name in runs.runs}
        if not KEEP:
            shutil.rmtree(rsync_dst, ignore_errors=True)
            shutil.rmtree(models, ignore_errors=True)

    gib = total / 2**30
    stage_s = results["stage"]["module_seconds"]
    summary = {
        "stage_vs_rsync": round(stage_s / results["rsync"]["seconds"], 3),
        "stage_wall_vs_rsync": round(results["stage"]["seconds"] / results["rsync"]["seconds"], 3),
        "stage_vs_rsync_sync": round(stage_s / results["rsync_sync"]["seconds"], 3),
        "rerun_seconds": results["rerun"]["seconds"],
        "rerun_warm_seconds": results["rerun_warm"]["seconds"],
        "full_verify_vs_sha256sum": round(results["sha256sum"]["seconds"] / results["full_verify"]["module_seconds"], 3),
    }
    report = {
        "files": FILES, "size": SIZE, "bytes": total, "workers": WORKERS, "rounds": ROUNDS,
        "cache": "cold" if cold else "warm", "figures": "median of the rounds",
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "runs": results, "summary": summary,
        "targets": {"stage_vs_rsync": "<= 1.15", "rerun_seconds": "<= 3", "full_verify_vs_sha256sum": ">= 0.8"},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")

    def row(name: str, run: dict[str, Any], note: str = "", rate: bool = True) -> str:
        seconds = run.get("module_seconds", run["seconds"])
        mib_s = f"{gib * 1024 / seconds:>8.0f}" if rate and seconds else f"{'-':>8}"
        return f"| {name:<36} | {run['seconds']:>8.2f} | {seconds:>9.2f} | {mib_s} | {note}"

    print(f"\n{FILES} x {SIZE} ({gib:.2f} GiB), {WORKERS} workers, {os.cpu_count()} CPUs, {'cold' if cold else 'warm'} page cache,"
          f" median of {ROUNDS} round(s)\n")
    print(f"| {'run':<36} | {'wall s':>8} | {'module s':>9} | {'MiB/s':>8} | ratio (target)")
    print(f"|{'-' * 38}|{'-' * 10}|{'-' * 11}|{'-' * 10}|{'-' * 26}")
    print(row("rsync -a (fresh dir)", results["rsync"]))
    print(row("rsync -a; sync", results["rsync_sync"]))
    print(row("labctl_model_stage, fresh (ends with fsync)", results["stage"],
              f"{summary['stage_vs_rsync']} vs rsync -a (<= 1.15); {summary['stage_vs_rsync_sync']} vs rsync -a; sync"))
    print(row("labctl_model_stage, re-run on staged", results["rerun"], f"{summary['rerun_seconds']} s wall (<= 3 s)", rate=False))
    print(row("  the same, right after (warm cache)", results["rerun_warm"], f"{summary['rerun_warm_seconds']} s wall", rate=False))
    print(row("labctl_model_stage verify=full", results["full_verify"],
              f"{summary['full_verify_vs_sha256sum']} x sha256sum's throughput (>= 0.8)"))
    print(row(f"sha256sum, xargs -P {WORKERS}", results["sha256sum"]))
    print(f"\nwall s: the whole command (labctl_model_stage through `ansible localhost -c local -m`, ~1-2 s of it Ansible);"
          f" module s: the module's own duration.\nJSON: {OUT}")


if __name__ == "__main__":
    main()
