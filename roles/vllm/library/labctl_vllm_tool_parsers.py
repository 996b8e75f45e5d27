#!/usr/bin/python
"""Ansible module: the tool-call parsers an installed vLLM registers, and whether it has one."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: labctl_vllm_tool_parsers
short_description: Check a tool-call parser name against the vLLM installed in a virtualenv
description:
  - Reads, without importing vLLM (seconds of torch imports), the names vLLM registers for
    C(--tool-call-parser): the keys of C(_TOOL_PARSERS_TO_REGISTER) in the package's
    C(tool_parsers/__init__.py) (vLLM 0.12 on: C(vllm/tool_parsers/), before:
    C(vllm/entrypoints/openai/tool_parsers/)) and the names of any
    C(ToolParserManager.register_module(...)) call in that directory.
  - Fails, listing the names there are, when O(name) is not one of them (vLLM itself would refuse
    to start, with C(invalid tool call parser)). An empty O(name) is not checked.
  - Read-only: reports C(changed=false). In check mode a virtualenv that is not installed yet is
    not an error. Standard library only.
options:
  venv:
    description: The virtualenv vLLM is installed in.
    type: path
    required: true
  name:
    description: The parser name (C(vllm_tool_call_parser)); empty for none.
    type: str
    default: ""
  variable:
    description: The variable the name comes from, for the error message.
    type: str
    default: vllm_tool_call_parser
author: labctl maintainers
"""

EXAMPLES = r"""
- name: Refuse a tool-call parser the installed vLLM does not have
  labctl_vllm_tool_parsers:
    venv: /opt/labctl/vllm/current
    name: openai
"""

RETURN = r"""
parsers:
  description: Every tool-call parser name the installed vLLM registers, sorted.
  returned: success
  type: list
  elements: str
  sample: [hermes, llama3_json, openai]
registry:
  description: The file the names were read from.
  returned: success
  type: str
"""

import ast
import glob
import os

from ansible.module_utils.basic import AnsibleModule

# Where vLLM keeps its parser registry, newest layout first.
REGISTRY_DIRS = (("vllm", "tool_parsers"), ("vllm", "entrypoints", "openai", "tool_parsers"))
REGISTRY_NAME = "_TOOL_PARSERS_TO_REGISTER"


def _strings(node: ast.AST | None) -> list[str]:
    """The string constants of a call argument: "x" or ["x", "y"]."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def registered_names(sources: dict[str, str]) -> list[str]:
    """The parser names in vLLM's tool_parsers sources ({file name: text}): the keys of the
    lazy-registration dict and the names given to register_module(...) (first argument or name=)."""
    names: set[str] = set()
    for text in sources.values():
        tree = ast.parse(text)
        for node in ast.walk(tree):
            target: ast.expr | None = None
            value: ast.expr | None = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if isinstance(target, ast.Name) and target.id == REGISTRY_NAME and isinstance(value, ast.Dict):
                for key in value.keys:
                    names.update(_strings(key))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register_module"):
                if node.args:
                    names.update(_strings(node.args[0]))
                for keyword in node.keywords:
                    if keyword.arg == "name":
                        names.update(_strings(keyword.value))
    return sorted(names)


def registry_dir(venv: str) -> str | None:
    """vLLM's tool_parsers directory inside the virtualenv, or None."""
    for site in sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))):
        for parts in REGISTRY_DIRS:
            path = os.path.join(site, *parts)
            if os.path.isfile(os.path.join(path, "__init__.py")):
                return path
    return None


def read_sources(path: str) -> dict[str, str]:
    sources: dict[str, str] = {}
    for name in sorted(os.listdir(path)):
        if name.endswith(".py"):
            with open(os.path.join(path, name)) as handle:
                sources[name] = handle.read()
    return sources


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "venv": {"type": "path", "required": True},
            "name": {"type": "str", "default": ""},
            "variable": {"type": "str", "default": "vllm_tool_call_parser"},
        },
        supports_check_mode=True,
    )
    venv, name, variable = module.params["venv"], module.params["name"] or "", module.params["variable"]
    path = registry_dir(venv)
    if path is None:
        if module.check_mode:
            module.exit_json(changed=False, parsers=[], registry="", msg="vLLM is not installed in %s yet" % venv)
        module.fail_json(msg="no vLLM tool-call parser registry in %s (looked for %s)"
                         % (venv, ", ".join("/".join(p) for p in REGISTRY_DIRS)))
    try:
        parsers = registered_names(read_sources(path))
    except (OSError, SyntaxError, ValueError) as exc:
        module.fail_json(msg="cannot read vLLM's tool-call parsers in %s: %s" % (path, exc))
    if not parsers:
        module.fail_json(msg="found no tool-call parser name in %s" % path)
    if name and name not in parsers:
        module.fail_json(msg="%s=%r is not a tool-call parser of the installed vLLM (%s); it has: %s"
                         % (variable, name, path, ", ".join(parsers)), parsers=parsers)
    module.exit_json(changed=False, parsers=parsers, registry=os.path.join(path, "__init__.py"))


if __name__ == "__main__":
    main()
