#!/usr/bin/env python3
"""make lab-wheels-check (not in make test: gigabytes): the lab's CUDA vLLM wheel set, resolved by
the real bundle builder, installed offline into a network-less container of the target's OS, and
proven there without a GPU: vLLM takes the replicas' configs, and every download its start-up could
make for gpt-oss on Hopper is satisfied from the bundle (offline_paths.py lists them).

1. A profile derived from profiles/lab.yml for Debian 12 (the one supported OS whose Python this
   machine's base image has): no apt part, no Prisma, no model, tiktoken from the litellm wheel.
   Its vLLM set is the lab's as it is when the set's indexes answer (wheels.vllm.ai,
   download.pytorch.org, flashinfer.ai: source `lab`). Where they do not (only PyPI is reachable
   here: source `pypi`), what PyPI has stands in: vLLM's PyPI build for the +cu129 variant (the
   same code, CUDA 13), and FlashInfer's kernel wheels (flashinfer-cubin, flashinfer-jit-cache),
   which PyPI does not carry, are left out; the report names each substitution, and the start-up
   items that need the left-out wheels are reported unproven here, not passed.
   LAB_WHEELS_SOURCE=lab|pypi forces one (default auto). `labctl bundle lock` writes the hash-locked
   sets (resolve-only), then `labctl bundle build` fetches exactly those and signs the bundle.
2. The roles' files for the lab inventory (tests/cuda_wheels/render_replicas.yml): each replica's
   config, and the replicas' environment (vllm.env, tiktoken.env) as the unit reads it.
3. `docker run --network none` of the base image: python3-venv from the test bundle's pool, a venv,
   `pip install --no-index --no-deps --require-hashes -r wheels/sets/vllm.txt`, the bundle's
   tiktoken files where tiktoken.env points, then in_container.py with that environment.
Figures (wheelhouse size, download, install, import times, every start-up download and how it is
satisfied) go to build/reports/lab-wheels.json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "lab-wheels"
BUNDLE = REPO / "build" / "bundles" / "lab-wheels"
TEST_BUNDLE = REPO / "build" / "bundles" / "test"
REPORT = REPO / "build" / "reports" / "lab-wheels.json"
OS = "debian-12"
# Only FlashInfer's own index carries these (kernels.py); nothing on PyPI stands in for them.
NOT_ON_PYPI = ("flashinfer-cubin", "flashinfer-jit-cache")


def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kwargs)


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=15):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (urllib.error.URLError, OSError):
        return False


def choose_source(lab_set: dict[str, Any]) -> tuple[str, dict[str, bool]]:
    indexes = {url: reachable(url.rstrip("/") + "/") for url in lab_set.get("extra_index_urls", [])}
    wanted = os.environ.get("LAB_WHEELS_SOURCE", "auto")
    if wanted not in ("auto", "lab", "pypi"):
        sys.exit(f"LAB_WHEELS_SOURCE={wanted}: expected auto, lab or pypi")
    if wanted == "auto":
        wanted = "lab" if indexes and all(indexes.values()) else "pypi"
    return wanted, indexes


def pypi_set(lab_set: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str | None]]:
    """The lab's vLLM set as far as PyPI has it, and what was substituted (requirement -> stand-in or
    None when left out)."""
    requirements: list[str] = []
    substituted: dict[str, str | None] = {}
    for line in lab_set["requirements"]:
        name, _, version = line.partition("==")
        public, _, local = version.partition("+")
        if name in NOT_ON_PYPI:
            substituted[line] = None
        elif name == "torch" and local:
            substituted[line] = None  # vLLM's PyPI build pins its own torch (the CUDA 13 build)
        elif local:
            requirements.append(f"{name}=={public}")
            substituted[line] = requirements[-1]
        else:
            requirements.append(line)
    return {"requirements": requirements}, substituted


def derived_profile(source: str) -> tuple[Path, dict[str, str | None]]:
    raw = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())
    raw["name"] = "lab-wheels"
    raw["apt"] = {}
    raw.pop("prisma", None)
    raw.pop("models", None)
    raw["tiktoken"] = {"source": "wheel", "wheel": "litellm==1.106.0"}
    substituted: dict[str, str | None] = {}
    if source == "pypi":
        raw["wheels"]["sets"]["vllm"], substituted = pypi_set(raw["wheels"]["sets"]["vllm"])
    raw["locks"] = "locks"  # written below by `labctl bundle lock`, as on a build machine
    for variant in raw.get("os", {}).values():
        if isinstance(variant, dict):
            variant.pop("apt", None)
            variant.pop("prisma", None)
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / "lab-wheels.yml"
    path.write_text("# Generated by tests/cuda_wheels/check.py from profiles/lab.yml; do not edit.\n"
                    + yaml.safe_dump(raw, sort_keys=False))
    return path, substituted


def verdict(items: list[dict[str, Any]], left_out: set[str]) -> tuple[list[str], list[str]]:
    """(problems, unproven): an item fails unless satisfied; one that needs a wheel left out here is
    unproven instead, and must then be found unsatisfied (else the check could not tell)."""
    problems, unproven = [], []
    for item in items:
        missing = sorted(need for need in item["needs"] if need.split("-sm")[0] in left_out)
        if missing:
            if item["satisfied"]:
                problems.append(f"{item['id']}: satisfied without {', '.join(missing)}: the check cannot fail")
            else:
                unproven.append(f"{item['id']} (needs {', '.join(missing)}, not on PyPI)")
        elif not item["satisfied"]:
            why = item["error"] or (f"tried {', '.join(a['host'] for a in item['attempts'])}" if item["attempts"]
                                    else json.dumps(item["evidence"], default=str)[:400])
            problems.append(f"{item['id']} ({item['url']}): {why}")
    return problems, unproven


def main() -> int:
    image = os.environ.get("LABCTL_TEST_IMAGE") or subprocess.run(
        [str(REPO / "scripts" / "build-base-image.sh"), "--print-tag"], capture_output=True, text=True, check=True
    ).stdout.strip()
    lab_set = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())["wheels"]["sets"]["vllm"]
    source, indexes = choose_source(lab_set)
    report: dict[str, Any] = {"os": OS, "image": image, "source": source, "lab_indexes_reachable": indexes}
    profile, substituted = derived_profile(source)
    report["substituted"] = substituted
    left_out = {line.partition("==")[0] for line, stand_in in substituted.items() if stand_in is None}
    started = time.monotonic()
    run(["labctl", "bundle", "lock", "--profile", str(profile), "--os", OS])
    report["lock_s"] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    run(["labctl", "bundle", "build", "--profile", str(profile), "--os", OS, "--out", str(BUNDLE)])
    report["build_s"] = round(time.monotonic() - started, 1)
    manifest = json.loads((BUNDLE / "manifest.json").read_text())
    files = manifest["components"]["wheels"]["files"]
    vllm_set = {p["name"]: p["version"] for p in manifest["components"]["wheels"]["sets"]["vllm"]["packages"]}
    sizes = {f["file"]: f["size"] for f in files}
    report["wheelhouse_bytes"] = sum(sizes.values())
    report["vllm_set_projects"] = len(vllm_set)
    report["vllm_set_bytes"] = sum(size for rel, size in sizes.items()
                                   if Path(rel).name.split("-")[0].lower().replace("_", "-") in vllm_set)
    report["flashinfer_wheels"] = {name: version for name, version in vllm_set.items() if name.startswith("flashinfer")}
    rendered = WORK / "replicas"
    shutil.rmtree(rendered, ignore_errors=True)
    rendered.mkdir(parents=True)
    run(["ansible-playbook", "-i", str(REPO / "inventories" / "lab"), str(REPO / "tests" / "cuda_wheels" / "render_replicas.yml"),
         "-e", f"labctl_render_dir={rendered}"], capture_output=True)
    configs = sorted(p.name for p in rendered.glob("*.yaml"))
    report["replica_configs"] = configs
    # The unit's EnvironmentFile= order (vllm@.service): tiktoken.env, then vllm.env.
    host = configs[0].split("-replica-")[0] if configs else ""
    env_files = [f"{host}-tiktoken.env", f"{host}-vllm.env"]
    tiktoken_base = next((line.split("=", 1)[1] for line in (rendered / env_files[0]).read_text().splitlines()
                          if line.startswith("TIKTOKEN_ENCODINGS_BASE=")), None) if configs else None
    model = TEST_BUNDLE / "models" / "tiny-llama" / "r1"
    # python3-venv as a lab host gets it: the test bundle's signed apt repository as the only source.
    script = f"""set -e
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
printf 'Types: deb\\nURIs: file:/t/apt\\nSuites: ./\\nSigned-By: /t/keys/bundle.gpg\\n' > /etc/apt/sources.list.d/bundle.sources
apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y python3-venv >/dev/null
python3 -m venv /opt/venv
start=$(date +%s.%N)
/opt/venv/bin/pip install --quiet --no-index --find-links /b/wheels --no-deps --require-hashes -r /b/wheels/sets/vllm.txt
end=$(date +%s.%N)
echo "INSTALL_S $(echo "$end - $start" | bc 2>/dev/null || python3 -c "print($end - $start)")"
du -sb /opt/venv | cut -f1 | sed 's/^/VENV_BYTES /'
/opt/venv/bin/python /check/in_container.py {" ".join("--env /r/" + f for f in env_files)} --model /m \\
  {" ".join("/r/" + c for c in configs)}
