"""Preflight's bundle filters (roles/preflight/filter_plugins/preflight_bundle.py): the served
model is in the bundle, the tiktoken files are harmony's, the bytes the model root must take."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("preflight_bundle", REPO / "roles" / "preflight" / "filter_plugins" / "preflight_bundle.py")
assert _SPEC and _SPEC.loader
bundle = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bundle)

KNOWN: dict[str, Any] = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())["lab_tiktoken_files"]
O200K = KNOWN["o200k_base"]["sha256"]
CL100K = KNOWN["cl100k_base"]["sha256"]


def _manifest(*files: tuple[str, int, str]) -> dict[str, Any]:
    return {"files": [{"path": path, "size": size, "sha256": sha} for path, size, sha in files]}


MANIFEST = _manifest(
    ("apt/InRelease", 10, "a" * 64),
    ("models/tiny-llama/r1/SHA256SUMS", 100, "b" * 64),
    ("models/tiny-llama/r1/model.safetensors", 5000, "c" * 64),
    ("models/tiny-llama/r1/sub/config.json", 20, "d" * 64),
    ("models/other/r7/model.safetensors", 99999, "e" * 64),
    ("tiktoken/o200k_base.tiktoken", 3, O200K),
    ("tiktoken/cl100k_base.tiktoken", 3, CL100K),
)


def test_served_model_in_the_bundle_is_no_problem() -> None:
    assert bundle.labctl_preflight_model_problems(MANIFEST, "tiny-llama", "r1", "/b") == []


def test_missing_model_or_revision_names_the_variables_and_what_the_bundle_carries() -> None:
    for name, revision in (("gpt-oss-120b", "r1"), ("tiny-llama", "r2")):
        (problem,) = bundle.labctl_preflight_model_problems(MANIFEST, name, revision, "/b")
        assert f"the bundle /b has no model {name} revision {revision} (lab_model_name, lab_model_revision)" in problem
        assert "it carries other r7, tiny-llama r1" in problem
    (problem,) = bundle.labctl_preflight_model_problems(_manifest(("apt/InRelease", 1, "a" * 64)), "m", "r1", "/b")
    assert "it carries no model at all" in problem


def test_prefix_of_a_name_is_not_the_model() -> None:
    (problem,) = bundle.labctl_preflight_model_problems(MANIFEST, "tiny", "r1", "/b")
    assert "no model tiny revision r1" in problem


def test_tiktoken_files_with_harmonys_hashes_pass() -> None:
    assert bundle.labctl_preflight_tiktoken_problems(MANIFEST, ["o200k_base", "cl100k_base"], KNOWN, "/b") == []


def test_wrong_tiktoken_file_is_named_with_both_hashes() -> None:
    swapped = _manifest(("tiktoken/o200k_base.tiktoken", 3, CL100K), ("tiktoken/cl100k_base.tiktoken", 3, CL100K))
    (problem,) = bundle.labctl_preflight_tiktoken_problems(swapped, ["o200k_base", "cl100k_base"], KNOWN, "/b")
    assert problem.startswith(
        f"the bundle /b has a wrong tiktoken/o200k_base.tiktoken: sha256 {CL100K}, but openai-harmony expects {O200K}")


def test_missing_or_unknown_encoding() -> None:
    only = _manifest(("tiktoken/o200k_base.tiktoken", 3, O200K))
    assert bundle.labctl_preflight_tiktoken_problems(only, ["o200k_base", "cl100k_base", "p50k"], KNOWN, "/b") == [
        "the bundle /b has no tiktoken/cl100k_base.tiktoken (tiktoken_cache_encodings): rebuild it with the tiktoken section",
        "tiktoken_cache_encodings: p50k is not an encoding harmony knows (cl100k_base, o200k_base)",
    ]


def test_model_bytes_count_only_the_served_revision_and_what_is_not_staged_yet() -> None:
    assert bundle.labctl_preflight_model_bytes(MANIFEST, "tiny-llama", "r1", []) == 5120
    staged = ["SHA256SUMS 100", "model.safetensors 5000", "sub/config.json 20"]
    assert bundle.labctl_preflight_model_bytes(MANIFEST, "tiny-llama", "r1", staged) == 0
    # A truncated copy on the target still needs the whole file.
    assert bundle.labctl_preflight_model_bytes(MANIFEST, "tiny-llama", "r1", ["SHA256SUMS 100", "model.safetensors 17"]) == 5020
    assert bundle.labctl_preflight_model_bytes(MANIFEST, "absent", "r1", []) == 0


def test_several_models_add_up_what_each_still_lacks() -> None:
    """lab_models: every model this host serves, each counted against its own staged files."""
    both = {"files": [*MANIFEST["files"], {"path": "models/tiny-embed/r1/model.safetensors", "size": 700}]}
    served = [{"name": "tiny-llama", "revision": "r1"}, {"name": "tiny-embed", "revision": "r1"}]
    assert bundle.labctl_preflight_models_bytes(both, served, []) == 5120 + 700
    staged = ["tiny-llama/r1/SHA256SUMS 100", "tiny-llama/r1/model.safetensors 5000", "tiny-llama/r1/sub/config.json 20"]
    assert bundle.labctl_preflight_models_bytes(both, served, staged) == 700
    # A file of the same name staged under another model does not count for this one.
    assert bundle.labctl_preflight_models_bytes(both, served, [*staged, "tiny-llama/r1/model.safetensors 700"]) == 700
    assert bundle.labctl_preflight_models_bytes(both, served[:1], staged) == 0
    (problem,) = bundle.labctl_preflight_model_problems(both, "tiny-embed", "r2", "/b", "lab_models")
    assert problem.startswith("the bundle /b has no model tiny-embed revision r2 (lab_models): it carries")


def test_typo_that_misses_every_prefix_is_named_with_the_declared_variable() -> None:
    known = ["vllm_replicas", "litellm_port", "lab_model_root"]
    prefixes = ["lab_", "vllm_", "litellm_"]
    names = ["vlm_replicas", "litelm_port", "lab_model_rot", "vllm_replica", "ansible_port", "inventory_dir", "_x", "HOME",
             "litellm_port", "zebra_count"]
    assert bundle.labctl_preflight_misspelled(names, known, prefixes) == [
        "unknown variable litelm_port (did you mean litellm_port?)",
        "unknown variable vlm_replicas (did you mean vllm_replicas?)",
    ]


def _specs() -> dict[str, Any]:
    roles = ["vllm", "nvidia_driver", "model_weights"]
    out = {"lab": yaml.safe_load((REPO / "roles" / "preflight" / "files" / "project_argument_specs.yml").read_text())}
    out.update({r: yaml.safe_load((REPO / "roles" / r / "meta" / "argument_specs.yml").read_text()) for r in roles})
    return {k: v["argument_specs"]["main"]["options"] for k, v in out.items()}


def test_variable_problems_check_every_role_in_one_pass() -> None:
    given = {"nvidia_driver_kernel_modules": "closed", "nvidia_driver_brnach": "575", "vllm_replicas": "two",
             "lab_vllm_replicas": 2, "vllm_max_model_len": 32768}
    names = [*given, "vlm_max_model_len", "ansible_host", "inventory_hostname"]
    problems = bundle.labctl_preflight_variable_problems(given, _specs(), names)
    assert any("nvidia_driver_kernel_modules" in p and "open" in p for p in problems), problems
    assert "unknown variable nvidia_driver_brnach (did you mean nvidia_driver_branch?)" in problems
    assert any("vllm_replicas" in p and "int" in p for p in problems), problems
    assert problems[-1] == "unknown variable vlm_max_model_len (did you mean vllm_max_model_len?)"
    # A required option (model_weights_models) is not demanded: the role's defaults fill it in when it runs.
    assert bundle.labctl_preflight_variable_problems({}, _specs(), []) == []


def test_variable_problems_accept_valid_values() -> None:
    given = {"lab_vllm_replicas": 2, "vllm_max_model_len": 32768, "nvidia_driver_kernel_modules": "open"}
    assert bundle.labctl_preflight_variable_problems(given, _specs(), list(given)) == []


class _Lazy(Mapping[str, Any]):
    """Stands in for ansible-core 2.19's lazily templated containers: a Mapping that is not a dict, whose
    deep copy is what cost site.yml 5 s (Issue 31); here a deep copy fails the test."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Lazy:
        raise AssertionError("the validator deep-copied a lazy container")


def test_variable_problems_hand_the_validator_plain_values() -> None:
    topology = _Lazy({"hosts": _Lazy({"h1": _Lazy({"roles": ["gpu"]})}), "problems": []})
    given = {"lab_topology": topology, "lab_vllm_replicas": 2}
    assert bundle.labctl_preflight_variable_problems(given, _specs(), list(given)) == []
    bad = {"lab_topology": _Lazy({"hosts": [1, 2]}), "lab_vllm_replicas": _Lazy({"a": 1})}
    assert any("lab_vllm_replicas" in p for p in bundle.labctl_preflight_variable_problems(bad, _specs(), list(bad)))
