"""The light calls (Issue 31): labctl_read, labctl_stat and labctl_http, and the probes of the other
labctl actions, run as their module's file with the target's Python and no module wrapper
(action_plugins/labctl_read.py). On this machine (connection local): each answers exactly as the
builtin it stands in for (ansible.builtin.command, stat, uri, getent), the light path and the module
path give the same answers, the light path is the one taken, and a light call that cannot answer
goes the module's way."""

from __future__ import annotations

import base64
import grp
import http.server
import json
import os
import pwd
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .test_fast_probes import BIN, REPO, _load
from .tls_pki import Pki, make_pki

read_action = _load("labctl_read_action", REPO / "action_plugins" / "labctl_read.py")
filters = _load("labctl_filters_light", REPO / "filter_plugins" / "labctl_filters.py")


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *_: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        auth = "Basic " + base64.b64encode(b"reader:sekret").decode()
        answers: dict[str, tuple[int, str, bytes]] = {
            "/json": (200, "application/json", b'{"data": [{"id": "gpt-oss-120b"}]}'),
            "/text": (200, "text/plain; charset=utf-8", b"prometheus_config_last_reload_successful 1\n"),
            "/missing": (404, "text/plain", b"no such page"),
            "/auth": (200, "application/json", b'{"uid": "prometheus"}') if self.headers.get("Authorization") == auth
            else (401, "application/json", b'{"message": "Unauthorized"}'),
        }
        if self.path == "/old":
            self.send_response(302)
            self.send_header("Location", "/text")
            self.end_headers()
            return
        status, kind, body = answers.get(self.path, (500, "text/plain", b"?"))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


REFUSED_PORT = _closed_port()  # one for both runs: their answers name it


def _files(tmp_path: Path) -> Path:
    root = tmp_path / "files"
    (root / "dir").mkdir(parents=True)
    (root / "file").write_text("one\ntwo\n")
    (root / "file").chmod(0o640)
    (root / "link").symlink_to(root / "file")
    (root / "dangling").symlink_to(root / "nowhere")
    return root


READS: list[tuple[str, dict[str, Any]]] = [
    ("lines", {"argv": ["printf", "a\\nb\\n\\n"]}),
    ("fails", {"cmd": "sh -c 'echo out; echo err >&2; exit 3'"}),
    ("quoted", {"cmd": "printf '%s|' 'one two' three"}),
    ("stdin", {"cmd": "cat", "stdin": "AUTH x\nPING"}),
    ("missing", {"argv": ["/nonexistent/labctl-no-such-command"]}),
    ("locale", {"argv": ["sh", "-c", "echo $LC_ALL"]}),
]


# labctl_http never follows a redirect (its credentials would go along, Issue 40): uri's counterpart.
URI_ONLY: dict[str, dict[str, Any]] = {"redirect": {"follow_redirects": "none"}}


