"""The gateway's priority admission through the real LiteLLM (roles/litellm/README.md, "Admission
control"): a batch flood far beyond the replicas' slots, then interactive requests and batch
latecomers sent together. The interactive ones must be admitted before the queued flood and the
latecomers; nothing fails. Each uvicorn worker has its own gate and the kernel spreads connections
unevenly over the workers, so six of each are sent and their medians compared."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
REPORT = REPO / "build" / "reports" / "stack.json"
ENV_FILE = "/etc/labctl/litellm/litellm.env"
PUBLIC = "tiny-llama"
FLOOD = 240  # more than LiteLLM's own first-come admission held before the gate (2 workers x 80)
LATE = 6  # interactive requests and batch latecomers each
FLOOD_TOKENS = 480  # the tiny model: ~0.1 s for 48 tokens alone; the flood must outlast the test (max_model_len 512)

SCRIPT = """
import json, ssl, sys, threading, time, urllib.error, urllib.request
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")  # the lab CA (roles/tls)
env_file, public, flood, flood_tokens, LATE = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
key = next(l.split("=", 1)[1].strip() for l in open(env_file) if l.startswith("LITELLM_MASTER_KEY="))
results = {}

def chat(tag, model, max_tokens):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "count " + tag}],
                       "max_tokens": max_tokens}).encode()
    req = urllib.request.Request("https://127.0.0.1:4000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    start = time.time()
    try:
        with urllib.request.urlopen(req, timeout=600, context=CTX) as r:
            r.read(); code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except OSError as e:
        code = repr(e)
    results[tag] = {"code": code, "start": start, "seconds": time.time() - start}

for i in range(4):  # both workers warm (a worker's first request is slow), then the baseline
    chat("warm-%d" % i, public, 8)
chat("idle-interactive", public, 8)
threads = [threading.Thread(target=chat, args=("flood-%d" % i, public + "-batch", flood_tokens)) for i in range(flood)]
for t in threads:
    t.start()
time.sleep(3)  # the flood is admitted up to the gate's slots; the rest waits at the gate
late = []
for i in range(LATE):  # interleaved: each worker gets some of both (the kernel spreads connections)
    late.append(threading.Thread(target=chat, args=("interactive-%d" % i, public, 8)))
    late.append(threading.Thread(target=chat, args=("batch-latecomer-%d" % i, public + "-batch", 8)))
for t in late:
    t.start()
    time.sleep(0.05)
for t in threads + late:
    t.join()
print(json.dumps(results))
"""


def test_a_batch_flood_does_not_hold_back_an_interactive_request(host):
    host.run_test("cat > /tmp/admission_flood.py <<'EOF'\n" + SCRIPT + "\nEOF")
    out = host.check_output(f"python3 /tmp/admission_flood.py {ENV_FILE} {PUBLIC} {FLOOD} {FLOOD_TOKENS} {LATE}")
    results = json.loads(out)
    failed = {tag: r["code"] for tag, r in results.items() if r["code"] != 200}
    interactive = statistics.median(r["seconds"] for tag, r in results.items() if tag.startswith("interactive-"))
    slowest = max(r["seconds"] for tag, r in results.items() if tag.startswith("interactive-"))
    latecomer = statistics.median(r["seconds"] for tag, r in results.items() if tag.startswith("batch-latecomer-"))
    flood_end = max(r["start"] + r["seconds"] for tag, r in results.items() if tag.startswith("flood-"))
    flood_s = flood_end - min(r["start"] for tag, r in results.items() if tag.startswith("flood-"))
    data = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    data["admission_flood"] = {
        "flood_requests": FLOOD, "flood_s": round(flood_s, 1), "idle_interactive_s": round(results["idle-interactive"]["seconds"], 2),
        "interactive_median_s": round(interactive, 2), "interactive_max_s": round(slowest, 2),
        "batch_latecomer_median_s": round(latecomer, 2), "failed": len(failed)}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(data, indent=2) + "\n")
    assert failed == {}, dict(list(failed.items())[:5])
    # The interactive request is admitted at the next free slot, ahead of the whole queued flood;
    # the batch request sent with it waits behind that flood (first come, first served in its class).
    # First come, first served would give both the same wait (ratio ~1). With the gpu scenario's DKMS
    # builds on the same two cores (make test runs two jobs at a time) CI measured 4.4 s against 14.6 s
    # (0.30); alone here 1.2 s against 8.2 s (0.14).
    assert interactive <= latecomer / 2, (interactive, latecomer)
    assert slowest < latecomer, (slowest, latecomer)
    assert slowest <= 0.5 * flood_s, (slowest, flood_s)  # first come, first served: about the whole flood
