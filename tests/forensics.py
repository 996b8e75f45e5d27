"""What an operator would look at when a molecule verify step fails, saved before destroy.

`molecule/conftest.py` calls :func:`collect` at the end of a failed verify (pytest's terminal
summary, which runs before molecule's cleanup and destroy): for every host of the scenario's
inventory, through `docker exec`, the failed units, the state of the units the site manages, the
journal of every failed or inactive one, addresses and listeners, load and memory, and
Prometheus' targets where Prometheus runs. Files go to `build/forensics/<scenario>/<host>/`;
:func:`summary` gives the first lines for the CI log.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

# The units the site writes or starts (glob patterns for systemctl).
SITE_UNITS = [
    "nvidia-persistenced.service", "nvidia-fabricmanager.service", "vllm@*.service", "litellm.service",
    "redis-server.service", "postgresql@*.service", "prometheus.service", "prometheus-node-exporter.service",
    "grafana-server.service", "labctl-*.service", "labctl-*.timer",
]
JOURNAL_LINES = 300
PROMETHEUS_TARGETS = r"""
import json, urllib.request
try:
    data = json.load(urllib.request.urlopen("http://127.0.0.1:9090/api/v1/targets?state=active", timeout=10))
except OSError as e:
    print("no Prometheus answers on 127.0.0.1:9090 here:", e)
else:
    for t in data["data"]["activeTargets"]:
        print(t["labels"].get("job"), t["scrapeUrl"], t["health"], t.get("lastError", ""))
"""

Runner = Callable[[list[str]], tuple[int, str]]


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 1, f"{' '.join(argv[:4])}...: {exc}"
    return done.returncode, done.stdout + done.stderr


def inventory_hosts(inventory_file: str | Path) -> list[str]:
    """Every host named in a molecule inventory (YAML), in order, without duplicates."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "hosts" and isinstance(value, dict):
                    found.extend(h for h in value if h not in found)
                else:
                    walk(value)

    walk(yaml.safe_load(Path(inventory_file).read_text()))
    return found


def collect(hosts: Iterable[str], out_dir: Path, run: Runner = _run) -> dict[str, dict[str, Any]]:
    """Save each host's state under out_dir/<host>/; return what summary() prints."""
    result: dict[str, dict[str, Any]] = {}
    for host in hosts:
        where = out_dir / host
        where.mkdir(parents=True, exist_ok=True)

        def sh(name: str, command: str, host: str = host, where: Path = where) -> str:
            rc, text = run(["docker", "exec", host, "sh", "-c", command])
            (where / f"{name}.txt").write_text(text if rc == 0 else f"(exit {rc})\n{text}")
            return text if rc == 0 else ""

        reached = run(["docker", "exec", host, "true"])[0] == 0
        failed = sh("systemctl-failed", "systemctl --failed --no-legend --plain --no-pager")
        units = sh("site-units", "systemctl list-units --all --no-legend --plain --no-pager " + " ".join(
            f"'{u}'" for u in SITE_UNITS))
        sh("addresses", "ip -o addr show; echo; ss -Hltnp")
        sh("load", "uptime; free -m; df -h / /var/lib 2>/dev/null")
        rc, targets = run(["docker", "exec", host, "python3", "-c", PROMETHEUS_TARGETS])
        (where / "prometheus-targets.txt").write_text(targets)
        # The affected units: failed, or a site service that is not active (the oneshot services
        # of labctl's timers are inactive between runs).
        rows = [line.split() for line in units.splitlines() if len(line.split()) >= 3]
        affected = sorted({line.split()[0] for line in failed.splitlines() if line.strip() and "." in line.split()[0]}
                          | {row[0] for row in rows if row[2] != "active" and row[1] != "not-found"
                             and not (row[0].startswith("labctl-") and row[2] == "inactive")})
        for unit in affected:
            sh(f"journal-{unit}", f"journalctl -b --no-pager -n {JOURNAL_LINES} -u '{unit}'")
        result[host] = {"reached": reached, "failed": [ln for ln in failed.splitlines() if ln.strip()], "affected": affected,
                        "targets_down": [ln for ln in targets.splitlines() if " down " in ln] if rc == 0 else []}
    (out_dir / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def summary(result: dict[str, dict[str, Any]], out_dir: Path, lines: int = 40) -> list[str]:
    """The first lines for the CI log: where the files are, then per host what failed."""
    text = [(f"forensics of the failed verify saved under {out_dir} (per host: systemctl-failed, site-units, "
             "journal-<unit>, addresses, load, prometheus-targets)")]
    for host, found in result.items():
        if not found["reached"]:
            text.append(f"{host}: not reachable through docker exec (stopped or removed?)")
            continue
        text.append(f"{host}: failed units: {', '.join(ln.split()[0] for ln in found['failed']) or 'none'}; "
                    f"not active: {', '.join(found['affected']) or 'none'}")
        text += [f"  target down: {ln}" for ln in found["targets_down"]]
        for unit in found["affected"][:3]:
            journal = out_dir / host / f"journal-{unit}.txt"
            if journal.exists():
                text.append(f"  last lines of {unit}:")
                text += ["    " + ln[:200] for ln in journal.read_text().splitlines()[-5:]]
    return text[:lines]
