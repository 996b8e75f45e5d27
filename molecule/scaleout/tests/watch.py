#!/usr/bin/python3
"""What the gateway host sees of the replicas, twice a second (copied into the gateway host):
each replica's /health (up, or down: refused, an error or no answer within 1 s) and the drain
markers in the gateway's drain directory, until the stop file appears.
usage: watch.py DRAIN_DIR STOP_FILE OUT_FILE URL...
"""
import json
import os
import ssl
import sys
import time
import urllib.request

drain_dir, stop_file, out_file, *urls = sys.argv[1:]
samples = []
CTX = ssl.create_default_context(cafile="/etc/labctl/tls/ca.crt")  # the replicas' HTTPS: the lab CA (roles/tls)


def up(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=1, context=CTX) as response:
            return response.status == 200
    except OSError:
        return False


while not os.path.exists(stop_file):
    started = time.time()
    markers = sorted(os.listdir(drain_dir)) if os.path.isdir(drain_dir) else []
    samples.append({"t": round(started, 2), "up": {url: up(url) for url in urls}, "markers": markers})
    time.sleep(max(0.0, 0.5 - (time.time() - started)))
with open(out_file + ".tmp", "w") as out:
    json.dump(samples, out)
os.rename(out_file + ".tmp", out_file)
