"""`labctl gateway-config`: the litellm role's own config.yaml for an inventory, secrets masked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from labctl.cli import app
from labctl.gateway_config import MASK, mask_secrets

REPO = Path(__file__).resolve().parents[2]
BENCH_INVENTORY = REPO / "bench" / "inventory"


@pytest.fixture(scope="module")
def rendered() -> str:
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(BENCH_INVENTORY)])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_renders_the_roles_config_for_the_inventorys_replicas(rendered: str) -> None:
    config = yaml.safe_load(rendered)
    assert rendered.startswith("#\n# Ansible managed")
    deployments = config["model_list"]
    # Two classes over the bench inventory's two replicas (32 slots each, ports 18100 and 18101).
    assert sorted({d["model_name"] for d in deployments}) == ["gpt-oss-120b", "gpt-oss-120b-batch"]
    assert sorted({d["litellm_params"]["api_base"] for d in deployments}) == [
        "http://127.0.0.1:18100/v1", "http://127.0.0.1:18101/v1"]
    assert {d["litellm_params"]["extra_body"]["priority"] for d in deployments} == {0, 10}
    # The replicas' key is generated and referenced, never inlined (litellm.env holds it).
    assert {d["litellm_params"]["api_key"] for d in deployments} == {"os.environ/LABCTL_VLLM_API_KEY"}
    defaults = yaml.safe_load((REPO / "roles" / "litellm" / "defaults" / "main.yml").read_text())
    bench_vars = yaml.safe_load((BENCH_INVENTORY / "group_vars" / "all" / "site.yml").read_text())
    workers = bench_vars.get("litellm_num_workers", defaults["litellm_num_workers"])
    slots = math.ceil(2 * 32 * defaults["litellm_admission_slots_factor"] / workers)  # one gateway host
    # LiteLLM's first-come queue only beyond the priority gate's slots and whole queue.
    assert config["general_settings"]["max_in_flight_requests_per_worker"] == (
        slots + defaults["litellm_max_queued_requests_per_worker"])
    assert f"admits {slots} per worker" in rendered
    assert config["litellm_settings"]["callbacks"][-1] == "labctl_admission.admission"
    # No key's hash as a label (LiteLLM labels refused requests with it), set before the callbacks start.
    settings = list(config["litellm_settings"])
    assert config["litellm_settings"]["prometheus_exclude_labels"] == ["hashed_api_key"]
    assert settings.index("prometheus_exclude_labels") < settings.index("callbacks")
    assert config["router_settings"]["cooldown_time"] == defaults["litellm_cooldown_time"]
    # The bench inventory has no database; the secrets stay references to litellm.env.
    assert "database_url" not in config["general_settings"]
    assert config["general_settings"]["master_key"] == "os.environ/LITELLM_MASTER_KEY"


def test_literal_secrets_are_masked_unless_asked() -> None:
    text = ("general_settings:\n  master_key: sk-real-key\n  database_url: postgresql://u:pw@h/db\n"
            "router_settings:\n  redis_password: s3cret\n  redis_host: os.environ/REDIS_HOST\n"
            "model_list:\n  - litellm_params:\n      api_key: \"none\"\n")
    masked = mask_secrets(text)
    assert "sk-real-key" not in masked and "pw@" not in masked and "s3cret" not in masked
    assert masked.count(MASK) == 3
    assert 'api_key: "none"' in masked and "redis_host: os.environ/REDIS_HOST" in masked
    assert mask_secrets("master_key: os.environ/LITELLM_MASTER_KEY\n") == "master_key: os.environ/LITELLM_MASTER_KEY\n"


def test_a_bad_inventory_path_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert "no such file or directory" in result.output


def test_an_inventory_without_gpu_hosts_fails_with_the_roles_message(tmp_path: Path) -> None:
    (tmp_path / "hosts.yml").write_text("all:\n  children:\n    gateway_hosts:\n      hosts:\n        gw: {}\n")
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(tmp_path / "hosts.yml")])
    assert result.exit_code == 1
    assert "No replica behind the gateway" in result.output
