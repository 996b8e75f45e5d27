"""One route from Ansible into labctl each way (src/labctl/module_utils/__init__.py says which):
controller-side plugins import the installed package; target modules get labctl.module_utils, and
only it, through one symlink per role; nothing outside the tests loads code by path or edits
sys.path."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from labctl.ansible_run import ansible_path
from labctl.module_utils import verifycore

from .conftest import flip_byte

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / "src" / "labctl" / "module_utils"
BIN = Path(sys.executable).parent
# Never the project's own code: installed packages, build outputs, the VCS.
_SKIPPED_DIRS = {".venv", "build", ".git", "node_modules", "__pycache__", ".pytest_cache", ".mypy_cache",
                 ".ruff_cache", ".ansible"}
# The tests and the molecule scenarios' verifiers are the tests (pytest's rootdir and conftest files).
_TEST_DIRS = ("tests", "molecule")
# Loading code by file path, or changing where imports look.
_PATH_LOADING = re.compile(
    r"\bspec_from_file_location\b|\bSourceFileLoader\b|\bload_source\b|\bsite\.addsitedir\b"
    r"|\bsys\.path\s*(?:\.\s*(?:insert|append|extend)\b|\[[^\]]*\]\s*=|\+=|=(?!=))"
)


def _walk(root: Path) -> Iterator[Path]:
    """Every file under ``root`` (symlinked directories not followed: their target is walked itself)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(filenames):
            yield Path(dirpath) / name


def _is_python(path: Path) -> bool:
    """A Python file: .py, a .py template, a script whose #! names python, or a shell script (its
    Python heredocs)."""
    if path.suffix in (".py", ".sh") or path.name.endswith(".py.j2"):
        return True
    if path.suffix or path.is_symlink():
        return False
    try:
        with path.open("rb") as handle:
            first = handle.readline(200)
    except OSError:
        return False
    return first.startswith(b"#!") and b"python" in first


def project_python(include_tests: bool = False) -> list[Path]:
    found = []
    for path in _walk(REPO):
        rel = path.relative_to(REPO)
        if not include_tests and rel.parts[0] in _TEST_DIRS:
            continue
        if _is_python(path):
            found.append(path)
    return found


def path_loading(paths: list[Path]) -> list[tuple[Path, int, str]]:
    """(file, line number, line) of each place that loads code by path or edits sys.path."""
    hits = []
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if _PATH_LOADING.search(line):
                hits.append((path, number, line.strip()))
    return hits


def test_no_code_is_loaded_by_path_outside_the_tests() -> None:
    """No importlib by path, no SourceFileLoader, no sys.path edit in the project's Python (plugins,
    modules, labctl, scripts, bench, templates, the Python in shell scripts)."""
    paths = project_python()
    assert any(p.name == "labctl_filters.py" for p in paths) and any(p.suffix == ".sh" for p in paths)
    found = [f"{path.relative_to(REPO)}:{number}: {line}" for path, number, line in path_loading(paths)]
    assert found == []


def test_the_path_loading_check_sees_each_form(tmp_path: Path) -> None:
    loading = ["spec = importlib.util.spec_from_file_location('x', path)", "sys.path.insert(0, src)",
               "sys.path.append(src)", "sys.path [:0] = [src]", "sys.path = [src] + sys.path", "sys.path += [src]",
               "loader = importlib.machinery.SourceFileLoader('x', path)", "site.addsitedir(src)"]
    sample = tmp_path / "sample.py"
    sample.write_text("\n".join(loading + ["if src in sys.path:", "    pass", "ok = sys.path == []"]) + "\n")
    assert [line for _path, _number, line in path_loading([sample])] == loading


# --- targets: labctl.module_utils through one symlink per role ---------------------------------------


def _module_utils_dirs() -> list[Path]:
    """Every folder named module_utils in the project but labctl.module_utils itself."""
    found = []
    for dirpath, dirnames, _files in os.walk(REPO):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        found += [Path(dirpath) / d for d in dirnames if d == "module_utils"]
    return [d for d in found if d != SHARED]


def test_every_module_utils_folder_is_the_one_symlink_into_labctl() -> None:
    folders = _module_utils_dirs()
    assert {d.relative_to(REPO).as_posix() for d in folders} >= {"roles/airgap/module_utils", "roles/model_weights/module_utils",
                                                                 "module_utils"}
    for folder in folders:
        entries = sorted(p.name for p in folder.iterdir())
        where = folder.relative_to(REPO)
        assert entries == ["labctl"], f"{where}: only the symlink labctl -> src/labctl/module_utils belongs here, found {entries}"
        link = folder / "labctl"
        assert link.is_symlink() and link.resolve() == SHARED, f"{where}/labctl must be a symlink to src/labctl/module_utils"
        assert not Path(os.readlink(link)).is_absolute(), f"{where}/labctl: a relative link, so that every checkout has it"
    # library/'s modules (beside no role) reach it through the repository's own folder, the one path ansible.cfg names
    config = (REPO / "ansible.cfg").read_text()
    assert re.findall(r"^\s*module_utils\s*=\s*(.*)$", config, re.MULTILINE) == ["module_utils"], \
        "ansible.cfg: module_utils = module_utils (the repository's folder, the symlink); the roles bring their own"


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(level, module) of every import of ``path``; ``from . import x`` gives (1, "x")."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.module is None:
                for alias in node.names:
                    yield node.level, alias.name
            else:
                yield node.level, node.module