def _playbook(tmp_path: Path, base: str, root: Path) -> Path:
    """Each case as the labctl task and as the builtin it stands in for, results in one JSON file."""
    tasks: list[dict[str, Any]] = []
    for name, args in READS:
        tasks.append({"name": f"read {name}", "labctl_read": args, "register": f"read_{name}", "failed_when": False})
        if name != "locale":  # the builtin keeps the caller's locale
            tasks.append({"name": f"command {name}", "ansible.builtin.command": args, "register": f"command_{name}",
                          "failed_when": False})
    tasks.append({"name": "read ok_rc", "labctl_read": {"cmd": "sh -c 'exit 3'", "ok_rc": [0, 3]}, "register": "read_ok_rc"})
    stats: dict[str, dict[str, Any]] = {
             "file": {"path": f"{root}/file"}, "file256": {"path": f"{root}/file", "checksum_algorithm": "sha256"},
             "dir": {"path": f"{root}/dir"}, "link": {"path": f"{root}/link", "get_checksum": "no"},
             "dangling": {"path": f"{root}/dangling"}, "follow": {"path": f"{root}/link", "follow": True},
             "missing": {"path": f"{root}/missing"}}
    for name, args in stats.items():
        tasks.append({"name": f"labctl_stat {name}", "labctl_stat": args, "register": f"lstat_{name}"})
        tasks.append({"name": f"stat {name}", "ansible.builtin.stat": args, "register": f"stat_{name}"})
    refused = f"http://127.0.0.1:{REFUSED_PORT}/"
    gets: dict[str, dict[str, Any]] = {"json": {"url": f"{base}/json"}, "text": {"url": f"{base}/text", "return_content": True},
            "missing": {"url": f"{base}/missing", "status_code": [200, 404], "return_content": True},
            "wrong_status": {"url": f"{base}/missing"},
            "auth": {"url": f"{base}/auth", "url_username": "reader", "url_password": "sekret", "force_basic_auth": True},
            "no_auth": {"url": f"{base}/auth", "status_code": [200, 401]},
            "redirect": {"url": f"{base}/old", "return_content": True},
            "refused": {"url": refused}}
    for name, args in gets.items():
        tasks.append({"name": f"labctl_http {name}", "labctl_http": args, "register": f"http_{name}", "failed_when": False})
        tasks.append({"name": f"uri {name}", "ansible.builtin.uri": {**args, **URI_ONLY.get(name, {})}, "register": f"uri_{name}",
                      "failed_when": False})
    tasks.append({"name": "getent passwd", "labctl_read": {"argv": ["getent", "passwd"]}, "register": "read_passwd"})
    tasks.append({"name": "getent group", "labctl_read": {"argv": ["getent", "group"]}, "register": "read_group"})
    tasks.append({"name": "builtin passwd", "ansible.builtin.getent": {"database": "passwd"}})
    tasks.append({"name": "builtin group", "ansible.builtin.getent": {"database": "group"}})
    names = ([f"read_{n}" for n, _ in READS] + [f"command_{n}" for n, _ in READS if n != "locale"] + ["read_ok_rc"]
             + [f"{p}_{n}" for n in stats for p in ("lstat", "stat")] + [f"{p}_{n}" for n in gets for p in ("http", "uri")])
    pairs = [f"'{n}': {n}" for n in names] + [
        "'passwd': read_passwd.stdout | labctl_getent", "'group': read_group.stdout | labctl_getent",
        "'getent_passwd': ansible_facts.getent_passwd", "'getent_group': ansible_facts.getent_group"]
    results = "{" + ", ".join(pairs) + "}"
    tasks.append({"name": "Keep the answers", "ansible.builtin.copy": {
        "content": "{{ " + results + " | to_json }}", "dest": str(tmp_path / "answers.json"), "mode": "0600"}})
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps([{"name": "Light calls", "hosts": "localhost", "connection": "local",
                                     "gather_facts": False, "tasks": tasks}]))
    return playbook


