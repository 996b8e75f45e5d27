"""library/labctl_service_wait.py against a replica stand-in that guards /v1 as vLLM 0.32 does
(vllm/entrypoints/serve/middleware/authenticate.py: /v1, /v2, /inference, /cohere need the bearer
token, a wrong or missing one gets 401 {"error": "Unauthorized"}; /health and /metrics stay open)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import threading
import time
import urllib.error
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from .json_http import JSONHandler

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("labctl_service_wait", REPO / "library" / "labctl_service_wait.py")
assert _SPEC and _SPEC.loader
wait = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(wait)

KEY = "sk-vllm-test-key"
GUARDED = ("/v1", "/v2", "/inference", "/cohere")


class _Replica(JSONHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith(GUARDED):
            scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or token != KEY:
                self._answer(401, {"error": "Unauthorized"})
                return
        if self.path == "/health":
            self._answer(200, {})
        elif self.path == "/v1/models":
            self._answer(200, {"data": [{"id": "tiny-llama-host-0"}, {"id": "tiny-llama"}]})
        else:
            self._answer(404, {})



@pytest.fixture(scope="module")
def replica() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Replica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _params(url: str, **extra: object) -> dict[str, object]:
    return {"url": url, "paths": ["/health"], "model_name": "tiny-llama-host-0", "api_key": None, **extra}


def test_with_the_key_the_model_is_listed(replica: str) -> None:
    assert wait.probe(_params(replica, api_key=KEY)) is None
    assert "not tiny-llama-other" in wait.probe(_params(replica, api_key=KEY, model_name="tiny-llama-other"))


@pytest.mark.parametrize("key", [None, "sk-vllm-other"])
def test_without_the_right_key_the_probe_gets_401(replica: str, key: str | None) -> None:
    # main() turns a 401 or 403 into an immediate failure: waiting does not change the key.
    with pytest.raises(urllib.error.HTTPError) as raised:
        wait.probe(_params(replica, api_key=key))
    assert raised.value.code == 401


def test_health_needs_no_key(replica: str) -> None:
    assert wait.probe(_params(replica, model_name=None)) is None


def test_the_key_goes_to_the_replica_only_never_to_a_redirects_target(replica: str) -> None:
    """A replica's address that answers /v1/models with a redirect to another host and port: the
    replicas' API key is not sent there (urllib sends a Request's headers to any redirect's target)."""
    seen: list[str | None] = []

    class _Elsewhere(JSONHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            seen.append(self.headers.get("Authorization"))
            self._answer(200, {"data": [{"id": "tiny-llama-host-0"}]})

    class _Redirecting(JSONHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{elsewhere.server_address[1]}/v1/models")
            self.send_header("Content-Length", "0")
            self.end_headers()

    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), _Elsewhere)
    first = ThreadingHTTPServer(("127.0.0.1", 0), _Redirecting)
    for server in (elsewhere, first):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait.get(f"http://127.0.0.1:{first.server_address[1]}/v1/models", 10, api_key=KEY)
    finally:
        first.shutdown()
        elsewhere.shutdown()
    assert seen == [None], seen


def test_a_refused_key_fails_at_once_and_is_never_printed(replica: str) -> None:
    """The module through ansible: a wrong key stops the wait at once (not after timeout=600),
    naming the cause; the key, a no_log option, appears nowhere in the -vvv output."""
    wrong = "sk-vllm-wrong-4f1c2e"
    started = time.monotonic()
    run = subprocess.run(
        ["ansible", "localhost", "-vvv", "-m", "labctl_service_wait", "-a",
         json.dumps({"unit": "labctl-test-none.service", "url": replica, "model_name": "tiny-llama-host-0",
                     "api_key": wrong, "timeout": 600, "interval": 1})],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        env={**os.environ, "ANSIBLE_LIBRARY": str(REPO / "library"), "ANSIBLE_LOCALHOST_WARNING": "false"})
    output = run.stdout + run.stderr
    assert run.returncode != 0 and time.monotonic() - started < 120, output[-2000:]
    assert "answered 401: the service refuses the API key it was given" in output, output[-2000:]
    assert wrong not in output


@pytest.mark.parametrize(("state", "queued", "before", "now", "gives_up"), [
    ("inactive", True, 0, 0, False),  # a start job queued, waiting for the replica before it on its GPU
    ("inactive", False, 0, 0, True),  # stopped, nothing queued
    ("activating", False, 0, 0, False),
    ("failed", True, 0, 0, True),
    ("activating", False, 0, 1, True),  # restarted itself
])
def test_an_inactive_unit_with_a_queued_start_is_still_starting(state: str, queued: bool, before: int, now: int,
                                                                 gives_up: bool) -> None:
    assert wait.gave_up(state, queued, before, now) is gives_up


def test_the_wait_outlasts_a_start_job_queued_behind_another_unit(replica: str, tmp_path: Path) -> None:
    """Issue 39: the replicas of a shared GPU start one after another (systemd: After= the one before it,
    which counts as started once it serves). While the one before it starts, the next one's start job
    waits: `systemctl show` says ActiveState=inactive with a Job (as systemd 252 does, molecule/gpu). The
    wait must not take that for a stopped unit (before: "vllm@100.service is inactive ... while starting")."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    # The first three reads: queued behind another unit; then running.
    fake.write_text("#!/bin/sh\necho x >> " + str(calls) + "\nn=$(wc -l < " + str(calls) + ")\n"
                    "if [ \"$n\" -le 3 ]; then printf 'ActiveState=inactive\\nNRestarts=0\\nMainPID=0\\nJob=128\\n'; "
                    "else printf 'ActiveState=active\\nNRestarts=0\\nMainPID=4242\\nJob=\\n'; fi\n")
    fake.chmod(0o755)
    run = subprocess.run(
        ["ansible", "localhost", "-m", "labctl_service_wait", "-a",
         json.dumps({"unit": "vllm@100.service", "url": replica, "model_name": "tiny-llama-host-0",
                     "api_key": KEY, "timeout": 60, "interval": 0.2})],
        capture_output=True, text=True, timeout=300, check=False, cwd=REPO,
        env={**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
             "ANSIBLE_LIBRARY": str(REPO / "library"), "ANSIBLE_LOCALHOST_WARNING": "false"})
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-2000:]
    assert calls.read_text().count("x") >= 2  # the state was read before and while polling
