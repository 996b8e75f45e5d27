"""labctl_template and labctl_directories on this machine (connection local): the one-call answer for
files and directories that are current, and the builtin's behaviour (write, validate, check mode,
diff) for every other case."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _load_file_state() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labctl_file_state", REPO / "library" / "labctl_file_state.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


labctl_file_state = _load_file_state()

TEMPLATE = """{{ ansible_managed | comment }}
name={{ name }}
{% for port in ports %}
port={{ port }}
{% endfor %}
{% if extra %}
extra=yes
{% endif %}
"""
# Prometheus-style rules: [[ ]] are Jinja's, {{ }} stay in the file.
RULES = "[[ ansible_managed | comment ]]\nexpr: rate(x{job=\"[[ name ]]\"}[5m]) > {{ $value }}\n"


def run(tmp_path: Path, tasks: list[dict[str, Any]], *extra: str, variables: dict[str, Any] | None = None
        ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "app.conf.j2").write_text(TEMPLATE)
    (tmp_path / "templates" / "rules.yml.j2").write_text(RULES)
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"name": "Files", "hosts": "localhost", "connection": "local",
                                     "gather_facts": False, "tasks": tasks}]))
    values = {"name": "svc", "ports": [1, 2], "extra": False, "root": str(tmp_path / "t"),
              "ansible_python_interpreter": sys.executable, **(variables or {})}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"), ANSIBLE_HOME=str(tmp_path / ".ansible"),
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    cmd = [str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), "-e", json.dumps(values), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)


def recap(result: subprocess.CompletedProcess[str]) -> dict[str, int]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("localhost") and "ok=" in line)
    return {k: int(v) for k, v in (part.split("=") for part in line.split(":", 1)[1].split())}


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return result


def template_task(module: str, dest: str, src: str = "app.conf.j2", **more: Any) -> dict[str, Any]:
    return {"name": f"{module} {dest}", "register": "out",
            module: {"src": src, "dest": "{{ root }}/" + dest, "owner": "root", "group": "root", "mode": "0640", **more}}


def show(var: str = "out") -> dict[str, Any]:
    return {"name": "Show", "ansible.builtin.debug": {"msg": "RESULT {{ " + var + " | to_json }}"}}


def shown(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    out = []
    for line in result.stdout.splitlines():
        if '"msg": "RESULT ' in line:
            out.append(json.loads(json.loads("{" + line.strip() + "}")["msg"][len("RESULT "):]))
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "t").mkdir()
    return tmp_path / "t"


def test_a_file_the_builtin_wrote_is_answered_in_one_call(tmp_path: Path, root: Path) -> None:
    # The builtin writes both files; labctl_template must find them current (its own rendering equals
    # the builtin's byte for byte, with ansible_managed, trim_blocks and other delimiters).
    tasks = [template_task("ansible.builtin.template", "app.conf"),
             template_task("ansible.builtin.template", "rules.yml", src="rules.yml.j2",
                           variable_start_string="[[", variable_end_string="]]"),
             template_task("labctl_template", "app.conf"), show(),
             template_task("labctl_template", "rules.yml", src="rules.yml.j2",
                           variable_start_string="[[", variable_end_string="]]"), show()]
    result = ok(run(tmp_path, tasks))
    assert recap(result)["changed"] == 2, result.stdout
    for answer in shown(result):
        assert answer["changed"] is False
        assert answer["answered_by"] == "labctl_file_state", answer
    assert "{{ $value }}" in (root / "rules.yml").read_text()
    assert (root / "app.conf").read_text().endswith("port=1\nport=2\n")


def test_write_then_nothing_then_repair_drift(tmp_path: Path, root: Path) -> None:
    tasks = [template_task("labctl_template", "app.conf"),
             {"name": "Content", "labctl_template": {"content": "exact\ntext", "dest": "{{ root }}/plain",
                                                     "owner": "root", "group": "root", "mode": "0600"}}]
    assert recap(ok(run(tmp_path, tasks)))["changed"] == 2
    assert (root / "plain").read_bytes() == b"exact\ntext"
    assert oct((root / "app.conf").stat().st_mode & 0o777) == "0o640"
    assert recap(ok(run(tmp_path, tasks)))["changed"] == 0

    (root / "app.conf").write_text("edited by hand\n")
    os.chmod(root / "plain", 0o644)
    result = ok(run(tmp_path, tasks, "--check", "--diff"))
    assert recap(result)["changed"] == 2
    assert "-edited by hand" in result.stdout and "+name=svc" in result.stdout
    assert (root / "app.conf").read_text() == "edited by hand\n", "check mode changed the file"
    assert recap(ok(run(tmp_path, tasks)))["changed"] == 2
    assert "name=svc" in (root / "app.conf").read_text()
    assert oct((root / "plain").stat().st_mode & 0o777) == "0o600"
    os.chown(root / "plain", 65534, 0)
    assert recap(ok(run(tmp_path, tasks)))["changed"] == 1
    assert (root / "plain").stat().st_uid == 0

    # A changed variable goes the builtin's way and is written.
    assert recap(ok(run(tmp_path, tasks, variables={"extra": True})))["changed"] == 1
    assert "extra=yes" in (root / "app.conf").read_text()


def test_a_failed_validation_leaves_the_file(tmp_path: Path, root: Path) -> None:
    ok(run(tmp_path, [template_task("labctl_template", "app.conf")]))
    before = (root / "app.conf").read_text()
    result = run(tmp_path, [template_task("labctl_template", "app.conf", validate="/bin/false %s")],
                 variables={"name": "other"})
    assert result.returncode != 0 and "failed to validate" in result.stdout, result.stdout[-3000:]
    assert (root / "app.conf").read_text() == before


def test_directories(tmp_path: Path, root: Path) -> None:
    task = {"name": "Dirs", "labctl_directories": {"directories": [
        {"path": "{{ root }}/a", "owner": "root", "group": "root", "mode": "0755"},
        {"path": "{{ root }}/a/b", "owner": "nobody", "group": "root", "mode": "0700"}]}, "register": "out"}
    result = ok(run(tmp_path, [task, show()]))
    assert recap(result)["changed"] == 1
    assert [d["changed"] for d in shown(result)[0]["directories"]] == [True, True]
    assert oct((root / "a" / "b").stat().st_mode & 0o777) == "0o700" and (root / "a" / "b").stat().st_uid == 65534
    result = ok(run(tmp_path, [task, show()]))
    assert recap(result)["changed"] == 0
    assert [d["changed"] for d in shown(result)[0]["directories"]] == [False, False]

    os.chmod(root / "a", 0o777)
    result = ok(run(tmp_path, [task], "--check"))
    assert recap(result)["changed"] == 1 and oct((root / "a").stat().st_mode & 0o777) == "0o777"
    assert recap(ok(run(tmp_path, [task])))["changed"] == 1
    assert oct((root / "a").stat().st_mode & 0o777) == "0o755"


def test_directories_refuse_an_incomplete_entry(tmp_path: Path) -> None:
    task = {"name": "Dirs", "labctl_directories": {"directories": [{"path": "{{ root }}/a", "owner": "root",
                                                                     "group": "root"}]}}
    result = run(tmp_path, [task])
    assert result.returncode != 0
    assert "entry 1 needs exactly path, owner, group and mode" in result.stdout


def files_task(**more: Any) -> dict[str, Any]:
    """One labctl_template task with files: a directory, a template per port (its vars), the rules with
    other delimiters and a content file."""
    return {"name": "Many", "register": "out", "labctl_template": {"files": [
        {"dest": "{{ root }}/d", "state": "directory", "owner": "root", "group": "root", "mode": "0750"},
        *({"src": "app.conf.j2", "dest": "{{ root }}/d/app-" + str(port) + ".conf", "owner": "root",
           "group": "root", "mode": "0640", "vars": {"name": "svc-" + str(port)}} for port in (1, 2)),
        {"src": "rules.yml.j2", "dest": "{{ root }}/rules.yml", "owner": "root", "group": "root", "mode": "0644",
         "variable_start_string": "[[", "variable_end_string": "]]"},
        {"content": "exact\ntext", "dest": "{{ root }}/plain", "owner": "root", "group": "root", "mode": "0600"},
        {"dest": "{{ root }}/stale.conf", "state": "absent"},
    ], **more}}


def test_files_in_one_task_are_written_then_answered_in_one_call(tmp_path: Path, root: Path) -> None:
    (root / "stale.conf").write_text("left from another placement\n")
    result = ok(run(tmp_path, [files_task(), show()]))
    assert recap(result)["changed"] == 1
    answer = shown(result)[0]
    assert [r["changed"] for r in answer["results"]] == [True] * 6
    assert not (root / "stale.conf").exists()
    assert "\nname=svc-2\n" in (root / "d" / "app-2.conf").read_text(), "an entry's vars reach its template"
    assert "{{ $value }}" in (root / "rules.yml").read_text() and (root / "plain").read_bytes() == b"exact\ntext"
    assert oct((root / "d").stat().st_mode & 0o777) == "0o750"

    # Byte for byte what the builtin writes: the next run is one call, all current.
    result = ok(run(tmp_path, [files_task(), show()]))
    assert recap(result)["changed"] == 0
    answer = shown(result)[0]
    assert {r["answered_by"] for r in answer["results"]} == {"labctl_file_state"} and answer["changed_files"] == []

    # Drift in one file: check mode reports it (with its diff) and writes nothing; the run repairs only it.
    (root / "d" / "app-1.conf").write_text("edited by hand\n")
    result = ok(run(tmp_path, [files_task(), show()], "--check", "--diff"))
    assert recap(result)["changed"] == 1 and "-edited by hand" in result.stdout and "+name=svc-1" in result.stdout
    assert shown(result)[0]["changed_files"] == [str(root / "d" / "app-1.conf")]
    assert (root / "d" / "app-1.conf").read_text() == "edited by hand\n", "check mode changed the file"
    result = ok(run(tmp_path, [files_task(), show()]))
    assert shown(result)[0]["changed_files"] == [str(root / "d" / "app-1.conf")]
    assert "name=svc-1" in (root / "d" / "app-1.conf").read_text()
    assert recap(ok(run(tmp_path, [files_task()])))["changed"] == 0


def test_a_file_already_on_the_target_is_copied_then_compared_in_the_one_call(tmp_path: Path, root: Path) -> None:
    """remote_src entries (the tiktoken files, the bundle's apt key): copied as ansible.builtin.copy
    copies them, then current while both files hold the same bytes; a changed source is copied again."""
    source = tmp_path / "source.bin"
    source.write_bytes(b"\x00binary\xffcontent\n")
    task = {"name": "Copies", "register": "out", "labctl_template": {"files": [
        {"dest": "{{ root }}/keys", "state": "directory", "owner": "root", "group": "root", "mode": "0755"},
        {"src": str(source), "remote_src": True, "dest": "{{ root }}/keys/copy.bin", "owner": "root", "group": "root",
         "mode": "0644"}]}}
    result = ok(run(tmp_path, [task, show()]))
    assert recap(result)["changed"] == 1 and (root / "keys" / "copy.bin").read_bytes() == source.read_bytes()
    assert oct((root / "keys" / "copy.bin").stat().st_mode & 0o777) == "0o644"
    answer = shown(ok(run(tmp_path, [task, show()])))[0]
    assert answer["changed_files"] == [] and {r["answered_by"] for r in answer["results"]} == {"labctl_file_state"}
    source.write_bytes(b"another key\n")
    answer = shown(ok(run(tmp_path, [task, show()])))[0]
    assert answer["changed_files"] == [str(root / "keys" / "copy.bin")]
    assert (root / "keys" / "copy.bin").read_bytes() == b"another key\n"
    source.unlink()  # a missing source: the builtin says so
    result = run(tmp_path, [task])
    assert result.returncode != 0 and str(source) in result.stdout, result.stdout[-2000:]


def test_files_stop_at_the_first_failure_naming_it(tmp_path: Path, root: Path) -> None:
    task = files_task()
    task["labctl_template"]["files"][1]["validate"] = "/bin/false %s"
    result = run(tmp_path, [task])
    assert result.returncode != 0 and f"{root}/d/app-1.conf: failed to validate" in result.stdout, result.stdout[-3000:]
    assert (root / "d").is_dir() and not (root / "d" / "app-1.conf").exists() and not (root / "plain").exists()


@pytest.mark.parametrize(("entry", "message"), [
    ({"src": "app.conf.j2", "dest": "/x", "owner": "root", "group": "root"}, "entry 1 (/x): missing mode"),
    ({"dest": "/x", "state": "absent", "mode": "0644"}, "entry 1 (/x): state: absent takes dest alone"),
    ({"dest": "/x", "state": "link"}, "entry 1 (/x): state must be file, directory or absent"),
    ({"src": "app.conf.j2", "dest": "/x", "owner": "root", "group": "root", "mode": "0644", "backup": True},
     "entry 1 (/x): unsupported backup"),
    ({"dest": "/x", "owner": "root", "group": "root", "mode": "0644"}, "entry 1 (/x): give exactly one of src and content"),
    ({"src": "a", "content": "b", "dest": "/x", "owner": "root", "group": "root", "mode": "0644"},
     "entry 1 (/x): give exactly one of src and content"),
    ({"src": "a", "dest": "/x", "state": "directory", "owner": "root", "group": "root", "mode": "0755"},
     "entry 1 (/x): give exactly one of src and content"),
    ({"content": "a", "remote_src": True, "dest": "/x", "owner": "root", "group": "root", "mode": "0644"},
     "entry 1 (/x): remote_src copies src as it is"),
])
def test_files_refuse_a_bad_entry_before_anything_changes(tmp_path: Path, entry: dict[str, Any], message: str) -> None:
    result = run(tmp_path, [{"name": "Bad", "labctl_template": {"files": [entry]}}])
    assert result.returncode != 0 and message in result.stdout, result.stdout[-2000:]


def test_file_state_says_not_current_when_unsure(tmp_path: Path) -> None:
    import hashlib
    target = tmp_path / "f"
    target.write_text("x")
    os.chmod(target, 0o640)
    sha = hashlib.sha1(b"x").hexdigest()
    want = {"path": str(target), "checksum": sha, "owner": "root", "group": "root", "mode": "0640"}
    assert labctl_file_state.path_state(want, False)["current"] is True
    assert labctl_file_state.path_state({**want, "mode": 0o640}, False)["current"] is True
    assert labctl_file_state.path_state({**want, "mode": "u=rw,g=r"}, False)["reason"] == "mode"
    assert labctl_file_state.path_state({**want, "owner": "no-such-user"}, False)["reason"] == "owner"
    assert labctl_file_state.path_state({**want, "checksum": "0" * 40}, False)["reason"] == "content"
    assert labctl_file_state.path_state(want, True)["reason"] == "selinux"
    link = tmp_path / "l"
    link.symlink_to(target)
    assert labctl_file_state.path_state({**want, "path": str(link)}, False)["reason"] == "not a regular file"
    assert labctl_file_state.path_state({**want, "path": str(tmp_path / "none")}, False)["reason"] == "missing"
    assert labctl_file_state.path_state({"path": str(tmp_path), "state": "directory"}, False)["current"] is True
    assert labctl_file_state.path_state({"path": str(target), "state": "directory"}, False)["current"] is False
    assert labctl_file_state.path_state({"path": str(tmp_path / "none"), "state": "absent"}, False)["current"]
    assert labctl_file_state.path_state({"path": str(link), "state": "absent"}, False)["reason"] == "present"
    target.unlink()
    assert labctl_file_state.path_state({"path": str(link), "state": "absent"}, False)["reason"] == "present", \
        "a dangling link is still something at that path"


def test_documentation_parses_for_ansible_doc(tmp_path: Path) -> None:
    env = dict(os.environ, ANSIBLE_HOME=str(tmp_path / ".ansible"))
    out = subprocess.run([str(BIN / "ansible-doc"), "-M", str(REPO / "library"), "-j", "labctl_template",
                          "labctl_directories", "labctl_file_state"], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr
    docs = json.loads(out.stdout)
    assert {"src", "content", "dest", "owner", "group", "mode", "validate", "backup",
            "variable_start_string", "files"} <= set(docs["labctl_template"]["doc"]["options"])
    # what the action accepts in an entry is what the documentation lists (ansible-lint checks tasks with it)
    spec = importlib.util.spec_from_file_location("labctl_template_action", REPO / "action_plugins" / "labctl_template.py")
    assert spec and spec.loader
    action = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(action)
    assert set(docs["labctl_template"]["doc"]["options"]["files"]["suboptions"]) == set(action.ENTRY_ARGS)
    assert set(docs["labctl_directories"]["doc"]["options"]["directories"]["suboptions"]) == {"path", "owner", "group", "mode"}
    assert docs["labctl_file_state"]["doc"]["options"]["files"]["suboptions"]["state"]["choices"] == [
        "file", "directory", "absent"]
    assert set(docs["labctl_file_state"]["doc"]["options"]["files"]["suboptions"]) == {
        "path", "state", "checksum", "same_as", "owner", "group", "mode"}


def _filters() -> ModuleType:
    spec = importlib.util.spec_from_file_location("labctl_filters_each", REPO / "filter_plugins" / "labctl_filters.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_makes_one_entry_per_item() -> None:
    each = _filters().labctl_each
    plan = [{"index": 0, "port": 8000}, {"index": 1, "port": 8001}]
    entries = each(plan, "__replica", src="r.j2", dest="/etc/x/replica-{item[index]}.yaml", owner="root",
                   group="vllm", mode="0640")
    assert [e["dest"] for e in entries] == ["/etc/x/replica-0.yaml", "/etc/x/replica-1.yaml"]
    assert entries[1]["vars"] == {"__replica": plan[1]} and entries[0]["src"] == "r.j2"
    assert each(["a", "b"], "name", dest="/d/{item}.yaml")[1]["dest"] == "/d/b.yaml"
    assert each(["a"], "name", src="t/{item}.yaml.j2", dest="/d/{item}.yaml")[0]["src"] == "t/a.yaml.j2"
    assert each([], "name", dest="/d/{item}") == []
    from ansible.errors import AnsibleFilterError
    assert [e["content"] for e in each(["a", "b"], "n", contents=["A", "B"], dest="/d/{item}")] == ["A", "B"]
    with pytest.raises(AnsibleFilterError, match="contents must be a list of 2 texts"):
        each(["a", "b"], "n", contents=["A"], dest="/d/{item}")
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError, match="does not fit the item"):
        each(plan, "r", dest="/d/{item[name]}")
    with pytest.raises(AnsibleFilterError, match="not a valid name"):
        each(plan, "not a name", dest="/d/{item}")
