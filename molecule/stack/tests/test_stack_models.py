"""Several models side by side (Issue 32) on the running stack: an embedding model (the tiny
architecture with other weights, vLLM's pooling runner) is added beside the chat model through
lab_models, used through the gateway with the openai SDK, and removed again.

One test, in order, since each step starts from the last: converting the one-model lab to lab_models
and adding the embedding model restarts no chat replica (their PIDs stay) and not the gateway
(reloaded: no request of the chat traffic fails), and the run after changes nothing; the gateway
serves chat.completions and embeddings; a key limited to the embedding model gets 403 on the chat
model, and moved to the chat model keeps its key; removing a model a key still names is refused
before anything changes, and `labctl keys` still works then; labctl smoke and rolling-restart
--model touch that model's replicas only; Prometheus labels every replica with its model and a
dashboard query answers per model; removing the model again stops its replica and leaves the chat
replicas and the gateway running, and no down alert fires for it (Prometheus forgets it first)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import yaml
from test_stack import APP_KEYS_MADE, LABCTL_STATE, REPO, _py, _report, _site, _traffic  # same directory

# The scenario's inventory links molecule/stack/group_vars/: lab_models is set for the test's runs (site.yml
# and labctl keys alike) by a file there, removed at the end whatever happens.
MODELS_FILE = REPO / "molecule" / "stack" / "group_vars" / "all" / "90-test-models.yml"
LITELLM_PYTHON = "/opt/labctl/litellm/current/bin/python"
PROM = "http://127.0.0.1:9090"
CHAT, EMBED = "tiny-llama", "tiny-embed"
LAB_MODELS = [
    {"id": 0, "name": CHAT, "revision": "r1", "classes": ["interactive", "batch"]},
    {"id": 1, "name": EMBED, "revision": "r1", "kind": "embed", "gpus": 1, "gpu_memory_utilization": 0.15},
]

# Inside the target, with the openai SDK of the gateway's own venv: one chat completion and one
# embedding of two texts with the given key ("master": the master key, read there).
_SDK = r"""
import json, sys, httpx, openai
key = sys.argv[1]
if key == "master":
    key = next(l.split("=", 1)[1].strip() for l in open("/etc/labctl/litellm/litellm.env") if l.startswith("LITELLM_MASTER_KEY="))
client = openai.OpenAI(base_url="https://127.0.0.1:4000/v1", api_key=key, max_retries=0,
                       http_client=httpx.Client(verify="/etc/labctl/tls/ca.crt", timeout=120))
