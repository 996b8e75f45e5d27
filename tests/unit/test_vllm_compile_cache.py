"""Every compile product of a replica lands on persistent disk (roles/vllm/README.md, "Compile
caches"): the unit and its environment point each cache where the pinned torch writes it.
The behaviour itself (a container restart that compiles nothing) is molecule/stack's
test_stack_reboot.py."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "vllm"
UNIT = (ROLE / "templates" / "etc" / "systemd" / "system" / "vllm@.service.j2").read_text()
ENV = (ROLE / "templates" / "etc" / "labctl" / "vllm" / "vllm.env.j2").read_text()
WHEELS = REPO / "build" / "bundles" / "test" / "wheels"


def _torch_source(member: str) -> str:
    wheels = sorted(WHEELS.glob("torch-*.whl"))
    if not wheels:
        pytest.skip(f"no torch wheel in {WHEELS} (the test bundle is built first by make test)")
    with zipfile.ZipFile(wheels[-1]) as whl:
        return whl.read(member).decode()


def test_the_private_tmp_keeps_nothing_the_pinned_torch_reuses() -> None:
    """Inductor's precompiled headers go to default_cache_dir(), i.e. $TMPDIR/torchinductor_<user>,
    whatever TORCHINDUCTOR_CACHE_DIR says: the unit binds a persistent directory exactly there."""
    codecache = _torch_source("torch/_inductor/codecache.py")
    assert re.search(r'^_HEADER_DIR = os\.path\.join\(default_cache_dir\(\), "precompiled_headers"\)$', codecache, re.MULTILINE)
    cache_dir_utils = _torch_source("torch/_inductor/runtime/cache_dir_utils.py")
    default = cache_dir_utils[cache_dir_utils.index("def default_cache_dir"):cache_dir_utils.index("def triton_cache_dir")]
    assert "tempfile.gettempdir()" in default and '"torchinductor_" + sanitized_username' in default
    assert 'os.environ.get("TORCHINDUCTOR_CACHE_DIR")' in cache_dir_utils
    assert "PrivateTmp=yes" in UNIT and "Environment=TMPDIR" not in UNIT
    # The cache root itself, optional ('-'): a root removed by hand does not stop the start.
    assert "BindPaths=-{{ vllm_cache_root }}:/tmp/torchinductor_{{ vllm_user }}" in UNIT


def test_every_cache_variable_points_under_the_persistent_cache_root() -> None:
    values = dict(line.split("=", 1) for line in ENV.splitlines() if "=" in line and not line.startswith(("#", "{")))
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert values[name].startswith("{{ vllm_cache_root }}"), name
    for name in ("HOME", "XDG_CACHE_HOME", "HF_HOME", "VLLM_CONFIG_ROOT"):
        assert values[name].startswith("{{ vllm_state_dir }}"), name
    assert "ReadWritePaths={{ vllm_state_dir }}" in UNIT
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["vllm_cache_root"].startswith(defaults["vllm_state_dir"] + "/")
