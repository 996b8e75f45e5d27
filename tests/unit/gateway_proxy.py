"""The real LiteLLM proxy for the unit tests: LiteLLM 1.106.0 from the test bundle's wheel set (a
venv built once under build/gateway-venv, like `make bench-gateway`'s), the litellm role's own
config.yaml and callbacks as `labctl gateway-config` renders them for an inventory, the role's
litellm.env, in front of a recording replica (recording_replica.py). No Redis here: the router's
Redis settings resolve to nothing and LiteLLM keeps its counters in memory, exact with one worker."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from labctl.gateway_config import render
from labctl.keys import KeyStore

from .recording_replica import Recorder, replica

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / "build" / "gateway-venv"
TEMPLATES = REPO / "roles" / "litellm" / "templates" / "etc" / "labctl" / "litellm"
MASTER = "sk-unit-master-key"
METRICS = "sk-metrics-unit"
VLLM_KEY = "sk-vllm-unit"


def bundle() -> Path:
    return Path(os.environ.get("LABCTL_BUNDLE") or REPO / "build" / "bundles" / "test")


def gateway_venv() -> Path:
    """build/gateway-venv with the bundle's litellm wheel set (offline, hashes checked), made once
    per lock (its sha256 in .stamp; the Makefile's unit target makes the same)."""
    lock = bundle() / "wheels" / "sets" / "litellm.txt"
    if not lock.exists():
        pytest.skip("the test bundle is not built (make bundle-test)")
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    stamp = VENV / ".stamp"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".gateway-venv.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_text().strip() != digest:
            shutil.rmtree(VENV, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
            subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", "--no-index", "--find-links",
                            str(bundle() / "wheels"), "--no-deps", "--require-hashes", "-r", str(lock)],
                           check=True, timeout=1800)
            stamp.write_text(digest + "\n")
    return VENV


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def write_inventory(root: Path, variables: dict[str, Any], gpu_address: str | None = None) -> Path:
    """One host that is both the GPU host (one replica, on 127.0.0.1) and the gateway; with
    ``gpu_address``, the gateway ``unit`` and a GPU host ``gpu1`` of that address (its replica
    listens there: the topology makes it HTTPS)."""
    (root / "group_vars" / "all").mkdir(parents=True)
    if gpu_address is None:
        groups: dict[str, Any] = {"gpu_hosts": {"hosts": {"unit": {"lab_expected_gpu_count": 1}}},
                                  "gateway_hosts": {"hosts": {"unit": None}}}
    else:
        groups = {"gpu_hosts": {"hosts": {"gpu1": {"lab_expected_gpu_count": 1, "ansible_host": gpu_address}}},
                  "gateway_hosts": {"hosts": {"unit": {"ansible_host": "127.0.0.1"}}}}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"lab": {"children": groups}}}}))
    # The model every inventory names (group_vars/all/project.yml, which a real inventory links).
    project = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
    (root / "group_vars" / "all" / "site.yml").write_text(yaml.safe_dump({"lab_model_name": project["lab_model_name"], **variables}))
    return root


