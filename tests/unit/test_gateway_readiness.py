"""The gateway's readiness routing (roles/litellm/files/.../labctl_readiness.py) and the rolling
restart's drain wait (roles/vllm/library/labctl_replica_drain.py), against real sockets: a server that
answers, one that answers 503, a port that listens but never answers (vLLM while it loads its
model: it binds before the engine is set up) and a closed port."""

from __future__ import annotations

import ast
import asyncio
import http.server
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from .callback_loader import load_callback
from .tls_pki import Pki, make_pki

REPO = Path(__file__).resolve().parents[2]
CALLBACK = REPO / "roles" / "litellm" / "files" / "etc" / "labctl" / "litellm" / "labctl_readiness.py"
TEMPLATES = REPO / "roles" / "litellm" / "templates" / "etc" / "labctl" / "litellm"
WHEELS = REPO / "build" / "bundles" / "test" / "wheels"
BIN = Path(sys.executable).parent


def _load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval: float = 0.2, timeout: float = 0.5,
          ca_file: Path | None = None, gpu_health: dict[str, Any] | None = None, gpu_health_interval: float = 15.0) -> Any:
    return load_callback("labctl_readiness", tmp_path, monkeypatch, litellm_readiness_interval=interval,
                         litellm_readiness_timeout=timeout, __litellm_drain_dir=str(tmp_path / "drain"),
                         litellm_vllm_ca_file=str(ca_file or tmp_path / "no-ca.crt"),
                         litellm_readiness_gpu_health_interval=gpu_health_interval, __litellm_gpu_health=gpu_health or {})


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200
    metrics = ""
    reads: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = (self.metrics if self.path.split("?")[0] == "/metrics" else "").encode()
        self.reads.append(self.metrics)
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _server(status: int = 200, metrics: str = "", tls: Pki | None = None) -> Iterator[tuple[int, type[_Handler]]]:
    """A replica stand-in on 127.0.0.1; with ``tls``, HTTPS only with that certificate (vLLM's
    --ssl-certfile/--ssl-keyfile: uvicorn wraps its socket the same way)."""
    handler = type("H", (_Handler,), {"status": status, "metrics": metrics, "reads": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls.cert, tls.key)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], handler
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextmanager
def _loading() -> Iterator[int]:
    """A port that listens and never accepts: vLLM between its bind and the end of the load."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def _closed_port() -> int:
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return int(port)


def _deployment(port: int, served: str) -> dict[str, Any]:
    return {"model_name": "gpt-oss-120b", "model_info": {"id": f"gpt-oss-120b@{served}"},
            "litellm_params": {"model": f"openai/{served}", "api_base": f"http://127.0.0.1:{port}/v1"}}


def _served(deployments: list[dict[str, Any]]) -> list[str]:
    return [d["litellm_params"]["model"].split("/", 1)[1] for d in deployments]


def test_the_health_url_is_the_api_base_without_v1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load(tmp_path, monkeypatch)
    assert mod.health_url("http://10.0.0.5:8001/v1") == ("10.0.0.5", 8001, "/health")
    assert mod.health_url("http://gpu01:8000/v1/") == ("gpu01", 8000, "/health")
    assert mod.health_url("https://gw.lab/vllm0/v1") == ("gw.lab", 443, "/vllm0/health")


def test_a_probe_tells_ready_down_and_silent_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load(tmp_path, monkeypatch)
    with _server(200) as (up, _), _server(503) as (sick, _), _loading() as loading:
        closed = _closed_port()
        started = time.monotonic()

        async def all_four() -> list[str]:
            return list(await asyncio.gather(*(mod.probe(f"http://127.0.0.1:{port}/v1", 1.0)
                                               for port in (up, sick, loading, closed))))

        results = asyncio.run(all_four())
    assert results == ["ok", "down", "silent", "down"]
    assert time.monotonic() - started < 4


def test_an_https_replica_is_ready_only_with_a_certificate_of_the_lab_ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replicas on another host serve HTTPS (issue 29): the probe speaks TLS to an https api_base and
    trusts only litellm_vllm_ca_file; a certificate of another CA is down, like plain HTTP there."""
    lab, other = make_pki(tmp_path / "lab"), make_pki(tmp_path / "other", name="other")
    mod = _load(tmp_path, monkeypatch, ca_file=lab.ca)
    with _server(200, tls=lab) as (good, _), _server(200, tls=other) as (foreign, _), _server(200) as (plain, _):
        async def probes() -> list[str]:
            return list(await asyncio.gather(mod.probe(f"https://127.0.0.1:{good}/v1", 2.0),
                                             mod.probe(f"https://127.0.0.1:{foreign}/v1", 2.0),
                                             mod.probe(f"http://127.0.0.1:{good}/v1", 2.0),
                                             mod.probe(f"http://127.0.0.1:{plain}/v1", 2.0)))

        assert asyncio.run(probes()) == ["ok", "down", "down", "ok"]


