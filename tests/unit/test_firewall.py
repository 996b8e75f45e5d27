"""The host firewall (roles/firewall): its rules from the lab's topology, and the ruleset the role's
own template renders (through ansible-playbook) loaded into the kernel of a network namespace, where
real TCP connections from the other hosts' addresses show what is open to whom.

Two namespaces joined by a veth pair: "host" holds one lab host's address and the ruleset, with
listeners on its ports; "peer" holds the addresses of every other party (the other hosts, the control
node, an admin network, a client network, an outsider) and connects from each in turn. Needs root
and nft (make test runs as root; scripts/ensure-host-tools.sh installs nftables).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from labctl.topology import lab_topology

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "roles" / "firewall" / "filter_plugins"))
sys.path.insert(0, str(REPO / "roles" / "preflight" / "filter_plugins"))
from firewall_rules import labctl_firewall_replica_guard, labctl_firewall_rules  # noqa: E402
from preflight_bundle import labctl_preflight_variable_problems  # noqa: E402
from preflight_firewall import labctl_preflight_network_problems as labctl_firewall_cidr_problems  # noqa: E402
from preflight_firewall import labctl_preflight_open_problems  # noqa: E402

# The scale-out shape: one gateway-and-monitoring host, two GPU hosts.
ADDRESS = {"gw": "10.89.77.10", "gpu1": "10.89.77.11", "gpu2": "10.89.77.12"}
CONTROL = "10.89.70.5"        # where the run's SSH comes from
ADMIN_NET, ADMIN = "10.89.60.0/24", "10.89.60.7"
CLIENT_NET, CLIENT = "192.168.7.0/24", "192.168.7.5"
OUTSIDER = "172.30.1.9"


def _topology() -> dict[str, Any]:
    groups = {"lab": ["gw", "gpu1", "gpu2"], "gateway_hosts": ["gw"], "monitoring_hosts": ["gw"], "gpu_hosts": ["gpu1", "gpu2"]}
    given = {h: {"ansible_host": a, "lab_expected_gpu_count": 2 if h != "gw" else 0} for h, a in ADDRESS.items()}
    topo = lab_topology(groups, given, {}, gpu_source="inventory")
    assert not topo["problems"], topo["problems"]
    return topo


def _rules(host: str, **overrides: Any) -> dict[str, Any]:
    topo = _topology()
    args: dict[str, Any] = {"client_networks": [CLIENT_NET], "admin_networks": [ADMIN_NET], "control_node": CONTROL}
    args.update(overrides)
    return labctl_firewall_rules(topo["flows"], topo["hosts"], host, args["client_networks"], args["admin_networks"],
                                 args["control_node"], [22])


def test_each_port_is_open_to_whom_the_topology_says() -> None:
    gpu = _rules("gpu1")
    assert not gpu["problems"]
    assert gpu["ssh"] == {"ports": [22], "any": False, "v4": [ADMIN_NET, CONTROL], "v6": []}
    # The replicas and the node exporter from the gateway-and-monitoring host only.
    assert [(r["port"], r["service"], r["v4"]) for r in gpu["rules"]] == [
        (8000, "vllm@0", [ADDRESS["gw"]]), (8001, "vllm@1", [ADDRESS["gw"]]), (9100, "node_exporter", [ADDRESS["gw"]])]
    gw = _rules("gw")
    # The gateway and Grafana from the clients; its own exporter from itself (loopback: no rule).
    assert [(r["port"], r["service"], r["v4"]) for r in gw["rules"]] == [
        (3000, "grafana", [CLIENT_NET]), (4000, "litellm", [CLIENT_NET]), (9100, "node_exporter", [])]


def test_a_topology_change_changes_the_rules() -> None:
    topo = _topology()
    groups = {"lab": ["gw", "gpu1", "gpu2"], "gateway_hosts": ["gw", "gpu2"], "monitoring_hosts": ["gw"], "gpu_hosts": ["gpu1", "gpu2"]}
    given = {h: {"ansible_host": a, "lab_expected_gpu_count": 2 if h != "gw" else 0} for h, a in ADDRESS.items()}
    wider = lab_topology(groups, given, {}, gpu_source="inventory")
    before = labctl_firewall_rules(topo["flows"], topo["hosts"], "gpu1", [CLIENT_NET], [], CONTROL)
    after = labctl_firewall_rules(wider["flows"], wider["hosts"], "gpu1", [CLIENT_NET], [], CONTROL)
    assert before["rules"][0]["v4"] == [ADDRESS["gw"]]
    assert after["rules"][0]["v4"] == [ADDRESS["gw"], ADDRESS["gpu2"]]  # a second gateway reaches the replicas


def test_ssh_stays_open_to_all_when_no_source_is_known_and_ipv6_goes_apart() -> None:
    assert _rules("gpu1", admin_networks=[], control_node="")["ssh"]["any"] is True
    both = _rules("gpu1", admin_networks=["fd00:5::/64", "10.1.0.0/16", "10.1.2.0/24"], control_node="")
    assert both["ssh"] == {"ports": [22], "any": False, "v4": ["10.1.0.0/16"], "v6": ["fd00:5::/64"]}


def test_bad_networks_and_addresses_are_named() -> None:
    assert labctl_firewall_cidr_problems(["10.0.0.0/8"], "lab_firewall_client_networks") == []
    problems = labctl_firewall_cidr_problems(["10.1.2.3/8", "clients", "300.1.0.0/16"], "lab_firewall_client_networks")
    assert len(problems) == 3 and all(p.startswith("lab_firewall_client_networks: ") for p in problems), problems
    assert "has host bits set" in problems[0]
    assert labctl_firewall_cidr_problems("10.0.0.0/8", "lab_firewall_admin_networks")[0].startswith(
        "lab_firewall_admin_networks must be a list")
    topo = _topology()
    topo["hosts"]["gw"]["address"] = "gw.lab.example"
    out = labctl_firewall_rules(topo["flows"], topo["hosts"], "gpu1", ["10.0.0.0/33"], [], "")
    assert any("lab_firewall_client_networks: '10.0.0.0/33'" in p for p in out["problems"]), out["problems"]
    assert any(p.startswith("gw: its address 'gw.lab.example'") for p in out["problems"]), out["problems"]
    # A host's own address is never needed: one host without a default route builds its rules.
    assert not labctl_firewall_rules(topo["flows"], topo["hosts"], "gw", [CLIENT_NET], [], "")["problems"]


# -- closed by default (issue 29): preflight refuses the wide defaults unless a scenario accepts them -

def test_preflight_refuses_the_default_client_networks_and_ssh_from_everywhere() -> None:
    project = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
    default = project["lab_firewall_client_networks"]
    assert project["lab_firewall_accept_open"] == []
    # A lab inventory that changes nothing, run locally (no SSH_CLIENT): both refused, each saying what to set.
    client, ssh = labctl_preflight_open_problems(default, project["lab_firewall_admin_networks"], "", [])
    assert client.startswith("lab_firewall_client_networks ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16'] opens the gateway "
                             "and Grafana to a whole private range (the project default: all of RFC 1918)"), client
    assert "lab_firewall_accept_open" in client
    assert ssh.startswith("SSH would stay open to every address: this run does not come over SSH"), ssh
    assert "lab_firewall_admin_networks" in ssh
    # One whole range, or every address, is as open; a subnet is not.
    assert len(labctl_preflight_open_problems(["192.168.0.0/16"], [], CONTROL, [])) == 1
    assert len(labctl_preflight_open_problems(["10.0.0.0/7"], [], CONTROL, [])) == 1
    assert len(labctl_preflight_open_problems(["0.0.0.0/0"], [], CONTROL, [])) == 1
    assert len(labctl_preflight_open_problems(["::/0"], [], CONTROL, [])) == 1
    assert labctl_preflight_open_problems([CLIENT_NET, "10.20.0.0/16", "fd00:7::/64"], [], CONTROL, []) == []
    # SSH: a run over SSH (the control node's address) or an admin network closes it.
    assert labctl_preflight_open_problems([CLIENT_NET], [ADMIN_NET], "", []) == []
    # A scenario says what it keeps open, and only that is let through.
    assert labctl_preflight_open_problems(default, [], "", ["client_networks", "ssh"]) == []
    assert labctl_preflight_open_problems(default, [], "", ["ssh"]) == [client]
    assert labctl_preflight_open_problems(default, [], "", ["client_networks"]) == [ssh]
    assert labctl_preflight_open_problems(default, [], "", ["everything"]) == [
        "lab_firewall_accept_open must be a list of client_networks, ssh, got ['everything']"]


def test_the_scenarios_that_keep_the_defaults_say_so() -> None:
    """The sandbox and every molecule scenario run over docker exec (no SSH) with the default client
    networks: they accept both by name; the example lab inventory accepts nothing."""
    for path in ("molecule/_shared/group_vars/all/molecule.yml", "inventories/sandbox/group_vars/all/site.yml"):
        assert yaml.safe_load((REPO / path).read_text())["lab_firewall_accept_open"] == ["client_networks", "ssh"], path
    lab = yaml.safe_load((REPO / "inventories" / "lab" / "group_vars" / "all" / "site.yml").read_text())
    assert lab.get("lab_firewall_accept_open", []) == []
    specs = {"lab": yaml.safe_load((REPO / "roles" / "preflight" / "files" / "project_argument_specs.yml").read_text())[
        "argument_specs"]["main"]["options"]}
    assert labctl_preflight_variable_problems({"lab_firewall_accept_open": ["ssh"]}, specs, ["lab_firewall_accept_open"]) == []
    assert labctl_preflight_variable_problems({"lab_firewall_accept_open": ["all"]}, specs, ["lab_firewall_accept_open"])


# -- the rendered ruleset in a kernel -----------------------------------------------------------------

def _render(tmp_path: Path, host: str, clients: list[str] | None = None) -> Path:
    """The role's template for ``host``, rendered by ansible-playbook with the role's defaults and
    filters, validated with `nft -c` as the role's task does. ``clients``: firewall_replica_clients
    (users of this machine standing in for the proxy's and Prometheus's)."""
    out = tmp_path / f"{host}.nft"
    playbook = tmp_path / "render.yml"
    playbook.write_text(textwrap.dedent(f"""\
        - name: Render the firewall
          hosts: all
          gather_facts: false
          vars_files: [{REPO}/roles/firewall/defaults/main.yml]
          tasks:
            - name: Compute the rules as the role does
              ansible.builtin.set_fact:
                __firewall: >-
                  {{{{ firewall_flows | labctl_firewall_rules(firewall_hosts, inventory_hostname, firewall_client_networks,
                     firewall_admin_networks, '{CONTROL}', firewall_ssh_ports) }}}}
            - name: Read the users as the role does
              ansible.builtin.getent:
                database: passwd
              register: __firewall_passwd
            - name: Compute who may connect to the replicas as the role does
              ansible.builtin.set_fact:
                __firewall_guard: >-
                  {{{{ firewall_replicas | labctl_firewall_replica_guard(inventory_hostname, firewall_replica_clients,
                     __firewall_passwd.ansible_facts.getent_passwd) }}}}
            - name: Refuse what the role refuses
              ansible.builtin.assert:
                that: __firewall_guard.problems | length == 0
            - name: Write the rules
              ansible.builtin.template:
                src: {REPO}/roles/firewall/templates/etc/labctl/firewall/labctl.nft.j2
                dest: "{out}"
                mode: "0640"
                validate: nft -c -f %s
        """))
    extra: dict[str, Any] = {"lab_topology": _topology(), "lab_firewall_client_networks": [CLIENT_NET],
                             "lab_firewall_admin_networks": [ADMIN_NET], "ansible_connection": "local",
                             "ansible_python_interpreter": sys.executable}
    if clients is not None:
        extra["firewall_replica_clients"] = clients
    env = dict(os.environ, ANSIBLE_FILTER_PLUGINS=str(REPO / "roles" / "firewall" / "filter_plugins"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".tmp"), ANSIBLE_HOME=str(tmp_path / ".ansible"))
    run = subprocess.run([str(BIN / "ansible-playbook"), "-i", f"{host},", str(playbook), "-e", json.dumps(extra)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return out


def _ns(name: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", name, *cmd], capture_output=True, text=True, check=check, timeout=60)


@pytest.fixture
def netns() -> Iterator[tuple[str, str]]:
    assert os.geteuid() == 0, "the firewall test loads rules into a network namespace: run as root (make test does)"
    assert shutil.which("nft") and shutil.which("ip"), "nft and ip are missing: run scripts/ensure-host-tools.sh"
    host, peer = f"lfw-h{os.getpid()}", f"lfw-p{os.getpid()}"
    veth = f"lfw{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", host], check=True)
    subprocess.run(["ip", "netns", "add", peer], check=True)
    try:
        subprocess.run(["ip", "link", "add", f"{veth}a", "netns", host, "type", "veth", "peer", "name", f"{veth}b", "netns", peer],
                       check=True)
        _ns(host, "ip", "link", "set", f"{veth}a", "name", "eth0")
        _ns(peer, "ip", "link", "set", f"{veth}b", "name", "eth0")
        for ns in (host, peer):
            _ns(ns, "ip", "link", "set", "lo", "up")
            _ns(ns, "ip", "link", "set", "eth0", "up")
        yield host, peer
    finally:
        subprocess.run(["ip", "netns", "del", host], check=False)
        subprocess.run(["ip", "netns", "del", peer], check=False)


_LISTEN = """
import socket, sys, threading, time
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port)); s.listen(64); socks.append(s)
def serve(s):
    while True:
        c, _ = s.accept(); c.sendall(b"ok"); c.close()
