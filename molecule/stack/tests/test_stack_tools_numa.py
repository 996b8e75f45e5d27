"""Function calling through the gateway, and the replicas bound to their GPUs' NUMA node (issue 28).

Tool calling: an application (an agent) sends tools with the openai SDK through the gateway, plain
and streamed. LiteLLM passes `tools`/`tool_choice` on; the replicas run with vLLM's
--enable-auto-tool-choice and the model's parser (roles/vllm: vllm_tool_call_parser; the tiny model:
hermes). Without them every one of these requests is an HTTP 400 from vLLM (`"auto" tool choice
requires --enable-auto-tool-choice and --tool-call-parser to be set`), passed on by the gateway. The
tiny model is random: tool_choice "required" and a named function make vLLM constrain the output to a
call of the function (structured outputs), which comes back as `tool_calls` in the OpenAI shape; "auto"
must be accepted (the model may answer in text).

NUMA: the stand-in server's sysfs (prepare.yml, lab_sysfs_root) puts both GPUs on node 0 with this
machine's node 0 CPUs; each replica runs under a drop-in binding it there, which systemd applies and
the kernel enforces on the running processes."""

from __future__ import annotations

import json
import re
import time

import pytest
from gateway_requests import tool_calls_script  # tests/ (molecule/conftest.py puts it on the path)
from test_stack import ENV_FILE, PUBLIC, REPLICAS, _main_pids, _report, _site, _traffic  # same directory

# The gateway's venv: the openai SDK is one of LiteLLM's dependencies (the bundle's litellm set).
LITELLM_PYTHON = "/opt/labctl/litellm/current/bin/python"
DROP_IN = "/etc/systemd/system/vllm@{}.service.d/labctl-numa.conf"


@pytest.fixture(scope="module")
def cases(host) -> dict[tuple[str, bool], dict]:
    host.run_test("cat > /tmp/labctl-tool-calls.py <<'EOF'\n" + tool_calls_script(ENV_FILE, PUBLIC) + "\nEOF")
    started = time.monotonic()
    out = host.check_output(f"{LITELLM_PYTHON} /tmp/labctl-tool-calls.py")
    found = {(c["case"], c["stream"]): c for c in json.loads(out)}
    _report(tool_calls={"seconds": round(time.monotonic() - started, 1),
                        "status": {f"{k[0]}{'-stream' if k[1] else ''}": c["status"] for k, c in found.items()}})
    return found


def _call(case: dict) -> dict:
    assert case["status"] == 200, case.get("error")
    assert len(case["tool_calls"]) == 1, case
    call = case["tool_calls"][0]
    assert isinstance(call["id"], str) and call["id"], call
    assert call["type"] == "function" and call["function"]["name"] == "set_mode", call
    # The arguments are a JSON string, as OpenAI sends them; the schema pinned their one value.
    assert json.loads(call["function"]["arguments"]) in ({"mode": "on"}, {"mode": "off"}), call
    return call


def test_the_replicas_run_with_the_models_tool_call_parser(host):
    for index in REPLICAS:
        flags = host.file(f"/etc/labctl/vllm/replica-{index}.yaml").content_string
        assert "enable-auto-tool-choice: true" in flags and 'tool-call-parser: "hermes"' in flags, flags


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_tool_choice_auto_is_accepted(cases, stream):
    case = cases[("auto", stream)]
    assert case["status"] == 200, case.get("error")
    assert case["finish_reason"] in ("stop", "length", "tool_calls"), case
    # Text, or calls in the OpenAI shape: the random model decides which.
    assert isinstance(case["content"], str) or case["tool_calls"], case
    for call in case["tool_calls"]:
        assert call["type"] == "function" and call["function"]["name"] == "set_mode", call


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_a_forced_call_comes_back_as_tool_calls(cases, choice, stream):
    case = cases[(choice, stream)]
    _call(case)
    # OpenAI: tool_calls for "required"; a named function may also end with "stop".
    assert case["finish_reason"] in (("tool_calls",) if choice == "required" else ("tool_calls", "stop")), case
    assert case["object"] == ("chat.completion" if not stream else ["chat.completion.chunk"]), case


def test_the_call_and_its_result_go_back_for_the_next_turn(cases):
    case = cases[("result", False)]
    assert case["status"] == 200, case.get("error")
    assert case["role"] == "assistant"


# --- NUMA ----------------------------------------------------------------------------------------


