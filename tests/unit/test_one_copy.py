"""One copy of each piece of shared logic: the streaming sha256 of a file, path safety, the
SHA256SUMS format, the human-readable sizes, the default model name."""

from __future__ import annotations

import ast
import hashlib
import subprocess
from pathlib import Path

import pytest
import yaml

from labctl import plan_hosts, progress, topology
from labctl.module_utils import progress as shared_progress
from labctl.module_utils.sums import SumsError, format_sums, hash_file, parse_sums, pump, safe_relpath, sha256_file

from .test_python_routes import REPO, project_python


def _python_sources() -> list[Path]:
    """The project's Python files outside the tests that parse as Python (no templates, no shell)."""
    return [p for p in project_python() if p.suffix in (".py", "")]


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text())) for path in _python_sources()]


def test_every_streaming_hash_of_a_file_is_sums_pump() -> None:
    """A loop that reads and feeds a digest exists once: labctl.module_utils.sums.pump (the bundle's
    copies and hashes, the wheel locker, Prisma's engines, bundle verification, model staging)."""
    loops = []
    for path, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
                calls = {n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
                if calls & {"read", "readinto"} and "update" in calls:
                    loops.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert len(loops) == 1 and loops[0].startswith("src/labctl/module_utils/sums.py:"), loops


@pytest.mark.parametrize("names", [("safe_relpath", "_safe_relpath"), ("human_size", "human_bytes"),
                                   ("parse_sums", "format_sums"), ("sha256_file", "_sha256_file", "hash_file")])
def test_each_helper_is_defined_once(names: tuple[str, ...]) -> None:
    found = sorted(f"{path.relative_to(REPO)}:{node.name}" for path, tree in _trees() for node in ast.walk(tree)
                   if isinstance(node, ast.FunctionDef) and node.name in names)
    assert found, names
    assert len(found) == len({f.split(":")[1] for f in found}), f"defined more than once: {found}"
    assert all(f.startswith("src/labctl/module_utils/") for f in found), f"outside labctl.module_utils: {found}"


def test_the_sha256sums_name_is_written_once() -> None:
    """The file name and its format live in labctl.module_utils.sums: the bundle builder writes
    with format_sums, the stager reads with parse_sums."""
    literal = [f"{path.relative_to(REPO)}:{node.lineno}" for path, tree in _trees() for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and node.value == "SHA256SUMS"
               and path.relative_to(REPO).parts[0] in ("src", "roles", "library")]
    assert len(literal) == 1 and literal[0].startswith("src/labctl/module_utils/sums.py:"), literal


def test_sums_are_sha256sums_own_format(tmp_path: Path) -> None:
    """What format_sums writes is byte for byte what sha256sum prints; parse_sums reads sha256sum's
    text and binary modes, and refuses what would leave the directory or collide with the stager's names."""
    for name, data in (("a.bin", b"a" * 5_000_000), ("sub/b.json", b"{}"), ("c d.txt", b"")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    names = ["a.bin", "c d.txt", "sub/b.json"]
    text = format_sums((sha256_file(str(tmp_path / n)), n) for n in names)
    tool = subprocess.run(["sha256sum", *names], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert text == tool
    binary = subprocess.run(["sha256sum", "-b", *names], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert parse_sums(binary, "x") == parse_sums(text, "x") == {n: hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() for n in names}
    digest = "0" * 64
    for bad in ("../x", "/etc/passwd", "a//b", "./.", "SHA256SUMS", ".labctl-verified.json", "a\\b"):
        with pytest.raises(SumsError, match="refusing the path"):
            parse_sums(f"{digest}  {bad}\n", "SUMS")
    with pytest.raises(SumsError, match="listed twice"):
        parse_sums(f"{digest}  x\n{digest} *./x\n", "SUMS")
    assert not safe_relpath("a\nb") and not safe_relpath(None) and safe_relpath("sub/.labctl-ok")


def test_hash_file_reads_a_prefix_and_reports_progress(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 40_000)
    seen: list[int] = []
    digest, done = hash_file(str(path), seen.append, limit=1_000_001)
    assert done == 1_000_001 == sum(seen) and digest.hexdigest() == hashlib.sha256(path.read_bytes()[:1_000_001]).hexdigest()

    class Short:
        """A writer that takes at most 7 bytes per call: pump writes everything anyway."""

        def __init__(self) -> None:
            self.data = bytearray()

        def write(self, chunk: memoryview) -> int:
            self.data += chunk[:7]
            return min(7, len(chunk))

    out = Short()
    with path.open("rb", buffering=0) as reader:
        assert pump(reader, hashlib.sha256(), out.write, size=1000) == path.stat().st_size
    assert bytes(out.data) == path.read_bytes()


def test_labctl_and_the_targets_print_sizes_alike() -> None:
    assert vars(progress)["human_bytes"] is shared_progress.human_bytes  # labctl's progress lines use it
    assert [shared_progress.human_bytes(n) for n in (0, 1023, 1024, 1536 * 2**20, 3 * 2**40)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 GiB", "3.0 TiB"]


def test_the_default_model_name_has_one_source() -> None:
    """Ansible: group_vars/all/project.yml's lab_model_name, which the roles' defaults read. Python:
    labctl.topology.DEFAULT_MODEL (labctl plan and the topology, for an inventory without it)."""
    project = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
    name = project["lab_model_name"]
    assert name == topology.DEFAULT_MODEL
    assert not hasattr(plan_hosts, "DEFAULT_MODEL")
    repeated = [str(path.relative_to(REPO)) for path in sorted(REPO.glob("roles/*/defaults/main.yml"))
                + sorted(REPO.glob("roles/*/meta/argument_specs.yml")) if name in path.read_text()]
    repeated += [f"{path.relative_to(REPO)}:{node.lineno}" for path, tree in _trees()
                 if path.is_relative_to(REPO / "src") and path.name not in ("topology.py", "plan.py")
                 for node in ast.walk(tree) if isinstance(node, ast.Constant) and node.value == name]
    assert repeated == []


def test_the_progress_plugins_arguments_are_written_once() -> None:
    """labctl_progress runs as an action plugin, which checks its arguments; the module of the same
    name only documents them (for ansible-doc and ansible-lint), and says what the plugin checks."""
    role = REPO / "roles" / "model_weights"
    stub = ast.parse((role / "library" / "labctl_progress.py").read_text())
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in stub.body)
    assert "argument_spec" not in ast.unparse(stub)
    documentation = str(next(n.value.value for n in stub.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                             and any(isinstance(t, ast.Name) and t.id == "DOCUMENTATION" for t in n.targets)))
    documented = yaml.safe_load(documentation)["options"]
    action = ast.parse((role / "action_plugins" / "labctl_progress.py").read_text())
    (spec,) = [ast.literal_eval(k.value) for n in ast.walk(action) if isinstance(n, ast.Call)
               for k in n.keywords if k.arg == "argument_spec"]

    def shape(options: dict[str, dict[str, object]]) -> dict[str, tuple[object, object, object]]:
        return {name: (o["type"], o.get("default"), o.get("required", False)) for name, o in options.items()}

    assert shape(documented) == shape(spec)