out = {}
try:
    chat = client.chat.completions.create(model=sys.argv[2], messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    out["chat"] = {"status": 200, "model": chat.model, "text": chat.choices[0].message.content is not None}
except openai.APIStatusError as e:
    out["chat"] = {"status": e.status_code, "error": str(e)[:300]}
try:
    emb = client.embeddings.create(model=sys.argv[3], input=["hello", "the lab's documents"])
    out["embed"] = {"status": 200, "count": len(emb.data), "dims": [len(d.embedding) for d in emb.data]}
except openai.APIStatusError as e:
    out["embed"] = {"status": e.status_code, "error": str(e)[:300]}
print(json.dumps(out))
"""


def _sdk(host, key: str, chat: str = CHAT, embed: str = EMBED) -> dict:
    container = host.check_output("hostname")
    run = subprocess.run(["docker", "exec", "-i", container, LITELLM_PYTHON, "-c", _SDK, key, chat, embed],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _pids(host) -> dict[str, str]:
    return {unit: host.check_output(f"systemctl show -p MainPID --value {unit}") for unit in ("vllm@0", "vllm@1")}


def _changed(result: subprocess.CompletedProcess[str]) -> list[int]:
    return [int(n) for n in re.findall(r"changed=(\d+)", result.stdout.split("PLAY RECAP")[-1])]


def _prom(host, expr: str) -> list[dict]:
    code = ("import json, urllib.parse, urllib.request; "
            f"print(urllib.request.urlopen({PROM!r} + '/api/v1/query?' + urllib.parse.urlencode({{'query': {expr!r}}}), "
            "timeout=30).read().decode())")
    return json.loads(_py(host, code))["data"]["result"]


def _labctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LABCTL_STATE_DIR=str(LABCTL_STATE))
    return subprocess.run(["labctl", *args, "-i", os.environ["MOLECULE_INVENTORY_FILE"]], capture_output=True, text=True,
                          timeout=1200, check=False, cwd=REPO, env=env)


def _keys(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LABCTL_STATE_DIR=str(LABCTL_STATE))
    return subprocess.run(["nice", "-n", "-10", "labctl", "keys", *args, "-i", os.environ["MOLECULE_INVENTORY_FILE"]],
                          capture_output=True, text=True, timeout=600, check=False, cwd=REPO, env=env)


def _dashboard_expr(title: str) -> str:
    dashboard = json.loads((REPO / "roles" / "grafana" / "files" / "dashboards" / "labctl-vllm.json").read_text())
    panels = [p for p in dashboard["panels"] if p.get("title") == title]
    assert panels, title
    return str(panels[0]["targets"][0]["expr"]).replace("$model", ".*").replace("$host", ".*").replace("$replica", ".*")


def test_an_embedding_model_beside_the_chat_model_added_used_and_removed(host):
    # The replicas run with the flags the earlier tests left them (test_stack.py's flag change): the same
    # here, so that only lab_models differs from what runs.
    batched = yaml.safe_load(host.file("/etc/labctl/vllm/replica-0.yaml").content_string)["max-num-batched-tokens"]
    flags = ("-e", f"vllm_max_num_batched_tokens={batched}")
    before = _pids(host)
    MODELS_FILE.write_text("# Written by molecule/stack/tests/test_stack_models.py for its runs; removed after.\n"
                           + yaml.safe_dump({"lab_models": LAB_MODELS}, sort_keys=False))
    try:
        # Under the chat model's traffic, no request fails while the model is added: the chat replicas keep
        # running and the gateway is reloaded (its workers replaced one at a time), not restarted.
        gateway = host.check_output("systemctl show -p MainPID --value litellm.service")
        with _traffic(host, "models-add") as traffic:
            added = _site(*flags)
        _report(models_add_traffic={"requests_ok": traffic["ok"], "streamed_ok": traffic["ok_streamed"],
                                    "requests_failed": len(traffic["failed"]), "polls_with_no_replica_up": traffic["both_down"]})
        assert added.returncode == 0, added.stdout[-4000:] + added.stderr[-2000:]
        assert "RUNNING HANDLER [litellm : Reload litellm (its workers replaced one at a time)]" in added.stdout
        assert host.check_output("systemctl show -p MainPID --value litellm.service") == gateway
        assert traffic["failed"] == [] and traffic["both_down"] == 0 and traffic["ok"] > 20, traffic["failed"][:5]
        # No chat replica restarted: converting to lab_models and adding a model leave their files as they were.
        assert _pids(host) == before
        assert host.service("vllm@100").is_running and host.service("vllm@100").is_enabled
        flags100 = yaml.safe_load(host.file("/etc/labctl/vllm/replica-100.yaml").content_string)
        assert (flags100["runner"], flags100["convert"], flags100["port"]) == ("pooling", "embed", 8100)
        again = _site(*flags)
        assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
        assert _changed(again) and set(_changed(again)) == {0}, again.stdout.split("PLAY RECAP")[-1]

        # Both models through the gateway, with the openai SDK.
        master = _sdk(host, "master")
        assert master["chat"]["status"] == 200 and master["chat"]["text"], master
        assert master["embed"] == {"status": 200, "count": 2, "dims": [128, 128]}, master

        # A key limited to the embedding model: embeddings yes, the chat model 403.
        made = _keys("add", "retrieval", "--class", "interactive", "--model", EMBED)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        key = made.stdout.strip().splitlines()[0]
        APP_KEYS_MADE.parent.mkdir(parents=True, exist_ok=True)
        with APP_KEYS_MADE.open("a") as handle:  # test_stack_zz_final looks for it in every log
            handle.write(key + "\n")
        limited = _sdk(host, key)
        assert limited["embed"]["status"] == 200 and limited["chat"]["status"] == 403, limited
        # Moved to the chat model (labctl keys models): the same key, the other model.
        moved = _keys("models", "retrieval", "--model", CHAT)
        assert moved.returncode == 0, moved.stdout[-2000:] + moved.stderr[-2000:]
        limited = _sdk(host, key)
        assert limited["chat"]["status"] == 200 and limited["embed"]["status"] == 403, limited
        # Back on the embedding model: removing the model now would leave it limited to nothing, which the
        # topology refuses before anything changes, naming the key; `labctl keys` still works then (the way out).
        assert _keys("models", "retrieval", "--model", EMBED).returncode == 0
        MODELS_FILE.write_text(yaml.safe_dump({"lab_models": LAB_MODELS[:1]}, sort_keys=False))
        listed = _keys("list", "--json")
        assert listed.returncode == 0 and "retrieval" in listed.stdout, listed.stdout[-2000:] + listed.stderr[-2000:]
        refused = _site(*flags)
        assert refused.returncode != 0
        assert "key retrieval is limited to tiny-embed, which lab_models does not serve" in refused.stdout + refused.stderr
        assert _pids(host) == before and host.service("vllm@100").is_running
        MODELS_FILE.write_text(yaml.safe_dump({"lab_models": LAB_MODELS}, sort_keys=False))
        assert _keys("revoke", "retrieval").returncode == 0

        # labctl smoke and rolling-restart take a model: the embedding replica is asked for an embedding,
        # and restarted alone (the chat replicas keep their PIDs).
        smoke = _labctl("smoke", "--model", EMBED, "--json")
        assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-2000:]
        checks = json.loads(smoke.stdout.strip().splitlines()[-1])["checks"]
        seen = {(c["check"], str(c["ok"]).lower()) for c in checks if c["check"] != "prometheus"}
        assert seen == {("replica vllm@100", "true"), ("gateway", "true")}, checks
        # A model the lab does not serve is refused, naming those it does (first: the run record of the
        # successful restart below is then the command's last, which ProvisioningRunFailed reads).
        unknown = _labctl("rolling-restart", "--model", "nope", "--json")
        assert unknown.returncode != 0
        assert "--model nope: no such model here (the lab serves: tiny-embed, tiny-llama)" in unknown.stdout + unknown.stderr
        embed_pid = host.check_output("systemctl show -p MainPID --value vllm@100")
        restarted = _labctl("rolling-restart", "--model", EMBED, "--json")
        assert restarted.returncode == 0, restarted.stdout[-3000:] + restarted.stderr[-2000:]
        assert host.check_output("systemctl show -p MainPID --value vllm@100") != embed_pid
        assert _pids(host) == before

        # Prometheus: every replica target carries its model; the dashboard's per-model query answers for both.
        deadline = time.time() + 90
        while True:
            up = {r["metric"].get("model"): r["value"][1] for r in _prom(host, 'up{job="vllm", replica="100"}')}
            if up.get(EMBED) == "1" or time.time() > deadline:
                break
            time.sleep(5)
        assert up == {EMBED: "1"}
        labelled = {(r["metric"]["replica"], r["metric"].get("model")) for r in _prom(host, 'up{job="vllm"}')}
        assert labelled == {("0", CHAT), ("1", CHAT), ("100", EMBED)}
        per_model = {r["metric"]["model"]: float(r["value"][1]) for r in _prom(host, _dashboard_expr("Replicas up by model"))}
        assert per_model == {CHAT: 2.0, EMBED: 1.0}
        assert _prom(host, f'vllm:num_requests_running{{job="vllm", model="{EMBED}"}}')
    finally:
        # Removed again (also when a step above failed: the later tests find the one-model lab). A key
        # still limited to the model would stop the run (the topology's problem, before anything changes).
        _keys("revoke", "retrieval")  # refused (exit 2) when it was never made or is revoked already
        MODELS_FILE.unlink(missing_ok=True)
        removal_started = time.time()
        removed = _site(*flags)

    # Its replica stops, the chat replicas keep running, the gateway (reloaded, not restarted) no longer serves it.
    assert removed.returncode == 0, removed.stdout[-4000:] + removed.stderr[-2000:]
    assert host.check_output("systemctl show -p MainPID --value litellm.service") == gateway
    assert _pids(host) == before
    assert not host.service("vllm@100").is_running and not host.service("vllm@100").is_enabled
    gone = _sdk(host, "master")
    assert gone["chat"]["status"] == 200 and gone["embed"]["status"] in (400, 404), gone
    # Prometheus stopped scraping the replica before it stopped (playbooks/serving.yml, the prometheus role's
    # forget_targets): no down alert, pending or firing, for it or its model at any rule evaluation of the
    # removal run (ALERTS holds a sample per evaluation of an active alert). Before, the replica stopped in
    # the serving layer and was scraped as down until the monitoring layer reloaded Prometheus: minutes on a
    # slow machine, and both alerts were still firing when test_stack_monitoring's rules test ran.
    window = int(time.time() - removal_started)
    alerts = _prom(host, f'max_over_time(ALERTS{{alertname=~"VllmReplicaDown|VllmModelDown"}}[{window}s])')
    removed_alerts = [a["metric"] for a in alerts if a["metric"].get("replica") == "100" or a["metric"].get("model") == EMBED]
    _report(models_remove={"seconds": window, "down_alerts": removed_alerts})
    assert removed_alerts == [], removed_alerts
    assert _prom(host, 'up{job="vllm", replica="100"} == 0') == []
    scraped = json.loads(_py(host, f"import urllib.request; print(urllib.request.urlopen({PROM + '/api/v1/targets'!r}, "
                                   "timeout=30).read().decode())"))["data"]["activeTargets"]
    assert sorted(t["labels"].get("replica", "") for t in scraped if t["labels"]["job"] == "vllm") == ["0", "1"]


def test_the_models_file_is_gone():
    assert not Path(MODELS_FILE).exists()
