"""`labctl plan`, the topology the plays publish and the replica configs the vllm role renders agree,
for every inventory in the repository and every GPU shape of tests/fixtures/nvidia-smi (captured
from real machines): the same replicas, on the same GPUs, at the same ports.

Preflight reads its replica count, ports and problems from the same topology
(roles/preflight/tasks/gpus.yml, ports.yml), and the deployed units are checked against it in the
stack scenario (molecule/stack/tests/test_stack.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from labctl.cli import app

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia-smi"
INVENTORIES = ["inventories/lab", "inventories/sandbox", "bench/inventory"]
SHAPES = ["h200x2.json", "h100x8-hgx.json", "a100-mig.json"]


def _render(inventory: str, gpus: int, out: Path) -> dict[str, Any]:
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", inventory, "tests/topology/render.yml",
           "-e", json.dumps({"lab_expected_gpu_count": gpus, "labctl_render_dir": str(out)})]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    topology: dict[str, Any] = json.loads((out / "topology.json").read_text())
    return topology


@pytest.mark.parametrize("inventory", INVENTORIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_plan_topology_and_rendered_replicas_agree(inventory: str, shape: str, tmp_path: Path) -> None:
    fixture = FIXTURES / shape
    gpus = len(json.loads(fixture.read_text())["gpus"])
    # The layout does not depend on the model; the sandbox's tiny model has no memory profile.
    result = CliRunner().invoke(app, ["plan", "-i", str(REPO / inventory), "--facts", str(fixture), "--model", "gpt-oss-120b", "--json"])
    assert result.exit_code == 0, result.output
    plan = {h["host"]: [(r["index"], ",".join(map(str, r["gpus"]))) for r in h["replicas"]] for h in json.loads(result.stdout)["hosts"]}

    topology = _render(inventory, gpus, tmp_path)
    assert topology["problems"] == []
    by_host: dict[str, list[dict[str, Any]]] = {}
    for r in topology["replicas"]:
        by_host.setdefault(r["host"], []).append(r)
    assert {h: [(r["index"], r["gpus"]) for r in rs] for h, rs in by_host.items()} == plan
    assert all(len(rs) > 0 for rs in by_host.values())

    rendered = sorted(tmp_path.glob("*-replica-*.yaml"))
    assert len(rendered) == len(topology["replicas"])
    for r in topology["replicas"]:
        flags = yaml.safe_load((tmp_path / f"{r['host']}-replica-{r['index']}.yaml").read_text())
        assert (flags["port"], flags["host"], flags["tensor-parallel-size"], flags["max-num-seqs"]) == (
            r["port"], r["address"], r["tensor_parallel_size"], r["max_num_seqs"])
        assert flags["served-model-name"] == [r["served_model_name"], r["public_name"]]
        env = (tmp_path / f"{r['host']}-replica-{r['index']}.env").read_text()
        assert f"CUDA_VISIBLE_DEVICES={r['gpus']}\n" in env or "VLLM_CPU_OMP_THREADS_BIND=" in env