def _cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        low, _sep, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def test_each_replica_runs_on_its_gpus_numa_node(host):
    node0 = host.check_output("cat /sys/devices/system/node/node0/cpulist")
    for index in REPLICAS:
        drop_in = host.file(DROP_IN.format(index))
        assert (drop_in.user, drop_in.group, drop_in.mode) == ("root", "root", 0o644)
        assert f"CPUAffinity={node0}\nNUMAPolicy=bind\nNUMAMask=0\n" in drop_in.content_string, drop_in.content_string
        shown = host.check_output(f"systemctl show vllm@{index} -p NUMAPolicy -p NUMAMask -p CPUAffinity -p DropInPaths")
        assert "NUMAPolicy=bind" in shown.splitlines() and "NUMAMask=0" in shown.splitlines(), shown
        affinity = re.search(r"^CPUAffinity=(.*)$", shown, re.MULTILINE)
        assert affinity, shown
        assert _cpus(affinity.group(1)) == _cpus(node0), shown
        assert DROP_IN.format(index) in shown, shown
        # What the kernel holds every process of the replica to (server, engine core, workers).
        # The unit's own cgroup (systemd's path): the containers see the whole machine's cgroup tree,
        # where another scenario's vllm@<i>.service (other PID namespace: pid 0 here) may stand first.
        group = host.check_output(f"systemctl show -p ControlGroup --value vllm@{index}")
        pids = host.check_output(f"cat $(ls -d /sys/fs/cgroup/unified{group} /sys/fs/cgroup/systemd{group} /sys/fs/cgroup{group} "
                                 "2>/dev/null | head -n 1)/cgroup.procs").split()
        assert pids, index
        for pid in pids:
            allowed = host.check_output(f"sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/{pid}/status")
            assert _cpus(allowed) <= _cpus(node0), (index, pid, allowed)
        main = host.check_output(f"systemctl show -p MainPID --value vllm@{index}")
        policies = {line.split()[1] for line in host.check_output(f"cat /proc/{main}/numa_maps").splitlines()}
        assert "bind:0" in policies and "default" not in policies, policies
        # The CPU build's OpenMP threads stay inside the node.
        omp = host.check_output(f"sed -n 's/^VLLM_CPU_OMP_THREADS_BIND=//p' /etc/labctl/vllm/replica-{index}.env")
        assert _cpus(omp) <= _cpus(node0), omp


@pytest.mark.extended  # two site runs, four replica restarts
def test_a_binding_change_restarts_replicas_one_at_a_time(host):
    """The GPUs' node unknown (a sysfs without it, as on a VM: numa_node -1): the
    drop-ins go, each replica restarts once, one at a time, while requests keep succeeding; then the
    stand-in's sysfs again binds them back."""
    pids = _main_pids(host)
    with _traffic(host, "numa-traffic") as traffic:
        result = _site("-e", "lab_sysfs_root=/nonexistent")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    after = _main_pids(host)
    assert all(after[f"vllm@{i}"] != pids[f"vllm@{i}"] for i in REPLICAS), (pids, after)
    # Unbound: the CPUs any process of the machine may use (PID 1's, systemd's).
    online = host.check_output("sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/1/status")
    for index in REPLICAS:
        assert not host.file(DROP_IN.format(index)).exists
        assert DROP_IN.format(index) not in host.check_output(f"systemctl show vllm@{index} -p DropInPaths")
        main = after[f"vllm@{index}"]
        # No bind policy left (vllm-cpu sets "local" on some of its own mappings either way).
        policies = {line.split()[1] for line in host.check_output(f"cat /proc/{main}/numa_maps").splitlines()}
        assert "default" in policies and not any(p.startswith("bind") for p in policies), policies
        allowed = host.check_output(f"sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/{main}/status")
        assert _cpus(allowed) == _cpus(online), (allowed, online)
    assert traffic["both_down"] == 0 and traffic["failed"] == [], (traffic["both_down"], traffic["failed"][:5])
    assert result.stdout.count("[vllm : Take the replica out of the gateways' rotation | ") == 2
    back = _site()
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-2000:]
    assert all(host.file(DROP_IN.format(i)).exists for i in REPLICAS)
    for index in REPLICAS:
        main = host.check_output(f"systemctl show -p MainPID --value vllm@{index}")
        assert "bind:0" in {line.split()[1] for line in host.check_output(f"cat /proc/{main}/numa_maps").splitlines()}