def _python_wrapper(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that logs how it is called: `-I -c` is the light call, a module comes on stdin."""
    log = tmp_path / "python-calls.log"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\necho \"$1 $2\" >> {log}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper, log


def _run(tmp_path: Path, playbook: Path, light: bool, python: Path) -> dict[str, Any]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"), ANSIBLE_HOME=str(tmp_path / ".ansible"),
               LABCTL_LIGHT="1" if light else "0", LANG="C.UTF-8")
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook),
                           "-e", json.dumps({"ansible_python_interpreter": str(python)})],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return dict(json.loads((tmp_path / "answers.json").read_text()))


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, server: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for light in (True, False):
        tmp_path = tmp_path_factory.mktemp("light" if light else "module")
        python, log = _python_wrapper(tmp_path)
        out["light" if light else "module"] = _run(tmp_path, _playbook(tmp_path, server, _files(tmp_path)), light, python)
        out["light" if light else "module"]["_calls"] = log.read_text().splitlines()
    return out


READ_KEYS = ("rc", "stdout", "stderr", "stdout_lines", "stderr_lines", "failed")


@pytest.mark.parametrize("case", [name for name, _ in READS if name != "locale"])
def test_labctl_read_answers_as_the_command_module(answers: dict[str, dict[str, Any]], case: str) -> None:
    for path in ("light", "module"):
        mine, builtin = answers[path][f"read_{case}"], answers[path][f"command_{case}"]
        assert {k: mine.get(k, False) for k in READ_KEYS} == {k: builtin.get(k, False) for k in READ_KEYS}, (path, mine, builtin)
    assert answers["light"][f"read_{case}"]["changed"] is False


def test_labctl_read_runs_in_the_c_locale_and_takes_other_exit_statuses(answers: dict[str, dict[str, Any]]) -> None:
    for path in ("light", "module"):
        assert answers[path]["read_locale"]["stdout"] == "C"
        assert answers[path]["read_ok_rc"]["rc"] == 3 and not answers[path]["read_ok_rc"].get("failed")
    assert answers["light"]["read_missing"]["msg"].startswith("Error executing command: [Errno 2]")


STAT_SKIP = ("atime",)  # reading a file for its checksum may move it


@pytest.mark.parametrize("case", ["file", "file256", "dir", "link", "dangling", "follow", "missing"])
def test_labctl_stat_answers_as_the_stat_module(answers: dict[str, dict[str, Any]], case: str) -> None:
    for path in ("light", "module"):
        mine, builtin = answers[path][f"lstat_{case}"]["stat"], answers[path][f"stat_{case}"]["stat"]
        assert set(mine) <= set(builtin), set(mine) - set(builtin)
        assert {k: v for k, v in mine.items() if k not in STAT_SKIP} == \
            {k: builtin[k] for k in mine if k not in STAT_SKIP}, (path, case)
    if case in ("file", "file256"):
        assert "checksum" in answers["light"][f"lstat_{case}"]["stat"]
    if case == "link":
        assert "checksum" not in answers["light"]["lstat_link"]["stat"]  # "no" taken as false, as the module does


HTTP_KEYS = ("status", "json", "content", "failed")


@pytest.mark.parametrize("case", ["json", "text", "missing", "wrong_status", "auth", "no_auth", "redirect", "refused"])
def test_labctl_http_answers_as_the_uri_module(answers: dict[str, dict[str, Any]], case: str) -> None:
    for path in ("light", "module"):
        mine, builtin = answers[path][f"http_{case}"], answers[path][f"uri_{case}"]
        assert {k: mine.get(k) for k in HTTP_KEYS} == {k: builtin.get(k) for k in HTTP_KEYS}, (path, mine, builtin)
        if not mine.get("failed"):
            assert mine["url"] == builtin["url"]


# --- no credentials across a redirect (Issue 40, item 7) ---------------------------------------------

http_module = _load("labctl_http_light", REPO / "library" / "labctl_http.py")


class _Recorder(http.server.ThreadingHTTPServer):
    """A server that records the Authorization of every request; with ``location``, /go answers 302 there."""

    def __init__(self, location: str | None = None, pki: Pki | None = None) -> None:
        self.location = location
        self.seen: list[str | None] = []
        super().__init__(("127.0.0.1", 0), _Recording)
        if pki is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(pki.cert, pki.key)
            self.socket = context.wrap_socket(self.socket, server_side=True)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _Recording(http.server.BaseHTTPRequestHandler):
    server: _Recorder

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append(self.headers.get("Authorization"))
        if self.server.location and self.path == "/go":
            self.send_response(302)
            self.send_header("Location", self.server.location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


BEARER = {"headers": {"Authorization": "Bearer sk-master"}}
BASIC = {"url_username": "admin", "url_password": "grafana-admin-password", "force_basic_auth": True}


@pytest.mark.parametrize("target", ["http://localhost:{port}/landing", "http://127.0.0.1:{port}/landing", "/landing"])
@pytest.mark.parametrize("auth", [BEARER, BASIC], ids=["bearer", "basic"])
def test_labctl_http_sends_its_credentials_to_the_url_asked_only(auth: dict[str, Any], target: str) -> None:
    """The master key (Bearer) and Grafana's admin password (basic) reach the service asked and no
    redirect's target: another host name, another port, or the same server. The 302 is the answer."""
    elsewhere = _Recorder()
    first = _Recorder(target.format(port=elsewhere.port) if "{port}" in target else target)
    try:
        answer = http_module.light({"url": f"http://127.0.0.1:{first.port}/go", **auth})
    finally:
        first.shutdown()
        elsewhere.shutdown()
    assert first.seen[0] is not None and first.seen[0].startswith(("Bearer ", "Basic "))
    assert elsewhere.seen == [] and first.seen[1:] == [], (first.seen, elsewhere.seen)
    assert answer["status"] == 302 and answer["failed"] and answer["url"] == f"http://127.0.0.1:{first.port}/go"


def test_labctl_http_sends_no_credentials_from_https_down_to_http(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    elsewhere = _Recorder()
    first = _Recorder(f"http://127.0.0.1:{elsewhere.port}/landing", pki)
    try:
        answer = http_module.light({"url": f"https://127.0.0.1:{first.port}/go", "ca_path": str(pki.ca),
                                    "status_code": [302], **BEARER})
    finally:
        first.shutdown()
        elsewhere.shutdown()
    assert first.seen == ["Bearer sk-master"]
    assert elsewhere.seen == [], elsewhere.seen
    assert answer["status"] == 302 and not answer.get("failed")


def test_labctl_getent_reads_getent_as_the_getent_module(answers: dict[str, dict[str, Any]]) -> None:
    for path in ("light", "module"):
        assert answers[path]["passwd"] == answers[path]["getent_passwd"]
        assert answers[path]["group"] == answers[path]["getent_group"]
    assert answers["light"]["passwd"]["root"][1] == "0"


# the module's own bookkeeping (and a failure failed_when turned into a result: 2.19 keeps its trace)
IGNORED = ("invocation", "stat", "elapsed", "failed_when_suppressed_exception")


def test_the_light_path_is_the_one_taken(answers: dict[str, dict[str, Any]]) -> None:
    """With the light calls on, every labctl read ran as `python -I -c` (one per task); with
    LABCTL_LIGHT=0 none did, and the same tasks ran as modules (through ansible's wrapper)."""
    light, module = answers["light"]["_calls"], answers["module"]["_calls"]
    labctl_tasks = len(READS) + 1 + 7 + 8 + 2
    assert light.count("-I -c") == labctl_tasks, light
    assert module.count("-I -c") == 0 and len(module) == len(light), module
    # every answer is the same either way (the module path checks its arguments itself)
    for key, value in answers["light"].items():
        if key.startswith(("read_", "lstat_", "http_")):
            want = {k: v for k, v in answers["module"][key].items() if k not in IGNORED}
            have = {k: v for k, v in value.items() if k not in IGNORED}
            assert have == want, key


# --- the probes of the other actions, light and as modules --------------------------------------

def _module_answer(tmp_path: Path, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The module run the ordinary way (a task naming it: no action plugin has these names)."""
    playbook = tmp_path / "probe.yml"
    playbook.write_text(json.dumps([{"name": "Probe", "hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": [{"name": "Probe", name: args, "register": "out"},
                                               {"name": "Keep", "ansible.builtin.copy": {
                                                   "content": "{{ out | to_json }}", "dest": str(tmp_path / "out.json"),
                                                   "mode": "0600"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / ".t"),
               ANSIBLE_HOME=str(tmp_path / ".a"))
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook),
                           "-e", json.dumps({"ansible_python_interpreter": sys.executable})],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:]
    answer = json.loads((tmp_path / "out.json").read_text())
    return {k: v for k, v in answer.items() if k not in ("invocation", "failed")}


def test_the_probes_answer_alike_light_and_as_modules(tmp_path: Path) -> None:
    root = _files(tmp_path)
    me = pwd.getpwuid(os.getuid()).pw_name
    group = grp.getgrgid(os.getgid()).gr_name
    import hashlib

    sha1 = hashlib.sha1((root / "file").read_bytes()).hexdigest()
    cases: list[tuple[str, dict[str, Any]]] = [
        ("labctl_file_state", {"files": [
            {"path": f"{root}/file", "checksum": sha1, "owner": me, "group": group, "mode": "0640"},
            {"path": f"{root}/file", "checksum": sha1, "mode": "0644"},
            {"path": f"{root}/file", "checksum": "0" * 40},
            {"path": f"{root}/copy", "same_as": f"{root}/file"},
            {"path": f"{root}/file", "same_as": f"{root}/file"},
            {"path": f"{root}/dir", "state": "directory", "owner": me},
            {"path": f"{root}/link", "checksum": sha1},
            {"path": f"{root}/gone", "state": "absent"},
            {"path": f"{root}/dangling", "state": "absent"}]}),
        ("labctl_package_state", {"names": ["bash", "dpkg=0.0-not-this", "labctl-no-such-package", "python3*"]}),
        ("labctl_account_state", {"group": group, "user": me, "home": pwd.getpwnam(me).pw_dir,
                                  "shell": pwd.getpwnam(me).pw_shell}),
        ("labctl_account_state", {"group": "labctl-no-such-group"}),
        ("labctl_unit_state", {"units": [{"name": "labctl-no-such.service", "started": True}]}),
    ]
    for name, args in cases:
        module = _load(name, REPO / "library" / f"{name}.py")
        light = module.light(json.loads(json.dumps(args)))
        assert light == _module_answer(tmp_path, name, args), name
    states = _load("labctl_file_state", REPO / "library" / "labctl_file_state.py").light(cases[0][1])["files"]
    assert [s["current"] for s in states] == [True, False, False, False, True, True, False, True, False]
    assert [s["reason"] for s in states if not s["current"]] == ["mode", "content", "missing", "not a regular file", "present"]


# --- the light call itself ------------------------------------------------------------------------

class _Loader:
    def find_plugin_with_context(self, name: str) -> Any:
        return type("Found", (), {"resolved": True, "plugin_resolved_path": str(REPO / "library" / f"{name}.py")})()


class _Action:
    """What light_call and probe use of an ActionBase: a connection that answers as given."""

    def __init__(self, rc: int, stdout: str) -> None:
        self.answer = {"rc": rc, "stdout": stdout, "stderr": ""}
        self.commands: list[tuple[str, bytes]] = []
        self.modules: list[str] = []
        self._shared_loader_obj = type("Shared", (), {"module_loader": _Loader()})()
        self._templar = type("Templar", (), {"template": staticmethod(lambda value: value)})()
        self._task = type("Task", (), {"delegate_to": None})()

    def _low_level_execute_command(self, cmd: str, sudoable: bool = True, in_data: bytes | None = None) -> dict[str, Any]:
        assert sudoable and in_data is not None
        self.commands.append((cmd, in_data))
        return self.answer

    def _execute_module(self, module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        self.modules.append(module_name)
        return {"from": "module"}


@pytest.mark.parametrize(("rc", "stdout", "light"), [
    (0, '\n{"current": true}', True),
    (0, 'motd from a login script\n\n{"current": true}', True),
    (127, "", False),  # no Python at that path
    (0, "not json", False),
    (0, "\n[1, 2]", False),
])
def test_a_light_call_that_cannot_answer_goes_the_module_way(rc: int, stdout: str, light: bool) -> None:
    action = _Action(rc, stdout)
    answer = read_action.probe(action, "labctl_account_state", {"group": "root"}, {"ansible_python_interpreter": "/opt/py3"})
    assert answer == ({"current": True} if light else {"from": "module"})
    assert action.modules == ([] if light else ["labctl_account_state"])
    command, data = action.commands[0]
    assert command.startswith("/opt/py3 -I -c ")
    sent = json.loads(data)
    assert sent["args"] == {"group": "root"} and sent["name"] == "labctl_account_state.py"
    assert "def light(" in sent["source"]


def test_the_interpreter_is_the_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    action = _Action(0, '\n{"ok": 1}')
    discovered = {"ansible_facts": {"discovered_interpreter_python": "/usr/bin/python3.12"}}
    read_action.probe(action, "labctl_read", {"argv": ["true"]}, discovered)
    read_action.probe(action, "labctl_read", {"argv": ["true"]}, {})
    assert [c.split()[0] for c, _ in action.commands] == ["/usr/bin/python3.12", "/usr/bin/python3"]
    # a delegated task runs where it is delegated: that host's interpreter
    action._task.delegate_to = "localhost"
    read_action.probe(action, "labctl_read", {"argv": ["true"]}, {
        "ansible_python_interpreter": "/usr/bin/python3", "ansible_delegated_vars": {
            "localhost": {"ansible_python_interpreter": "/opt/labctl/venv/bin/python"}}})
    assert action.commands[-1][0].split()[0] == "/opt/labctl/venv/bin/python"
    monkeypatch.setenv("LABCTL_LIGHT", "0")
    assert read_action.probe(action, "labctl_read", {"argv": ["true"]}, {}) == {"from": "module"}
    assert len(action.commands) == 3


LIGHT_SMOKE: dict[str, dict[str, Any]] = {
    "labctl_read": {"argv": ["true"]}, "labctl_stat": {"path": "/etc/hostname"},
    "labctl_http": {"url": f"http://127.0.0.1:{REFUSED_PORT}/"},
    "labctl_file_state": {"files": [{"path": "/etc/hostname", "checksum": "0" * 40}]},
    "labctl_unit_state": {"units": [{"name": "labctl-no-such.service"}]},
    "labctl_package_state": {"names": ["bash"]}, "labctl_account_state": {"group": "root"},
}


def test_every_light_module_runs_without_ansible() -> None:
    """What the light call sends (the module's file, the shared code it imports, the arguments), run
    by the bootstrap with the machine's own Python, which has no ansible: each module answers."""
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import ansible"], capture_output=True, check=False).returncode == 0:
        pytest.skip(f"{python} has ansible: it could not show that the light call needs none")
    for name, args in LIGHT_SMOKE.items():
        source = (REPO / "library" / f"{name}.py").read_text()
        utils = read_action._utils(name, source)
        data = json.dumps({"name": f"{name}.py", "source": source, "args": args, "utils": utils})
        done = subprocess.run([python, "-I", "-c", read_action.BOOT], input=data, capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0, (name, done.stderr)
        answer = json.loads(done.stdout.rpartition("\n")[2])
        assert isinstance(answer, dict) and answer.get("changed") is False, (name, answer)
    # the shared code the file and stat probes import travels with them, and only that
    assert set(read_action._utils("labctl_stat", (REPO / "library" / "labctl_stat.py").read_text())) == {
        "ansible.module_utils.labctl.sums"}
    assert read_action._utils("labctl_read", (REPO / "library" / "labctl_read.py").read_text()) == {}


def test_bad_arguments_stop_before_the_call(tmp_path: Path) -> None:
    playbook = tmp_path / "bad.yml"
    playbook.write_text(json.dumps([{"name": "Bad", "hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": [{"name": "Unknown", "labctl_stat": {"path": "/etc", "recurse": True}},
                                               ]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / ".t"),
               ANSIBLE_HOME=str(tmp_path / ".a"), ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert done.returncode != 0
    assert "labctl_stat: unsupported parameter(s) recurse" in done.stdout
    playbook.write_text(json.dumps([{"name": "Bad", "hosts": "localhost", "connection": "local", "gather_facts": False,
                                     "tasks": [{"name": "Type", "labctl_http": {"url": "http://x/", "timeout": "soon"}}]}]))
    done = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert done.returncode != 0 and "labctl_http: " in done.stdout and "timeout" in done.stdout


def test_getent_filter_shape() -> None:
    text = "root:x:0:0:root:/root:/bin/bash\nsvc:x:999:999::/var/lib/svc:/usr/sbin/nologin\nroot:x:5:5::/:/bin/sh\n\n"
    assert filters.labctl_getent(text) == {"root": ["x", "0", "0", "root", "/root", "/bin/bash"],
                                           "svc": ["x", "999", "999", "", "/var/lib/svc", "/usr/sbin/nologin"]}
    assert filters.labctl_getent("") == {} and filters.labctl_getent(None) == {}
