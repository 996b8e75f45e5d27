#!/usr/bin/python3
"""Steady traffic through the gateway while something else happens (copied into the target).

Sends one chat completion after another with the master key until the stop file appears, and
polls both replicas' /health every half second. Writes a JSON summary: request outcomes, and
the moments when no replica answered /health.
usage: traffic.py LITELLM_ENV_FILE MODEL STOP_FILE OUT_FILE REPLICA_URL...
"""
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

key_file, model, stop_file, out_file, *replicas = sys.argv[1:]
key = next(line.split("=", 1)[1].strip() for line in open(key_file) if line.startswith("LITELLM_MASTER_KEY="))
results = {"ok": 0, "failed": [], "health": [], "both_down": 0}


def send():
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    while not os.path.exists(stop_file):
        request = urllib.request.Request(
            "http://127.0.0.1:4000/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()
                results["ok"] += 1
        except urllib.error.HTTPError as exc:
            results["failed"].append(f"{exc.code} {exc.read()[:200]!r}")
        except OSError as exc:
            results["failed"].append(str(exc))
        time.sleep(0.5)


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
with open(out_file, "w") as handle:
    json.dump(results, handle)
