"""verifycore is loaded by Ansible on targets: stdlib only, Python 3.9 syntax, no labctl imports."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import labctl.bundle.verifycore as verifycore

SOURCE = Path(verifycore.__file__)


def test_python39_syntax() -> None:
    ast.parse(SOURCE.read_text(), feature_version=(3, 9))


def test_stdlib_only_absolute_imports() -> None:
    tree = ast.parse(SOURCE.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            assert node.module is not None
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or top == "__future__", module


def test_loads_standalone(tmp_path: Path) -> None:
    """As Ansible loads it: a file with another module name, outside the package."""
    copy = tmp_path / "labctl_verifycore.py"
    copy.write_text(SOURCE.read_text())
    spec = importlib.util.spec_from_file_location("labctl_verifycore", copy)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["labctl_verifycore"] = module
    try:
        spec.loader.exec_module(module)
        assert module.MANIFEST == "manifest.json"
        assert module.SIGNATURE == "manifest.json.sig"
        assert module.KEYRING == "keys/bundle.gpg"
        assert module.SIGNATURE_ARTEFACTS == ("apt/InRelease", "apt/Release.gpg")
        problem = module.Problem("modified", "apt/pool/x.deb", "sha256 expected ab12, found cd34")
        assert problem.message() == "modified: apt/pool/x.deb (sha256 expected ab12, found cd34)"
    finally:
        del sys.modules["labctl_verifycore"]


def test_content_digest_ignores_signature_artefacts() -> None:
    files = [
        {"path": "b", "sha256": "2" * 64, "size": 2},
        {"path": "a", "sha256": "1" * 64, "size": 1},
    ]
    digest = verifycore.content_digest(files)
    assert digest == verifycore.content_digest(list(reversed(files)))
    with_sigs = files + [{"path": p, "sha256": "3" * 64, "size": 3} for p in verifycore.SIGNATURE_ARTEFACTS]
    assert verifycore.content_digest(with_sigs) == digest
    import hashlib

    expected = hashlib.sha256(f"a {'1' * 64} 1\nb {'2' * 64} 2\n".encode()).hexdigest()
    assert digest == expected
