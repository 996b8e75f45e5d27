#!/usr/bin/python3
"""Steady traffic through the gateway while a GPU host goes away (copied into the gateway host).

SENDERS threads each send one chat completion after another with the master key until the stop
file appears; while STOP_FILE.slow exists, each waits 5 s between requests instead of 0.2 s. Every
request is recorded with its start and end time and its outcome, so the test can tell the requests
that were in flight when the host went down from those sent after.
usage: traffic.py LITELLM_ENV_FILE MODEL STOP_FILE OUT_FILE SENDERS
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

key_file, model, stop_file, out_file, senders = sys.argv[1:]
with open(key_file) as env:
    key = next(line.split("=", 1)[1].strip() for line in env if line.startswith("LITELLM_MASTER_KEY="))
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")  # the lab CA (roles/tls)
requests: list[dict[str, Any]] = []
lock = threading.Lock()


def send(sender):
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    while not os.path.exists(stop_file):
        request = urllib.request.Request(
            "https://127.0.0.1:4000/v1/chat/completions", data=body,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )
        start = time.time()
        try:
            with urllib.request.urlopen(request, timeout=300, context=CTX) as response:
                response.read()
                outcome = "ok"
        except urllib.error.HTTPError as exc:
            outcome = f"{exc.code} {exc.read()[:300]!r}"
        except OSError as exc:
            outcome = str(exc)
        with lock:
            requests.append({"sender": sender, "start": round(start, 2), "end": round(time.time(), 2), "outcome": outcome})
        time.sleep(5 if os.path.exists(stop_file + ".slow") else 0.2)


threads = [threading.Thread(target=send, args=(n,)) for n in range(int(senders))]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with open(out_file + ".tmp", "w") as out:
    json.dump(requests, out)
os.rename(out_file + ".tmp", out_file)