def test_requests_go_only_to_ready_replicas_and_never_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load(tmp_path, monkeypatch)

    async def scenario() -> None:
        with _server(200) as (up, _), _loading() as loading:
            ready = mod.Readiness(interval=0.2, timeout=1.0, drain_dir=str(tmp_path / "drain"))
            both = [_deployment(up, "r-0"), _deployment(loading, "r-1")]
            assert _served(await ready.async_filter_deployments("gpt-oss-120b", both, None)) == ["r-0"]
            # None ready: every candidate stays (the probe is never the cause of an outage).
            assert _served(await ready.async_filter_deployments("gpt-oss-120b", both[1:], None)) == ["r-1"]
            ready.task.cancel()

    asyncio.run(scenario())


def test_a_replica_that_restarts_is_dropped_at_once_and_taken_back_when_it_answers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load(tmp_path, monkeypatch)

    async def scenario() -> list[list[str]]:
        seen: list[list[str]] = []
        with _server(200) as (up, _):
            port = _closed_port()
            victim = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
            threading.Thread(target=victim.serve_forever, daemon=True).start()
            ready = mod.Readiness(interval=0.1, timeout=1.0, drain_dir=str(tmp_path / "drain"))
            both = [_deployment(up, "r-0"), _deployment(port, "r-1")]
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            victim.shutdown()
            victim.server_close()          # stopped: refused
            await asyncio.sleep(1.0)
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            loading = socket.create_server(("127.0.0.1", port), backlog=16)  # bound, loading
            await asyncio.sleep(2.5)
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            loading.close()
            back = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)  # serving again
            threading.Thread(target=back.serve_forever, daemon=True).start()
            await asyncio.sleep(2.5)
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            back.shutdown()
            back.server_close()
            ready.task.cancel()
        return seen

    assert asyncio.run(scenario()) == [["r-0", "r-1"], ["r-0"], ["r-0"], ["r-0", "r-1"]]


def test_one_silent_probe_keeps_a_ready_replica_two_drop_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load(tmp_path, monkeypatch)
    ready = mod.Readiness(interval=10, timeout=0.2, drain_dir=str(tmp_path / "drain"))
    answers = iter(["ok", "silent", "ok", "silent", "silent"])

    async def fake_probe(base: str, timeout: float) -> str:
        return next(answers)

    monkeypatch.setattr(mod, "probe", fake_probe)
    states = []
    for _ in range(5):
        asyncio.run(ready.refresh(["http://127.0.0.1:1/v1"]))
        states.append(ready.ready["http://127.0.0.1:1/v1"])
    assert states == [True, True, True, True, False]


