"""Issue 39 through the real LiteLLM 1.106.0 proxy (gateway_proxy.py: the litellm role's own config and
callbacks as `labctl gateway-config` renders them for an inventory): a replica whose GPU reports a fault
that looks like a hang gets no request while its host's node_exporter shows the fault latched, and serves
again once it is cleared. The node_exporter stand-in serves what the real collector
(roles/node_exporter/files/labctl-node-metrics) writes for an H200 pair (the nvidia-smi double) whose
kernel log holds an Xid 79, and node_exporter's own textfile line."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from .gateway_proxy import free_port, install_keys, running_gateway

REPO = Path(__file__).resolve().parents[2]
COLLECTOR = REPO / "roles" / "node_exporter" / "files" / "labctl-node-metrics"
SMI = REPO / "tests" / "fixtures" / "nvidia-smi"
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"


def _textfile(tmp_path: Path, klog: str) -> str:
    out, state = tmp_path / "textfile", tmp_path / "state"
    out.mkdir(parents=True)
    (tmp_path / "kernel.log").write_text(klog)
    env = dict(os.environ, NVIDIA_SMI_STUB_DATA=str(SMI / "h200x2.json"), NVIDIA_SMI_STUB_SHARE="/nonexistent",
               NVIDIA_SMI_STUB_RUN="/nonexistent")
    subprocess.run([sys.executable, str(COLLECTOR), "--textfile-dir", str(out), "--nvidia-smi", str(SMI / "nvidia-smi-stub"),
                    "--kernel-log-command", f"cat {tmp_path / 'kernel.log'}", "--state-file", str(state / "xid.json")],
                   check=True, env=env, capture_output=True, timeout=60)
    return "".join(p.read_text() for p in sorted(out.glob("*.prom"))) + "node_textfile_scrape_error 0\n"


class _Exporter(http.server.BaseHTTPRequestHandler):
    body: ClassVar[str] = ""
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.paths.append(self.path)
        data = self.body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _exporter(port: int, body: str) -> Iterator[type[_Exporter]]:
    handler = type("Exporter", (_Exporter,), {"body": body, "paths": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_no_request_reaches_a_replica_on_a_faulted_gpu_until_the_fault_is_cleared(tmp_path: Path) -> None:
    faulted, cleared = _textfile(tmp_path / "faulted", XID79), _textfile(tmp_path / "cleared", "")
    latched = re.findall(r'^labctl_gpu_fault\{(.*)\} 1$', faulted, re.MULTILINE)
    assert len(latched) == 1 and 'fault="xid79"' in latched[0] and 'gpu="0"' in latched[0], latched
    # A healthy host publishes every fault of every GPU at 0 (the series exist; the gateway reads only 1).
    assert 'fault="xid79"} 0' in cleared and not re.search(r"^labctl_gpu_fault\{.*\} 1$", cleared, re.MULTILINE)
    port = free_port()
    variables = {"lab_node_exporter_port": port, "litellm_readiness_gpu_health_interval": 1.0, "litellm_num_workers": 1}
    with _exporter(port, faulted) as node, running_gateway(tmp_path / "gw", variables) as gw:
        model = next(str(d["model_name"]) for d in gw.deployments() if d["litellm_params"]["extra_body"]["priority"] == 0)
        key = install_keys(gw, tmp_path / "store", {"notebook": ("interactive", {})},
                           [{"name": model, "priority": 0, "key_class": "interactive"}])["notebook"]

        def ask() -> tuple[int, int, str]:
            marker = f"gpu-fault-{uuid.uuid4().hex}"
            status, _, text = gw.request("/v1/chat/completions", key, {
                "model": model, "messages": [{"role": "user", "content": marker}], "max_tokens": 4}, timeout=60)
            return status, len(gw.recorder.marked(marker)), text[:300]

        status, reached, text = ask()
        # The replica (GPU 0, the lab's one) is out: LiteLLM has no deployment left and says so at once.
        assert reached == 0 and status in (429, 503), (status, text)
        assert node.paths and all(p == "/metrics?collect%5B%5D=textfile" for p in node.paths), node.paths
        node.body = cleared
        deadline, answer = time.monotonic() + 30, (0, 0, "")
        while time.monotonic() < deadline:
            answer = ask()
            if answer[0] == 200:
                break
            time.sleep(1)
        assert answer[:2] == (200, 1), answer
        log = gw.log.read_text(errors="replace")
        assert "leaves the rotation until `labctl gpu-clear`: GPU 0 reports xid79" in log, log[-3000:]
        assert "its GPU fault was cleared" in log
