#!/usr/bin/env python3
"""Run the test suite's jobs a few at a time (`make test`): NAME=COMMAND pairs, started in the
order given (longest first, so the slow ones do not start last), at most --jobs at once.

A molecule scenario's converge keeps about one core busy (the controller and the module in the
container take turns), so on the 2-core CI machine two jobs at once finish the suite in a bit
over half the time. Each job writes build/test-logs/NAME.log; its whole log is printed when it
ends (never interleaved with another's), its start and end are printed as they happen, and a
table of the jobs' durations closes the run (also build/test-logs/durations.json). The exit
status is 1 when any job failed; the others still run to the end (one CI run shows every
failure).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path


def _parse(pairs: list[str]) -> list[tuple[str, str]]:
    jobs = []
    for pair in pairs:
        name, sep, command = pair.partition("=")
        if not sep or not name or not command:
            raise SystemExit(f"run-jobs: {pair!r} is not NAME=COMMAND")
        jobs.append((name, command))
    names = [name for name, _ in jobs]
    if len(set(names)) != len(names):
        raise SystemExit(f"run-jobs: a job name is given twice: {names}")
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="jobs at once (default 2)")
    parser.add_argument("--logs", type=Path, default=Path("build/test-logs"))
    parser.add_argument("job", nargs="+", help="NAME=COMMAND (a shell command line)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    queue = deque(_parse(args.job))
    args.logs.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    results: dict[str, dict[str, float | int]] = {}
    began = time.monotonic()

    def say(text: str) -> None:
        with lock:
            print(text, flush=True)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                name, command = queue.popleft()
            log = args.logs / f"{name}.log"
            start = time.monotonic()
            say(f"=== [{time.strftime('%H:%M:%S')}] {name}: started ({command})")
            with log.open("w") as out:
                rc = subprocess.run(command, shell=True, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
            took = time.monotonic() - start
            with lock:
                results[name] = {"rc": rc, "seconds": round(took, 1), "started_s": round(start - began, 1)}
                print(f"=== [{time.strftime('%H:%M:%S')}] {name}: {'passed' if rc == 0 else f'FAILED (exit {rc})'}"
                      f" in {took:.0f} s; its log ({log}):", flush=True)
                sys.stdout.write(log.read_text(errors="replace"))
                print(f"=== end of {name}'s log", flush=True)

    threads = [threading.Thread(target=worker, name=f"jobs-{i}") for i in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.monotonic() - began
    (args.logs / "durations.json").write_text(json.dumps({"jobs": args.jobs, "wall_s": round(total, 1),
                                                         "results": results}, indent=2) + "\n")
    print(f"\n{'job':<16} {'result':<8} {'started':>8} {'took':>8}")
    for name, res in results.items():
        print(f"{name:<16} {'ok' if res['rc'] == 0 else 'FAILED':<8} {res['started_s']:>7.0f}s {res['seconds']:>7.0f}s")
    print(f"{'all':<16} {'':<8} {'':>8} {total:>7.0f}s  ({args.jobs} at a time)")
    failed = [name for name, res in results.items() if res["rc"] != 0]
    if failed:
        print(f"failed: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