def test_a_drain_marker_routes_around_a_healthy_replica_until_it_expires(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _load(tmp_path, monkeypatch)
    drain = tmp_path / "drain"
    drain.mkdir()

    async def scenario() -> list[list[str]]:
        seen = []
        with _server(200) as (a, _), _server(200) as (b, _):
            ready = mod.Readiness(interval=0.2, timeout=1.0, drain_dir=str(drain))
            both = [_deployment(a, "r-0"), _deployment(b, "r-1")]
            (drain / "r-1").write_text(f"{int(time.time()) + 60}\n")
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            (drain / "r-1").write_text(f"{int(time.time()) - 1}\n")  # a run that died: expired
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            (drain / "r-1").write_text("garbage")
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            (drain / "r-0").write_text(f"{int(time.time()) + 60}\n")
            (drain / "r-1").write_text(f"{int(time.time()) + 60}\n")
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            ready.task.cancel()
        return seen

    assert asyncio.run(scenario()) == [["r-0"], ["r-0", "r-1"], ["r-0", "r-1"], ["r-0", "r-1"]]


# --- GPU faults (issue 39) ----------------------------------------------------------------------

COLLECTOR = REPO / "roles" / "node_exporter" / "files" / "labctl-node-metrics"
SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
# What node_exporter's textfile collector adds beside the files' samples (node_exporter 1.x).
TEXTFILE_OWN = ('# HELP node_textfile_scrape_error 1 if there was an error opening or reading a file, 0 otherwise\n'
                '# TYPE node_textfile_scrape_error gauge\nnode_textfile_scrape_error 0\n')


def _collector_output(tmp_path: Path, klog: str) -> str:
    """labctl_gpu_faults.prom as the real collector writes it on an H200 pair (nvidia-smi double) whose
    kernel log holds ``klog``, as node_exporter then serves it."""
    out = tmp_path / "textfile"
    out.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kernel.log").write_text(klog)
    env = dict(os.environ, NVIDIA_SMI_STUB_DATA=str(SMI / "h200x2.json"), NVIDIA_SMI_STUB_SHARE="/nonexistent",
               NVIDIA_SMI_STUB_RUN="/nonexistent")
    subprocess.run([sys.executable, str(COLLECTOR), "--textfile-dir", str(out), "--nvidia-smi", str(SMI / "nvidia-smi-stub"),
                    "--kernel-log-command", f"cat {tmp_path / 'kernel.log'}", "--state-file", str(tmp_path / "state" / "xid.json")],
                   check=True, env=env, capture_output=True, timeout=60)
    return (out / "labctl_gpu_faults.prom").read_text() + TEXTFILE_OWN


def test_a_replica_on_a_faulted_gpu_leaves_the_rotation_until_the_fault_is_cleared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replica r-0 on GPU 0, r-1 on GPU 1 of one host, both healthy. Xid 79 on GPU 1 (read from the host's
    node_exporter, the real collector's latch): r-1 gets nothing, even once r-0 is down too; a node_exporter
    that stops answering keeps the fault; once cleared, r-1 is back."""
    xid79 = "NVRM: Xid (PCI:0000:9a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
    healthy, faulted = _collector_output(tmp_path / "ok", ""), _collector_output(tmp_path / "bad", xid79)
    assert 'fault="xid79"} 1' in faulted and 'fault="xid79"} 0' in healthy and "} 1\n" not in healthy.split("node_textfile")[0]

    async def scenario() -> list[list[str]]:
        seen = []
        with _server(200) as (a, _), _server(200) as (b, _), _server(200, healthy) as (exporter, node):
            url = f"http://127.0.0.1:{exporter}/metrics?collect%5B%5D=textfile"
            mod = _load(tmp_path, monkeypatch, gpu_health={
                f"http://127.0.0.1:{a}/v1": {"url": url, "gpus": ["0"]}, f"http://127.0.0.1:{b}/v1": {"url": url, "gpus": ["1"]}},
                gpu_health_interval=0.2)
            ready = mod.Readiness(interval=0.1, timeout=1.0, drain_dir=str(tmp_path / "drain"))
            both = [_deployment(a, "r-0"), _deployment(b, "r-1")]
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            node.metrics = faulted
            await asyncio.sleep(0.8)
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            seen.append(_served(await ready.async_filter_deployments("m", [_deployment(b, "r-1")], None)))
            seen.append(_served(await ready.async_filter_deployments("m", [_deployment(_closed_port(), "r-0"),
                                                                           _deployment(b, "r-1")], None)))
            node.status = 500
            await asyncio.sleep(0.8)
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            node.status, node.metrics = 200, healthy
            await asyncio.sleep(0.8)
            seen.append(_served(await ready.async_filter_deployments("m", both, None)))
            ready.task.cancel()
        return seen

    assert asyncio.run(scenario()) == [["r-0", "r-1"], ["r-0"], [], ["r-0"], ["r-0"], ["r-0", "r-1"]]


def test_the_gateway_reads_each_replicas_gpus_on_its_own_host() -> None:
    """The litellm role's filter: every replica's api_base, its GPUs and its host's node_exporter (the
    textfile collector only), from the topology."""
    sys.path.insert(0, str(REPO / "roles" / "litellm" / "filter_plugins"))
    from litellm_filters import labctl_gpu_health

    from labctl.topology import lab_topology

    groups = {"lab": ["gw", "gpu1"], "gpu_hosts": ["gpu1"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"]}
    facts: dict[str, dict[str, Any]] = {"gw": {"default_ipv4": {"address": "10.0.0.1"}},
                                        "gpu1": {"default_ipv4": {"address": "10.0.0.2"}, "gpu_count": 4}}
    topo = lab_topology(groups, {"gw": {}, "gpu1": {"vllm_tensor_parallel_size": 2}}, facts)
    assert topo["problems"] == []
    assert labctl_gpu_health(topo["replicas"], topo) == {
        "https://10.0.0.2:8000/v1": {"url": "http://10.0.0.2:9100/metrics?collect%5B%5D=textfile", "gpus": ["0", "1"], "host": "gpu1"},
        "https://10.0.0.2:8001/v1": {"url": "http://10.0.0.2:9100/metrics?collect%5B%5D=textfile", "gpus": ["2", "3"], "host": "gpu1"}}


def test_the_hook_matches_litellms_signature() -> None:
    """The router calls async_filter_deployments by keyword (litellm/router.py,
    async_callback_filter_deployments): the parameter names must be LiteLLM's own."""
    wheel = next(WHEELS.glob("litellm-*.whl"), None)
    if wheel is None:
        pytest.skip("the test bundle's wheels are not built (make bundle-test)")
    with zipfile.ZipFile(wheel) as zf:
        tree = ast.parse(zf.read("litellm/integrations/custom_logger.py"))
    theirs = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "async_filter_deployments")
    ours = next(n for n in ast.walk(ast.parse(CALLBACK.read_text()))
                if isinstance(n, ast.AsyncFunctionDef) and n.name == "async_filter_deployments")
    assert [a.arg for a in ours.args.args] == [a.arg for a in theirs.args.args]