"""
    docker = ["docker", "run", "--rm", "--network", "none",
              "-v", f"{BUNDLE}:/b:ro", "-v", f"{TEST_BUNDLE}:/t:ro", "-v", f"{rendered}:/r:ro", "-v", f"{model}:/m:ro",
              "-v", f"{BUNDLE / 'tiktoken'}:{tiktoken_base}:ro",
              "-v", f"{REPO / 'tests' / 'cuda_wheels'}:/check:ro", image, "bash", "-c", script]
    started = time.monotonic()
    proc = subprocess.run(docker, capture_output=True, text=True, check=False)
    report["container_s"] = round(time.monotonic() - started, 1)
    for line in proc.stdout.splitlines():
        if line.startswith("INSTALL_S "):
            report["install_s"] = round(float(line.split()[1]), 1)
        elif line.startswith("VENV_BYTES "):
            report["venv_bytes"] = int(line.split()[1])
        elif line.startswith("{"):
            report["in_container"] = json.loads(line)
    problems: list[str] = []
    unproven: list[str] = []
    result = report.get("in_container")
    if proc.returncode != 0 or not isinstance(result, dict):
        print(proc.stdout[-3000:], proc.stderr[-5000:], sep="\n", file=sys.stderr)
        problems.append("the CUDA wheel set did not install or prove itself offline")
    else:
        if not str(result.get("torch_cuda") or ""):
            problems.append(f"torch {result.get('torch')} is not a CUDA build")
        if len(result.get("replicas", {})) != len(configs) or not configs:
            problems.append("not every replica config parsed")
        if result.get("unknown_flag_refused") is not True:
            problems.append("vLLM's parser took a flag it does not know: the check cannot fail")
        offline = result["offline"]
        found, unproven = verdict(offline["items"], left_out)
        problems += found
        report["offline_paths"] = {item["id"]: ("satisfied" if item["satisfied"] else "NOT satisfied") + f": {item['url']}"
                                   for item in offline["items"]}
    report["unproven_here"] = unproven
    report["problems"] = problems
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "in_container"}, indent=2, default=str))
    for problem in problems:
        print("FAIL:", problem, file=sys.stderr)
    for item in unproven:
        print("NOT PROVEN HERE:", item, "- run with the lab's indexes reachable (LAB_WHEELS_SOURCE=lab)")
    print("FAIL" if problems else ("PASS (partial: source pypi)" if unproven else "PASS"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
