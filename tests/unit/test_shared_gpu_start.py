"""Issue 39, part 2: replicas sharing a GPU start one after another, each serving before the next starts.

vLLM 0.32.0 counts every change of its GPU's memory during its profiling run as its own and asserts that
free memory did not rise (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory), and wants
its share free at start (vllm/v1/worker/utils.py, request_memory). Here, without a GPU or systemd:

- the order the vllm role gives the replicas of a host (its labctl_gpu_start_order filter);
- the readiness wait a replica's unit runs before the next replica on its GPU may start
  (roles/vllm/files/labctl-vllm-ready);
- the test double of a replica (tests/fixtures/vllm-standin) keeps vLLM's rule: two started together on
  one GPU fail as vLLM does, one after another they serve.

The same double runs under systemd with the role's own units and tasks, at a reboot and in a rolling
restart, in molecule/gpu (tests/test_shared_gpu.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "fixtures" / "vllm-standin" / "labctl_vllm_standin.py"
READY = REPO / "roles" / "vllm" / "files" / "labctl-vllm-ready"
_SPEC = importlib.util.spec_from_file_location("vllm_filters", REPO / "roles" / "vllm" / "filter_plugins" / "vllm_filters.py")
assert _SPEC and _SPEC.loader
filters = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(filters)


def _order(plan: list[dict[str, Any]]) -> list[tuple[int, list[int], bool]]:
    return [(r["index"], r["start_after"], r["start_before"]) for r in filters.labctl_gpu_start_order(plan)]


def test_a_gpu_of_one_replica_gives_no_order() -> None:
    assert _order([{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}]) == []


def test_the_replicas_of_a_gpu_start_in_index_order_and_other_gpus_go_together() -> None:
    plan = [{"index": 100, "gpus": "1"}, {"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}, {"index": 200, "gpus": "1"}]
    # GPU 1: 1, then 100, then 200; replica 0 (GPU 0) is in no chain: it starts with replica 1.
    assert _order(plan) == [(1, [], True), (100, [1], True), (200, [100], False)]


def test_a_tensor_parallel_replica_waits_for_the_one_before_it_on_each_of_its_gpus() -> None:
    plan = [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}, {"index": 100, "gpus": "0,1"}, {"index": 200, "gpus": "1"}]
    assert _order(plan) == [(0, [], True), (1, [], True), (100, [0, 1], True), (200, [100], False)]


class _Late(BaseHTTPRequestHandler):
    """/health answers 503 until ``ready_at``, then 200 (vLLM answers nothing before its engine is up)."""

    ready_at = 0.0

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        status = 200 if self.path == "/health" and time.monotonic() >= self.ready_at else 503
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_the_readiness_wait_ends_when_the_replica_serves() -> None:
    _Late.ready_at = time.monotonic() + 1.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Late)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        run = subprocess.run([sys.executable, str(READY), f"http://127.0.0.1:{server.server_address[1]}"],
                             capture_output=True, text=True, timeout=60, check=False,
                             env={**os.environ, "LABCTL_READY_INTERVAL": "0.1"})
        took = time.monotonic() - started
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr
    assert 1.0 <= took < 10, took
    assert "answered 200" in run.stdout
    assert subprocess.run([sys.executable, str(READY)], capture_output=True, check=False).returncode == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _replica(tmp: Path, index: int, gpus: str, share: float) -> tuple[list[str], dict[str, str]]:
    config = tmp / f"replica-{index}.yaml"
    config.write_text(yaml.safe_dump({"host": "127.0.0.1", "port": _free_port(), "served-model-name": [f"m-{index}"],
                                      "gpu-memory-utilization": share, "tensor-parallel-size": 1}))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "LABCTL_STANDIN_LEDGER": str(tmp / "ledger")}
    return [sys.executable, str(STANDIN), "serve", "--config", str(config)], env


def _ledger(tmp: Path, seconds: float) -> None:
    (tmp / "ledger").mkdir()
    (tmp / "ledger" / "gpus.json").write_text(json.dumps({"total_mib": [143771, 143771], "profile_seconds": seconds}))


def _events(tmp: Path) -> list[dict[str, Any]]:
    path = tmp / "ledger" / "events.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_for(tmp: Path, index: int, event: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["replica"] == index and e["event"] in (event, "failed") for e in _events(tmp)):
            return
        time.sleep(0.05)
    raise AssertionError(f"replica {index}: no {event} in {_events(tmp)}")


def test_the_double_fails_as_vllm_does_when_two_engines_profile_on_one_gpu_together(tmp_path: Path) -> None:
    _ledger(tmp_path, 1.0)
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for cmd, env in (_replica(tmp_path, 1, "1", 0.8), _replica(tmp_path, 100, "1", 0.15))]
    try:
        for index in (1, 100):
            _wait_for(tmp_path, index, "serving")
    finally:
        for proc in procs:
            proc.terminate()
        outputs = [proc.communicate(timeout=30)[1] for proc in procs]
    failed = [e for e in _events(tmp_path) if e["event"] == "failed"]
    assert failed, _events(tmp_path)
    # vLLM's own words in the journal (labctl_service_wait quotes the "Error:" lines), or the double's stricter one.
    assert any(("AssertionError: Error in memory profiling" in out or "another process changed GPU 1's memory" in out
                or "on startup is less than desired GPU memory utilization" in out) for out in outputs), outputs


def test_the_double_serves_both_engines_started_one_after_another(tmp_path: Path) -> None:
    _ledger(tmp_path, 0.5)
    first = _replica(tmp_path, 1, "1", 0.8)
    second = _replica(tmp_path, 100, "1", 0.15)
    other_gpu = _replica(tmp_path, 0, "0", 0.8)
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for cmd, env in (first, other_gpu)]
    try:
        _wait_for(tmp_path, 1, "serving")
        procs.append(subprocess.Popen(second[0], env=second[1], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        _wait_for(tmp_path, 100, "serving")
        _wait_for(tmp_path, 0, "serving")
    finally:
        for proc in procs:
            proc.terminate()
            proc.communicate(timeout=30)
    events = _events(tmp_path)
    assert not [e for e in events if e["event"] == "failed"], events
    served = {e["replica"]: e for e in events if e["event"] == "serving"}
    assert set(served) == {0, 1, 100}
    # GPU 1's memory: the first engine's share and context, then the second's; 0.80 + 0.15 of an H200
    # leaves room for both contexts (labctl.models.CONTEXT_RESERVE_MIB).
    begun = {e["replica"]: e for e in events if e["event"] == "profile-begin"}
    assert begun[100]["t"] > served[1]["t"]
    assert begun[100]["free_mib"]["1"] == 143771 - (1844 + int(143771 * 0.8 + 0.999)) - 1844


def test_the_double_refuses_a_share_the_first_engines_context_left_no_room_for(tmp_path: Path) -> None:
    """0.85 + 0.15 = 1.0 (the old topology allowed it): the second engine, started after the first serves,
    finds less than its share free (request_memory's ValueError)."""
    _ledger(tmp_path, 0.3)
    cmd, env = _replica(tmp_path, 1, "1", 0.85)
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(tmp_path, 1, "serving")
        cmd, env = _replica(tmp_path, 100, "1", 0.15)
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    finally:
        first.terminate()
        first.communicate(timeout=30)
    assert second.returncode == 1
    # 143771 MiB - 1844 (its context) - 122206 (0.85) - 1844 (the second's context) = 17877 MiB.
    assert ("ValueError: Free memory on device cuda:1 (17.46/140.4 GiB) on startup is less than desired GPU memory "
            "utilization (0.15, 21.06 GiB)") in second.stderr, second.stderr