def test_the_role_defaults_and_the_drain_directories_agree() -> None:
    litellm_vars = yaml.safe_load((REPO / "roles" / "litellm" / "vars" / "main.yml").read_text())
    vllm_vars = yaml.safe_load((REPO / "roles" / "vllm" / "vars" / "main.yml").read_text())
    # One source, the topology, for the role that writes the markers and the one that reads them.
    assert litellm_vars["__litellm_drain_dir"] == vllm_vars["__vllm_drain_dir"] == "{{ lab_topology.drain_dir }}"
    from labctl import topology

    assert topology.DRAIN_DIR.startswith("/run/")  # a reboot clears a stale marker
    config = (TEMPLATES / "config.yaml.j2").read_text()
    assert '"labctl_readiness.readiness"' in config


# --- labctl_replica_drain -----------------------------------------------------------------------

def _drain(url: str, **args: object) -> dict[str, Any]:
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", "labctl_replica_drain", "-a",
           json.dumps({"url": url, **args}), "-o"]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(REPO / "roles" / "vllm" / "library"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False).stdout
    assert "=>" in out, out
    return json.loads(out.split("=>", 1)[1])  # type: ignore[no-any-return]


# vLLM 0.32's exposition of the two gauges (one label set per served engine).
BUSY = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="gpt-oss-120b-gpu01-0"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="gpt-oss-120b-gpu01-0"} 1.0
vllm:num_requests_running_total_not_this 7.0
"""


def test_the_drain_waits_for_running_and_waiting_requests() -> None:
    with _server(200, BUSY) as (port, handler):
        def finish() -> None:
            while len(handler.reads) < 3:  # the module has read a busy replica three times
                time.sleep(0.05)
            handler.metrics = BUSY.replace(" 2.0", " 0.0").replace(" 1.0", " 0.0")

        threading.Thread(target=finish, daemon=True).start()
        result = _drain(f"http://127.0.0.1:{port}", timeout=30, interval=0.2)
    assert result["drained"] is True and result["in_flight"] == 0 and 0.4 <= result["seconds"] < 10, result
    assert handler.reads[:3] == [BUSY] * 3 and "2.0" not in handler.reads[-1]
    assert result["changed"] is False


def test_the_drain_gives_up_after_its_timeout_and_reports_what_is_left() -> None:
    with _server(200, BUSY) as (port, _):
        result = _drain(f"http://127.0.0.1:{port}", timeout=1, interval=0.2)
    assert result["drained"] is False and result["in_flight"] == 3, result


def test_a_replica_that_does_not_answer_has_nothing_in_flight() -> None:
    result = _drain(f"http://127.0.0.1:{_closed_port()}", timeout=5)
    assert result["drained"] is True and result["answered"] is False, result


def test_the_drain_reads_an_https_replica_with_the_lab_ca_and_refuses_another(tmp_path: Path) -> None:
    """An https replica (another host than the gateway): the drain reads its queue through TLS with
    ca_file. A certificate it cannot verify fails the drain instead of passing for "nothing in flight"
    (the restart would cut every running request)."""
    lab, other = make_pki(tmp_path / "lab"), make_pki(tmp_path / "other", name="other")
    with _server(200, BUSY, tls=lab) as (port, _):
        busy = _drain(f"https://127.0.0.1:{port}", ca_file=str(lab.ca), timeout=1, interval=0.2)
        refused = _drain(f"https://127.0.0.1:{port}", ca_file=str(other.ca), timeout=1, interval=0.2)
    assert busy["drained"] is False and busy["in_flight"] == 3, busy
    assert "drained" not in refused and "its certificate is refused" in refused["msg"], refused


def test_the_rolling_restart_puts_every_replica_back_also_from_a_handler() -> None:
    """restart_one.yml runs from the vllm role's handler, where Ansible skips a block's always:
    section (a config change then left both replicas marked drained). The markers are removed
    by a plain task after the health wait."""
    tasks = yaml.safe_load((REPO / "roles" / "vllm" / "tasks" / "restart_one.yml").read_text())
    assert not [t for t in tasks if "block" in t or "always" in t]
    names = [t["name"].split(" |")[0] for t in tasks]
    assert names.index("Take the replica out of the gateways' rotation") < names.index("Restart one replica")
    assert names.index("Wait until the replica serves again") < names.index("Put the replica back in the gateways' rotation")
