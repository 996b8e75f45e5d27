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


def test_replicas_on_other_hosts_are_reached_over_https_with_the_lab_ca(tmp_path: Path) -> None:
    """The scale-out shape (issue 29): the gateway's requests and the replicas' key cross the network,
    so every deployment names an https replica and LiteLLM verifies it with the lab's CA. LiteLLM
    1.106.0's OpenAI client takes its CA from litellm.ssl_verify only (llms/openai/common_utils.py,
    _get_async_http_client: get_ssl_configuration() without the deployment's litellm_params), so the
    CA is a litellm_settings entry. The single-host bench inventory keeps plain loopback URLs and no
    ssl_verify (the test above, and here)."""
    (tmp_path / "group_vars" / "all").mkdir(parents=True)
    (tmp_path / "group_vars" / "all" / "00-project.yml").symlink_to(REPO / "group_vars" / "all" / "project.yml")
    (tmp_path / "group_vars" / "all" / "site.yml").write_text(
        f"lab_secrets_dir: {tmp_path / 'secrets'}\nlab_expected_gpu_count: 2\n")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  children:\n    lab:\n      children:\n"
        "        gateway_hosts: {hosts: {gw: {ansible_host: 10.89.77.10}}}\n"
        "        monitoring_hosts: {hosts: {gw: {}}}\n"
        "        gpu_hosts: {hosts: {gpu1: {ansible_host: 10.89.77.11}, gpu2: {ansible_host: 10.89.77.12}}}\n")
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(tmp_path / "hosts.yml")])
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(result.stdout)
    assert sorted({d["litellm_params"]["api_base"] for d in config["model_list"]}) == [
        "https://10.89.77.11:8000/v1", "https://10.89.77.11:8001/v1", "https://10.89.77.12:8000/v1", "https://10.89.77.12:8001/v1"]
    defaults = yaml.safe_load((REPO / "roles" / "litellm" / "defaults" / "main.yml").read_text())
    assert config["litellm_settings"]["ssl_verify"] == defaults["litellm_vllm_ca_file"] == "/etc/labctl/tls/ca.crt"
    assert "ssl_verify" not in yaml.safe_load(CliRunner().invoke(app, ["gateway-config", "-i", str(BENCH_INVENTORY)]).stdout)[
        "litellm_settings"]


def _inventory(tmp_path: Path, **variables: object) -> Path:
    """The bench inventory with ``variables`` on top."""
    import shutil

    inventory = tmp_path / "inventory"
    shutil.copytree(BENCH_INVENTORY, inventory)
    (inventory / "group_vars" / "all" / "zz-test.yml").write_text(yaml.safe_dump(variables))
    return inventory


def _config(inventory: Path) -> dict[str, object]:
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(inventory)])
    assert result.exit_code == 0, result.output
    config: dict[str, object] = yaml.safe_load(result.stdout)
    return config


def test_database_mode_is_as_closed_as_the_default(tmp_path: Path) -> None:
    """/metrics/ wants its token there too (a virtual key for /metrics only, keys_database.yml), the
    class guard runs before the gate, and neither the admin UI nor a UI sign-in with the master key."""
    from .gateway_proxy import render_env

    config = _config(_inventory(tmp_path, lab_litellm_database_mode=True, lab_litellm_metrics_key="sk-metrics-x"))
    settings, general = config["litellm_settings"], config["general_settings"]
    assert isinstance(settings, dict) and isinstance(general, dict)
    assert general["database_url"] == "os.environ/DATABASE_URL" and "custom_auth" not in general
    assert settings["require_auth_for_metrics_endpoint"] is True
    assert settings["callbacks"] == ["labctl_routes.routes", "prometheus", "labctl_guard.guard", "labctl_readiness.readiness",
                                     "labctl_admission.admission"]
    assert general["disable_env_credential_login"] is True
    env = render_env({"litellm_master_key": "m", "litellm_salt_key": "s", "__litellm_metrics_auth": True, "litellm_metrics_key": "k",
                      "litellm_vllm_api_key": "", "litellm_redis_host": "h", "litellm_redis_port": 1, "litellm_redis_password": "p",
                      "litellm_database_mode": False, "litellm_admin_ui": False, "litellm_state_dir": "/x", "litellm_group": "g"})
    assert env["DISABLE_ADMIN_UI"] == "True"


def test_the_admin_ui_only_when_the_inventory_asks(tmp_path: Path) -> None:
    from .gateway_proxy import render_env

    config = _config(_inventory(tmp_path, lab_litellm_admin_ui=True))
    assert "disable_env_credential_login" not in config["general_settings"]  # type: ignore[operator]
    # The UI needs the routes the filter closes (/ui, /get_image, /.well-known/litellm-ui-config, /sso...).
    assert "labctl_routes.routes" not in config["litellm_settings"]["callbacks"]  # type: ignore[index]
    env = render_env({"litellm_master_key": "m", "litellm_salt_key": "s", "__litellm_metrics_auth": False, "litellm_metrics_key": "",
                      "litellm_vllm_api_key": "", "litellm_redis_host": "h", "litellm_redis_port": 1, "litellm_redis_password": "p",
                      "litellm_database_mode": False, "litellm_admin_ui": True, "litellm_state_dir": "/x", "litellm_group": "g"})
    assert "DISABLE_ADMIN_UI" not in env


def test_callbacks_out_writes_the_plain_callbacks_beside_their_rendered_settings(tmp_path: Path) -> None:
    """`--callbacks-out` (what make bench-gateway runs the role's gate with): the role's plain Python
    callbacks as shipped, each beside the settings the role renders for the inventory."""
    out = tmp_path / "callbacks"
    result = CliRunner().invoke(app, ["gateway-config", "-i", str(BENCH_INVENTORY), "--callbacks-out", str(out)])
    assert result.exit_code == 0, result.output
    files = REPO / "roles" / "litellm" / "files" / "etc" / "labctl" / "litellm"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [p.name for p in files.glob("*.py")] + ["labctl_admission.yaml", "labctl_auth.yaml", "labctl_guard.yaml",
                                                "labctl_readiness.yaml", "labctl_routes.yaml"])
    for callback in files.glob("*.py"):
        assert (out / callback.name).read_bytes() == callback.read_bytes(), callback.name
    gate = yaml.safe_load((out / "labctl_admission.yaml").read_text())
    config = yaml.safe_load(result.stdout)
    classes = {d["model_name"]: d["litellm_params"]["extra_body"]["priority"] for d in config["model_list"]}
    assert gate["classes"] == classes and gate["slots"] == 48 and gate["max_hold"] > gate["timeout"]
    # The guard: the model API's routes exactly, and each public name's logprobs limits (issue 40).
    guard = yaml.safe_load((out / "labctl_guard.yaml").read_text())
    assert "/v1/chat/completions" in guard["routes"] and "/v1/model/info" not in guard["routes"]
    assert guard["logprobs"] == {name: {"top_logprobs": 5, "prompt_logprobs": None} for name in classes}
