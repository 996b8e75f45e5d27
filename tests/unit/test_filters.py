"""The roles' Jinja filters (roles/<role>/filter_plugins/); the shared labctl_topology is in test_topology.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def _load(*parts: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(parts[-1].removesuffix(".py"), REPO.joinpath(*parts))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPO = Path(__file__).resolve().parents[2]
vllm = _load("roles", "vllm", "filter_plugins", "vllm_filters.py")
grafana = _load("roles", "grafana", "filter_plugins", "grafana_filters.py")
nvidia = _load("roles", "nvidia_driver", "filter_plugins", "nvidia_driver_filters.py")


def test_restart_queue_follows_play_order_and_marks() -> None:
    replicas = [{"host": "a", "index": 0, "port": 8000}, {"host": "a", "index": 1, "port": 8001},
                {"host": "b", "index": 0, "port": 8000}, {"host": "c", "index": 0, "port": 8000}]
    hostvars = {"a": {"vllm_restart_pending": [1]}, "b": {}, "c": {"vllm_restart_pending": [0]}}
    queue = vllm.labctl_restart_queue(replicas, ["c", "b", "a"], hostvars)
    assert [(q["host"], q["index"], q["port"]) for q in queue] == [("c", 0, 8000), ("a", 1, 8001)]


def test_dashboard_defaults_set_the_spend_prices_of_the_shipped_dashboard() -> None:
    import json

    import pytest
    from ansible.errors import AnsibleFilterError

    path = Path(__file__).resolve().parents[2] / "roles" / "grafana" / "files" / "dashboards" / "labctl-gateway.json"
    dashboard = json.loads(path.read_text())
    changed = grafana.labctl_dashboard_defaults(dashboard, {"usd_per_mtok_input": 0.2, "usd_per_mtok_output": "0.8"})
    variables = {v["name"]: v for v in changed["templating"]["list"]}
    assert variables["usd_per_mtok_input"]["query"] == "0.2"
    assert variables["usd_per_mtok_input"]["current"]["value"] == "0.2"
    assert variables["usd_per_mtok_output"]["current"]["text"] == "0.8"
    assert json.loads(path.read_text()) == dashboard, "the input is not modified"
    assert grafana.labctl_dashboard_defaults(dashboard, {}) == dashboard
    both = grafana.labctl_dashboards_defaults([json.dumps(dashboard)] * 2, ["a.json", "b.json"],
                                              {"b.json": {"usd_per_mtok_input": 0.3}})
    assert both[0] == dashboard and both[1] != dashboard
    with pytest.raises(AnsibleFilterError, match="1 dashboard texts for 2 file names"):
        grafana.labctl_dashboards_defaults(["{}"], ["a.json", "b.json"], {})
    # The role hands over the JSON text (parsed here, no deep copy of Ansible's lazy containers).
    assert grafana.labctl_dashboard_defaults(path.read_text(), {"usd_per_mtok_input": 0.2, "usd_per_mtok_output": "0.8"}) == changed
    with pytest.raises(AnsibleFilterError, match=r"no variable.*usd_per_mtok_inptu"):
        grafana.labctl_dashboard_defaults(dashboard, {"usd_per_mtok_inptu": 1})


def test_upstream_version_drops_epoch_and_revision() -> None:
    assert nvidia.labctl_upstream_version("580.95.05-0ubuntu1") == "580.95.05"
    assert nvidia.labctl_upstream_version("1:1.1.13-1build1") == "1.1.13"
    assert nvidia.labctl_upstream_version("580.95.05") == "580.95.05"


def test_fabric_manager_versions_match_the_driver_on_the_upstream_part() -> None:
    # `apt-cache madison nvidia-fabricmanager` on Ubuntu 24.04 with NVIDIA's repo: the driver is
    # 580.95.05-0ubuntu1, fabric manager 580.95.05-1 (installing "=<driver version>" is refused).
    madison = ["580.105.08-1", "580.95.05-1", "580.82.07-1"]
    assert nvidia.labctl_same_upstream(madison, "580.95.05-0ubuntu1") == ["580.95.05-1"]
    assert nvidia.labctl_same_upstream(madison, "580.95.05-1") == ["580.95.05-1"]
    assert nvidia.labctl_same_upstream(madison, "580.65.06-0ubuntu1") == []


def test_fabric_manager_and_nscq_are_chosen_per_release() -> None:
    offered = {"nvidia-fabricmanager": ["580.105.08-1", "580.95.05-1"], "libnvidia-nscq": ["580.105.08-1"]}
    choice = nvidia.labctl_release_choice(offered, "580.95.05-0ubuntu1")
    assert choice == {"install": ["nvidia-fabricmanager=580.95.05-1"], "missing": ["libnvidia-nscq"]}


def test_what_is_left_of_a_release_moves_where_the_repository_carries_the_new_one() -> None:
    """Within a branch, Debian's nvidia-modprobe (>= 580) stays at the old release when the driver
    moves: it moves too (removing it would remove the driver that depends on it); a package of the
    old release the repository does not carry at the new one (Ubuntu's old names) is removed."""
    madison = (" nvidia-modprobe | 580.105.08-1 | file:/srv/labctl/bundle/apt ./ Packages\n"
               " nvidia-modprobe | 580.95.05-1 | file:/srv/labctl/bundle/apt ./ Packages\n"
               "nvidia-kernel-source-575-open | 575.57.08-0ubuntu1 | file:/srv/labctl/bundle/apt ./ Packages\n")
    offered = nvidia.labctl_madison(madison, ["nvidia-modprobe", "nvidia-kernel-source-575-open", "nvidia-firmware-575-575.57.08"])
    assert offered == {"nvidia-modprobe": ["580.105.08-1", "580.95.05-1"],
                       "nvidia-kernel-source-575-open": ["575.57.08-0ubuntu1"], "nvidia-firmware-575-575.57.08": []}
    choice = nvidia.labctl_release_choice(offered, "580.105.08-1")
    assert choice == {"install": ["nvidia-modprobe=580.105.08-1"],
                      "missing": ["nvidia-kernel-source-575-open", "nvidia-firmware-575-575.57.08"]}


def test_of_model_picks_one_models_replicas_or_models_by_any_of_its_names() -> None:
    """labctl smoke / rolling-restart --model (Issue 32)."""
    import pytest
    from ansible.errors import AnsibleFilterError

    labctl_of_model = _load("filter_plugins", "labctl_filters.py").labctl_of_model

    replicas = [{"index": 0, "model": "chat", "public_names": ["chat", "chat-v2"]},
                {"index": 100, "model": "embed", "public_names": ["embed"]}]
    one = [{"index": 0, "public_name": "gpt-oss-120b"}]
    assert labctl_of_model(replicas, "") == replicas
    assert [r["index"] for r in labctl_of_model(replicas, "chat-v2")] == [0]
    assert [r["index"] for r in labctl_of_model(replicas, "embed")] == [100]
    assert labctl_of_model(one, "gpt-oss-120b") == one
    assert labctl_of_model(replicas[:1], "embed", strict=False) == []
    with pytest.raises(AnsibleFilterError, match=r"--model nope: no such model here \(the lab serves: chat, chat-v2, embed\)"):
        labctl_of_model(replicas, "nope")
    models = [{"name": "chat", "served_names": ["chat"], "kind": "generate"}, {"name": "embed", "served_names": ["e"], "kind": "embed"}]
    assert labctl_of_model(models, "e") == models[1:]


def test_host_models_are_the_models_a_host_runs_a_replica_of() -> None:
    """What the artifacts layer stages on a host and preflight checks for it (Issue 32)."""
    labctl_host_models = _load("filter_plugins", "labctl_filters.py").labctl_host_models

    topology = {"models": [{"name": "chat", "revision": "r1"}, {"name": "embed", "revision": "r2"}],
                "replicas": [{"host": "gpu1", "model": "chat"}, {"host": "gpu1", "model": "chat"}, {"host": "gpu2", "model": "embed"}]}
    assert labctl_host_models(topology, "gpu1") == [{"name": "chat", "revision": "r1"}]
    assert labctl_host_models(topology, "gpu2") == [{"name": "embed", "revision": "r2"}]
    assert labctl_host_models(topology, "gateway") == []
    assert labctl_host_models({"replicas": [{"host": "gpu1", "index": 0}]}, "gpu1") == []  # one model: no lab_models