for s in socks:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
print("ready", flush=True)
time.sleep(600)
"""

_PROBE = """
import json, socket, sys
out = {}
for pair in sys.argv[1:]:
    source, port = pair.split(",")
    s = socket.socket(); s.settimeout(0.5); s.bind((source, 0))
    try:
        s.connect((TARGET, int(port))); out[pair] = s.recv(2) == b"ok"
    except OSError:
        out[pair] = False
    finally:
        s.close()
print(json.dumps(out))
"""


def _reachable(netns: tuple[str, str], target: str, pairs: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
    _host, peer = netns
    code = _PROBE.replace("TARGET", repr(target))
    run = _ns(peer, sys.executable, "-c", code, *[f"{s},{p}" for s, p in pairs])
    return {(s, int(p)): ok for key, ok in json.loads(run.stdout).items() for s, p in [key.split(",")]}


def _address_the_pair(netns: tuple[str, str], me: str) -> None:
    host, peer = netns
    veth_peer = "eth0"
    _ns(host, "ip", "addr", "add", f"{me}/32", "dev", "eth0")
    for address in [*ADDRESS.values(), CONTROL, ADMIN, CLIENT, OUTSIDER]:
        if address != me:
            _ns(peer, "ip", "addr", "add", f"{address}/32", "dev", veth_peer)
            _ns(host, "ip", "route", "add", f"{address}/32", "dev", "eth0")
    _ns(peer, "ip", "route", "add", f"{me}/32", "dev", veth_peer)


def _listen(netns: tuple[str, str], ports: list[int]) -> subprocess.Popen[str]:
    host, _peer = netns
    proc = subprocess.Popen(["ip", "netns", "exec", host, sys.executable, "-c", _LISTEN, *map(str, ports)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_gpu_host_opens_its_replicas_to_the_gateway_and_ssh_to_the_control_node(tmp_path: Path, netns: tuple[str, str]) -> None:
    ruleset = _render(tmp_path, "gpu1")
    host, peer = netns
    me = ADDRESS["gpu1"]
    _address_the_pair(netns, me)
    listener = _listen(netns, [22, 8000, 8001, 9100, 4000, 5432])
    try:
        open_before = _reachable(netns, me, [(OUTSIDER, 8000), (ADDRESS["gpu2"], 5432)])
        assert all(open_before.values()), f"the namespaces do not connect without the firewall: {open_before}"
        _ns(host, "nft", "-f", str(ruleset))
        # SSH is the chain's first rule.
        listing = _ns(host, "nft", "list", "chain", "inet", "labctl", "input").stdout.splitlines()
        first = next(line.strip() for line in listing if line.strip() and not line.strip().startswith(("table", "chain", "type", "#")))
        assert first.startswith("tcp dport 22 ip saddr"), listing
        expected = {
            (CONTROL, 22): True, (ADMIN, 22): True, (ADDRESS["gw"], 22): False, (CLIENT, 22): False, (OUTSIDER, 22): False,
            (ADDRESS["gw"], 8000): True, (ADDRESS["gw"], 8001): True, (ADDRESS["gw"], 9100): True,
            (ADDRESS["gpu2"], 8000): False, (ADDRESS["gpu2"], 9100): False, (CLIENT, 8000): False, (CONTROL, 8000): False,
            (ADDRESS["gw"], 4000): False, (CLIENT, 4000): False, (ADDRESS["gw"], 5432): False, (OUTSIDER, 9100): False,
        }
        assert _reachable(netns, me, list(expected)) == expected
        # A connection open while the rules are loaded again (a re-run, a change) keeps working.
        keep = _ns(peer, sys.executable, "-c", textwrap.dedent(f"""\
            import socket, subprocess
            s = socket.socket(); s.bind(({CONTROL!r}, 0)); s.connect(({me!r}, 22)); s.settimeout(5)
            subprocess.run(["ip", "netns", "exec", {host!r}, "nft", "-f", {str(ruleset)!r}], check=True)
            print(s.recv(2).decode())
            """))
        assert keep.stdout.strip() == "ok", keep.stderr
        # Loading twice leaves one table, the same rules.
        assert _ns(host, "nft", "list", "tables").stdout.split().count("labctl") == 1
    finally:
        listener.kill()


def test_the_gateway_host_opens_the_gateway_and_grafana_to_the_clients(tmp_path: Path, netns: tuple[str, str]) -> None:
    ruleset = _render(tmp_path, "gw", clients=["root", "daemon"])
    host, _peer = netns
    me = ADDRESS["gw"]
    _address_the_pair(netns, me)
    listener = _listen(netns, [22, 3000, 4000, 9090, 9100, 5432, 6379])
    try:
        _ns(host, "nft", "-f", str(ruleset))
        expected = {
            (CLIENT, 4000): True, (CLIENT, 3000): True, (OUTSIDER, 4000): False, (ADDRESS["gpu1"], 4000): False,
            (ADDRESS["gpu1"], 9100): False, (CLIENT, 9090): False, (ADDRESS["gpu1"], 5432): False, (ADDRESS["gpu2"], 6379): False,
            (CONTROL, 22): True,
        }
        assert _reachable(netns, me, list(expected)) == expected
        # From the host itself (loopback), everything it serves answers.
        local = _ns(host, sys.executable, "-c", "import socket; [socket.create_connection(('127.0.0.1', p), 1).close() for p in "
                    "(3000, 4000, 9090, 9100, 5432, 6379)]; print('ok')")
        assert local.stdout.strip() == "ok"
    finally:
        listener.kill()


# -- the replicas' clients: vLLM answers /invocations, /tokenize... without its key (issue 29) --------

def test_only_the_replicas_clients_are_named_and_every_replica_is_guarded() -> None:
    topo = _topology()
    passwd = {"root": ["x", "0", "0", "", "/root", "/bin/sh"], "litellm": ["x", "998", "998", "", "/", "/sbin/nologin"],
              "prometheus": ["x", "997", "997", "", "/", "/sbin/nologin"]}
    gpu = labctl_firewall_replica_guard(topo["replicas"], "gpu1", ["root"], passwd)
    # This host's replicas on any local address; the other GPU host's by its address.
    assert gpu == {"users": [{"name": "root", "uid": 0}], "uids": [0], "local_ports": [8000, 8001],
                   "remote": [{"host": "gpu2", "family": "ip", "address": ADDRESS["gpu2"], "ports": [8000, 8001]}], "problems": []}
    gw = labctl_firewall_replica_guard(topo["replicas"], "gw", ["root", "litellm", "prometheus"], passwd)
    assert gw["uids"] == [0, 997, 998] and gw["local_ports"] == []
    assert [(r["address"], r["ports"]) for r in gw["remote"]] == [(ADDRESS["gpu1"], [8000, 8001]), (ADDRESS["gpu2"], [8000, 8001])]
    missing = labctl_firewall_replica_guard(topo["replicas"], "gw", ["root", "litellm"], {"root": passwd["root"]})
    assert missing["problems"] == [
        ("firewall_replica_clients: the user 'litellm' does not exist on gw (its role creates it: playbooks/host.yml runs the "
         "accounts of the replicas' clients before the firewall)")]
    assert labctl_firewall_replica_guard([], "gw", "root", passwd)["problems"] == [
        "firewall_replica_clients must be a list of user names, got 'root'"]


def test_the_role_defaults_name_root_the_proxy_and_prometheus_by_the_hosts_roles() -> None:
    defaults = (REPO / "roles" / "firewall" / "defaults" / "main.yml").read_text()
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    expression = yaml.safe_load(defaults)["firewall_replica_clients"]
    topo = _topology()
    assert env.from_string(expression).render(lab_topology=topo, inventory_hostname="gpu1").strip() == "['root']"
    assert env.from_string(expression).render(lab_topology=topo, inventory_hostname="gw").strip() == \
        "['root', 'litellm', 'prometheus']"


_LOCAL_PROBE = """
import json, socket, sys
out = {}
for pair in sys.argv[1:]:
    address, port = pair.rsplit(",", 1)
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET); s.settimeout(2)
    try:
        s.connect((address, int(port))); out[pair] = "open" if s.recv(2) == b"ok" else "silent"
    except ConnectionRefusedError:
        out[pair] = "refused"
    except OSError as e:
        out[pair] = "error " + str(e)
    finally:
        s.close()