def _target_modules() -> list[Path]:
    return sorted([*REPO.glob("library/*.py"), *REPO.glob("roles/*/library/*.py")])


def test_target_modules_reach_labctl_only_as_module_utils() -> None:
    """A module imports the standard library, ansible-core's own module_utils and
    ansible.module_utils.labctl.<module> (one that exists), never labctl itself; a role whose module
    imports the shared package has the symlink."""
    assert _target_modules()
    for path in _target_modules():
        where = path.relative_to(REPO)
        for level, name in _imports(path):
            top = name.split(".")[0]
            assert level == 0, f"{where}: relative import {name}"
            assert top != "labctl", f"{where}: imports {name}; a target has no labctl, use ansible.module_utils.labctl"
            if name.startswith("ansible.module_utils.labctl"):
                parts = name.split(".")
                assert len(parts) == 4 and (SHARED / f"{parts[3]}.py").is_file(), f"{where}: no such shared module: {name}"
                utils = path.parent.parent / "module_utils" / "labctl"
                assert utils.resolve() == SHARED, f"{where} imports {name} but {utils.relative_to(REPO)} is not the symlink"
            elif name.startswith("ansible.module_utils."):
                assert importlib.util.find_spec(name) is not None, f"{where}: {name} is not ansible-core's"
            else:
                assert top in sys.stdlib_module_names or top in ("__future__", "ansible"), f"{where}: imports {name}"


def test_the_shared_package_runs_on_every_target_python() -> None:
    """Python 3.9 syntax, annotations never evaluated, the standard library and its neighbours only."""
    files = sorted(SHARED.glob("*.py"))
    assert {p.stem for p in files} >= {"__init__", "sums", "verifycore", "stager"}
    for path in files:
        text = path.read_text()
        ast.parse(text, feature_version=(3, 9))
        if path.name != "__init__.py":
            assert "from __future__ import annotations" in text, f"{path.name}: PEP 604/585 annotations need it on 3.9"
        for level, name in _imports(path):
            if level:
                assert level == 1 and (SHARED / f"{name.split('.')[0]}.py").is_file(), f"{path.name}: imports .{name}"
            else:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{path.name}: imports {name}"


def _run_module(module: str, args: dict[str, object], role: str, tmp_path: Path) -> dict[str, object]:
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")  # not the project's: nothing but the role's own folders
    env = dict(os.environ, ANSIBLE_CONFIG=str(config), ANSIBLE_LIBRARY=str(REPO / "roles" / role / "library"),
               ANSIBLE_MODULE_UTILS=str(REPO / "roles" / role / "module_utils"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"), ANSIBLE_HOME=str(tmp_path / ".ansible"))
    out = subprocess.run([str(BIN / "ansible"), "localhost", "-c", "local", "-m", module, "-a", json.dumps(args), "-o"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, check=False, timeout=300)
    assert " => " in out.stdout, out.stdout + out.stderr
    head, body = out.stdout.split(" => ", 1)
    result: dict[str, object] = json.loads(body)
    result["failed"] = head.split(" | ")[1].startswith("FAILED")  # the one-line output keeps it in the status
    return result


def test_a_target_module_runs_the_shared_verification(bundle: Path, tmp_path: Path) -> None:
    """labctl_bundle_verify as Ansible ships it (AnsiballZ packs labctl.module_utils from the role's
    symlink) gives the verdict labctl bundle verify gives."""
    good = _run_module("labctl_bundle_verify", {"path": str(bundle)}, "airgap", tmp_path)
    assert good["failed"] is False and good["problems"] == [], good
    assert good["files"] == verifycore.verify_bundle(str(bundle)).files_checked
    flip_byte(bundle / "apt" / "Packages")
    bad = _run_module("labctl_bundle_verify", {"path": str(bundle)}, "airgap", tmp_path)
    assert bad["failed"] is True, bad
    kinds = [(p["kind"], p["path"]) for p in bad["problems"]]  # type: ignore[attr-defined]
    assert kinds == [(p.kind, p.path) for p in verifycore.verify_bundle(str(bundle)).problems] == [("modified", "apt/Packages")]


def test_controller_plugins_import_the_installed_labctl() -> None:
    """The filters that need labctl import it by name, as every other module of the package is
    imported; ansible-playbook, labctl (ansible-runner) and molecule all run from this venv."""
    for rel in ("filter_plugins/labctl_filters.py", "roles/preflight/filter_plugins/preflight_plan.py"):
        names = {name for level, name in _imports(REPO / rel) if level == 0}
        assert {n for n in names if n.split(".")[0] == "labctl"}, f"{rel} does not import labctl"
    # labctl's runs (ansible-runner) find the ansible-playbook of labctl's own venv first; the Makefile
    # (make demo, make molecule) puts the same folder first on PATH.
    found = shutil.which("ansible-playbook", path=ansible_path())
    assert found is not None and Path(found) == BIN / "ansible-playbook"
    assert re.search(r"^export PATH := \$\(CURDIR\)/\$\(VENV\)/bin:", (REPO / "Makefile").read_text(), re.MULTILINE)
    # ... whose interpreter is this one, where labctl is installed.
    shebang = Path(found).read_text().splitlines()[0].removeprefix("#!")
    assert Path(shebang).parent == BIN and importlib.util.find_spec("labctl.topology") is not None