def render_env(variables: dict[str, Any]) -> dict[str, str]:
    """The role's litellm.env for these variables, as a dict."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["comment"] = lambda text: "# " + text
    env.filters["bool"] = lambda value: value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    text = env.from_string((TEMPLATES / "litellm.env.j2").read_text()).render(ansible_managed="Ansible managed", **variables)
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return dict(pairs)


@dataclass
class Gateway:
    url: str
    recorder: Recorder
    config: dict[str, Any]
    keys_file: Path
    log: Path
    pid: int = 0  # the proxy's main process (uvicorn's supervisor with several workers)
    rundir: Path = Path()  # config.yaml and the callbacks; workers/: their settings stamps

    def deployments(self) -> list[dict[str, Any]]:
        return list(self.config["model_list"])

    def model_of(self, priority: int) -> str:
        return next(str(d["model_name"]) for d in self.deployments() if d["litellm_params"]["extra_body"]["priority"] == priority)

    def deployment_id(self, model: str) -> str:
        return next(str(d["model_info"]["id"]) for d in self.deployments() if d["model_name"] == model)

    def deployment_name(self, model: str) -> str:
        return next(str(d["litellm_params"]["model"]) for d in self.deployments() if d["model_name"] == model)

    def request(self, path: str, key: str | None, body: Any = None, *, method: str = "POST",
                headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict[str, str], str]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        if key is not None:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as err:
            return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read().decode(errors="replace")


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"LiteLLM exited ({proc.returncode}) before it answered:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"LiteLLM not ready after {timeout:.0f} s:\n{log.read_text()[-4000:]}")


def install_keys(gw: Gateway, store_dir: Path, made: dict[str, tuple[str, dict[str, Any]]],
                 classes: list[dict[str, Any]]) -> dict[str, str]:
    """Application keys (name: (class, limits)) made with labctl's store and handed to the running
    gateway as the role sends them (app-keys.json, litellm_model_classes ``classes``): name -> key."""
    sys.path.insert(0, str(REPO / "roles" / "litellm" / "filter_plugins"))
    from litellm_filters import labctl_app_keys_doc

    store = KeyStore(store_dir / "app-keys.json")
    keys = {name: store.add(name, key_class, **limits)[1] for name, (key_class, limits) in made.items()}
    tmp = gw.keys_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(labctl_app_keys_doc([k.record() for k in store.load()], classes)))
    tmp.replace(gw.keys_file)
    return keys


@contextlib.contextmanager
def running_gateway(root: Path, variables: dict[str, Any], replica_tls: tuple[str, Path, Path] | None = None,
                    num_workers: int = 1) -> Iterator[Gateway]:
    """The role's gateway for an inventory of ``variables`` (plus the replica's port and the keys
    file under ``root``), started, with the recording replica behind it. ``replica_tls`` (address,
    certificate, key): the replica is on another host of that address (a local one), so it serves
    HTTPS with that certificate; the inventory's litellm_vllm_ca_file says which CA the gateway trusts."""
    venv = gateway_venv()
    address = "127.0.0.1" if replica_tls is None else replica_tls[0]
    replica_port, proxy_port = free_port(), free_port()
    keys_file = root / "app-keys.json"
    inventory = write_inventory(root / "inventory", {
        **variables, "lab_vllm_base_port": replica_port, "litellm_app_keys_path": str(keys_file),
        "lab_vllm_api_key": VLLM_KEY, "lab_litellm_metrics_key": METRICS, "lab_litellm_database_mode": False},
        None if replica_tls is None else address)
    callbacks: dict[str, dict[str, str]] = {}
    configs, failures = render(inventory, callbacks=callbacks)
    assert not failures and configs, failures
    rundir = root / "gateway"
    rundir.mkdir()
    (rundir / "config.yaml").write_text(configs["unit"])
    for name, text in callbacks["unit"].items():
        (rundir / name).write_text(text)
    config = yaml.safe_load(configs["unit"])
    served = {d["litellm_params"]["model"].split("/", 1)[1] for d in config["model_list"]}
    assert len(served) == 1, served
    environment = render_env({
        "litellm_master_key": MASTER, "litellm_salt_key": "sk-unit-salt", "__litellm_metrics_auth": True,
        "litellm_metrics_key": METRICS, "litellm_vllm_api_key": VLLM_KEY, "litellm_redis_host": "", "litellm_redis_port": "",
        "litellm_redis_password": "", "litellm_database_mode": False, "litellm_admin_ui": False,
        "litellm_state_dir": str(rundir), "litellm_group": "litellm"})
    environment = {k: v for k, v in environment.items() if not k.startswith("REDIS_")}  # no Redis here
    environment["PROMETHEUS_MULTIPROC_DIR"] = str(rundir / "prometheus")
    (rundir / "prometheus").mkdir()
    if "LABCTL_WORKER_STAMPS" in environment:  # the workers' settings stamps (issue 40), here beside the config
        environment["LABCTL_WORKER_STAMPS"] = str(rundir / "workers")
        (rundir / "workers").mkdir()
    log = rundir / "litellm.log"
    tls = None if replica_tls is None else (replica_tls[1], replica_tls[2])
    # lab_models of one embedding model: the replica answers /v1/embeddings only, as vLLM's pooling runner does.
    kind = "embed" if any(m.get("kind") == "embed" for m in variables.get("lab_models") or []) else "generate"
    with replica(served.pop(), VLLM_KEY, replica_port, address, tls, kind) as (_, recorder):
        proc = subprocess.Popen(
            [str(venv / "bin" / "litellm"), "--config", str(rundir / "config.yaml"), "--host", "127.0.0.1",
             "--port", str(proxy_port), "--num_workers", str(num_workers),
             # As the unit: uvicorn's supervisor waits this long for a new worker on a reload (SIGHUP).
             "--timeout_worker_healthcheck", "300"],
            cwd=rundir, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LITELLM_LOG": "ERROR", **environment},
            stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{proxy_port}"
            _wait(url + "/health/liveliness", proc, log)
            yield Gateway(url=url, recorder=recorder, config=config, keys_file=keys_file, log=log, pid=proc.pid, rundir=rundir)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