print(json.dumps(out))
"""


def _as_user(netns: tuple[str, str], user: str, targets: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Connections opened by a local user of the "host" namespace (the system's python3: a user other
    than root may run it), each open (the listener's "ok" came), refused, or an error."""
    host, _peer = netns
    account = pwd.getpwnam(user)
    run = _ns(host, "setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups",
              "/usr/bin/python3", "-c", _LOCAL_PROBE, *[f"{a},{p}" for a, p in targets])
    return {(a, int(p)): state for key, state in json.loads(run.stdout).items() for a, p in [key.rsplit(",", 1)]}


def _listen_in(ns: str, ports: list[int]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _LISTEN, *map(str, ports)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout and proc.stdout.readline().strip() == "ready"
    return proc


def test_on_a_gpu_host_only_root_reaches_its_replicas(tmp_path: Path, netns: tuple[str, str]) -> None:
    """A local user who is no client of the replicas (nobody) gets a reset from 127.0.0.1 and from the
    host's own address on the replicas' ports, and still reaches any other port; root connects."""
    ruleset = _render(tmp_path, "gpu1")
    host, _peer = netns
    me = ADDRESS["gpu1"]
    _address_the_pair(netns, me)
    listener = _listen_in(host, [8000, 8001, 9100])
    targets = [("127.0.0.1", 8000), ("127.0.0.1", 8001), (me, 8000), ("127.0.0.1", 9100), (me, 9100)]
    try:
        before = _as_user(netns, "nobody", targets)
        assert set(before.values()) == {"open"}, f"every port answers before the rules: {before}"
        _ns(host, "nft", "-f", str(ruleset))
        assert _as_user(netns, "nobody", targets) == {
            ("127.0.0.1", 8000): "refused", ("127.0.0.1", 8001): "refused", (me, 8000): "refused",
            ("127.0.0.1", 9100): "open", (me, 9100): "open"}
        assert set(_as_user(netns, "root", targets).values()) == {"open"}
        # The gateway host still connects from outside (the inbound chain's rule).
        assert _reachable(netns, me, [(ADDRESS["gw"], 8000)]) == {(ADDRESS["gw"], 8000): True}
    finally:
        listener.kill()


def test_on_the_gateway_host_only_the_proxy_and_root_reach_other_hosts_replicas(tmp_path: Path, netns: tuple[str, str]) -> None:
    """The gateway host's users: root and the proxy's user (here "daemon", a user this machine has)
    connect to the GPU hosts' replicas; nobody gets a reset, and still reaches their other ports."""
    ruleset = _render(tmp_path, "gw", clients=["root", "daemon"])
    host, peer = netns
    _address_the_pair(netns, ADDRESS["gw"])
    listener = _listen_in(peer, [8000, 8001, 9100])
    targets = [(ADDRESS["gpu1"], 8000), (ADDRESS["gpu2"], 8001), (ADDRESS["gpu1"], 9100)]
    try:
        _ns(host, "nft", "-f", str(ruleset))
        assert _as_user(netns, "nobody", targets) == {
            (ADDRESS["gpu1"], 8000): "refused", (ADDRESS["gpu2"], 8001): "refused", (ADDRESS["gpu1"], 9100): "open"}
        assert set(_as_user(netns, "daemon", targets).values()) == {"open"}
        assert set(_as_user(netns, "root", targets).values()) == {"open"}
    finally:
        listener.kill()
