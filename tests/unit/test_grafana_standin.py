"""The Grafana stand-in (tests/fixtures/grafana) is at least as strict as Grafana, and the grafana
role's own checks pass against it with the role's settings and provisioning files.

The stand-in runs here as a process on 127.0.0.1 (a free port) in a tmp layout like the package's:
its conf/defaults.ini and sample.ini, the role's templates rendered into the provisioning
directories, the role's dashboards, a CA and a server certificate made here.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .test_dashboards import GRAFANA_ROLE, _environment, role_vars

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "grafana"
STANDIN = FIXTURE / "standin"
sys.path.insert(0, str(STANDIN))

import gfsettings  # noqa: E402
import gfyaml  # noqa: E402

BIN = Path(sys.executable).parent
PASSWORD = "unit-admin-password-0123456789"
SECRET_KEY = "unit-secret-key-abcdefghijklmnopqrstuvwxyz"
# Off in the lab (grafana.env.j2): set here too where a test does not look at the phone-home.
QUIET = {"GF_ANALYTICS_REPORTING_ENABLED": "false", "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
         "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false", "GF_PLUGINS_PREINSTALL_DISABLED": "true"}


# --- a CA and a server certificate for 127.0.0.1 -----------------------------------------------


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None, signer: ec.EllipticCurvePrivateKey,
          ca: bool) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                                     x509.DNSName("localhost")]), critical=False)
    return builder.sign(signer, hashes.SHA256())


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory like the tls role's: ca.crt, server.crt, server.key."""
    out = tmp_path_factory.mktemp("tls")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert("unit test CA", ca_key, None, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    server = _cert("localhost", key, ca.subject, ca_key, ca=False)
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (out / "server.crt").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (out / "server.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the role's files, rendered as Ansible would ----------------------------------------------


def _render(template: str, **overrides: Any) -> str:
    context = {**role_vars(GRAFANA_ROLE), "ansible_managed": "Ansible managed",
               "__grafana_tls_cert": {"stat": {"checksum": "0" * 40}}, **overrides}
    env = _environment()
    env.filters["bool"] = lambda value: value if isinstance(value, bool) else str(value).lower() in ("true", "yes", "1", "on")
    return env.from_string((GRAFANA_ROLE / "templates" / template).read_text()).render(context)


def _env_file(text: str) -> dict[str, str]:
    """systemd EnvironmentFile= lines (KEY=VALUE, # comments)."""
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


# --- running the stand-in ----------------------------------------------------------------------


@dataclass
class Grafana:
    root: Path
    port: int
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None

    @property
    def provisioning(self) -> Path:
        return self.root / "provisioning"

    @property
    def dashboards(self) -> Path:
        return self.root / "dashboards"

    def start(self, wait: bool = True) -> subprocess.CompletedProcess[str] | None:
        """Start; None once it listens, or the finished process when it exits first."""
        cmd = [sys.executable, str(STANDIN / "grafana.py"), "server", f"--homepath={self.root / 'home'}",
               f"--config={self.root / 'grafana.ini'}", f"--pidfile={self.root / 'run' / 'grafana-server.pid'}",
               "--packaging=deb", f"cfg:default.paths.logs={self.root / 'log'}", f"cfg:default.paths.data={self.root / 'data'}",
               f"cfg:default.paths.plugins={self.root / 'plugins'}", f"cfg:default.paths.provisioning={self.provisioning}",
               *self.args]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOSTNAME": "unit", **self.env}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read() if self.proc.stdout else ""
                return subprocess.CompletedProcess(cmd, self.proc.returncode, out, "")
            if wait and (self.root / "run" / "grafana-server.pid").exists():
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    return None
                except OSError:
                    pass
            time.sleep(0.05)
        raise AssertionError("the stand-in neither listened nor exited within 30 s")

    def stop(self) -> str:
        assert self.proc is not None
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=20)
        assert self.proc.returncode == 0, out
        (self.root / "run" / "grafana-server.pid").unlink(missing_ok=True)
        return out

    def failed_start(self) -> str:
        result = self.start()
        assert result is not None, "the stand-in started"
        assert result.returncode == 1, result.stdout
        return result.stdout

    def url(self, path: str) -> str:
        scheme = "https" if self.env.get("GF_SERVER_PROTOCOL") == "https" else "http"
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def request(self, path: str, user: str | None = "admin", password: str = PASSWORD, body: dict[str, Any] | None = None,
                cafile: Path | None = None) -> tuple[int, dict[str, str], Any]:
        headers = {"Content-Type": "application/json"}
        if user is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        data = json.dumps(body).encode() if body is not None else None
        context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        try:
            with urllib.request.urlopen(urllib.request.Request(self.url(path), data=data, headers=headers), timeout=10,
                                        context=context) as response:
                return response.status, dict(response.headers), json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, dict(exc.headers), json.loads(raw)
            except ValueError:
                return exc.code, dict(exc.headers), raw.decode()


def _layout(root: Path, port: int, tls_dir: Path | None) -> Grafana:
    """The package's home, the role's provisioning files and dashboards, the role's GF_* settings."""
    shutil.copytree(FIXTURE / "package" / "conf", root / "home" / "conf")
    shutil.copy(FIXTURE / "package" / "conf" / "sample.ini", root / "grafana.ini")
    for kind in ("datasources", "dashboards"):
        (root / "provisioning" / kind).mkdir(parents=True)
        shutil.copy(FIXTURE / "package" / "conf" / "provisioning" / kind / "sample.yaml", root / "provisioning" / kind)
    (root / "dashboards").mkdir()
    overrides: dict[str, Any] = {"grafana_port": port, "grafana_dashboards_dir": str(root / "dashboards"),
                                 "grafana_admin_password": PASSWORD, "grafana_secret_key": SECRET_KEY,
                                 "grafana_listen_address": "127.0.0.1", "grafana_tls_enabled": tls_dir is not None,
                                 "grafana_tls_dir": str(tls_dir or "")}
    for name in ("datasources/labctl.yaml", "dashboards/labctl.yaml"):
        (root / "provisioning" / name).write_text(_render(f"provisioning/{name}.j2", **overrides))
    for dashboard in sorted((GRAFANA_ROLE / "files" / "dashboards").glob("*.json")):
        shutil.copy(dashboard, root / "dashboards")
    env = _env_file(_render("grafana.env.j2", **overrides))
    return Grafana(root, port, env)


@pytest.fixture
def lab(tmp_path: Path, tls: Path) -> Iterator[Grafana]:
    """The stand-in with everything the role writes (HTTPS with the test CA's certificate)."""
    grafana = _layout(tmp_path, _free_port(), tls)
    yield grafana
    if grafana.proc and grafana.proc.poll() is None:
        grafana.proc.kill()
        grafana.proc.wait()


def _datasources(grafana: Grafana, text: str) -> None:
    (grafana.provisioning / "datasources" / "labctl.yaml").write_text(text)


PROMETHEUS = """apiVersion: 1
datasources:
  - name: Prometheus
    uid: labctl-prometheus
    type: prometheus
    access: proxy
    url: http://127.0.0.1:9090
    isDefault: true
    editable: false
"""


# --- what the stand-in refuses, as Grafana does or more strictly ---------------------------------


def test_the_labs_settings_and_files_start_it(lab: Grafana) -> None:
    assert lab.start() is None
    out = lab.stop()
    assert "HTTP Server Listen" in out and "protocol=https" in out
    # Secrets are redacted in the log as Grafana redacts them.
    assert PASSWORD not in out and SECRET_KEY not in out and "GF_SECURITY_SECRET_KEY=*********" in out


@pytest.mark.parametrize(("change", "expected"), [
    (("type: prometheus", "type: prometheus-typo"), "data source type 'prometheus-typo' is no plugin"),
    (("editable: false", "editable: yes"), "strconv.ParseBool: parsing 'yes': invalid syntax"),
    (("isDefault: true", "isDefualt: true"), "unknown key(s) isDefualt"),
    (("    uid: labctl-prometheus\n", ""), "no uid (Grafana would generate a random one"),
    (("uid: labctl-prometheus", "uid: labctl/prometheus"), "invalid datasource uid"),
    (("access: proxy", "access: browser"), "access 'browser' is neither proxy nor direct"),
    (("apiVersion: 1", "apiVersion: 2"), "apiVersion must be 1"),
    (("url: http://127.0.0.1:9090", "url: 127.0.0.1:9090"), "is no http(s) URL"),
])
def test_a_datasource_grafana_cannot_use_stops_the_start(lab: Grafana, change: tuple[str, str], expected: str) -> None:
    assert change[0] in PROMETHEUS
    _datasources(lab, PROMETHEUS.replace(*change))
    out = lab.failed_start()
    assert "Datasource provisioning error:" in out and expected in out, out


def test_the_same_datasource_uid_twice_is_grafanas_error(lab: Grafana) -> None:
    _datasources(lab, PROMETHEUS)
    (lab.provisioning / "datasources" / "other.yaml").write_text(
        PROMETHEUS.replace("name: Prometheus", "name: Other").replace("isDefault: true", "isDefault: false"))
    out = lab.failed_start()
    assert "Datasource provisioning error:" in out and "data source with the same uid already exists" in out, out


def test_two_default_datasources_are_grafanas_error(lab: Grafana) -> None:
    _datasources(lab, PROMETHEUS)
    (lab.provisioning / "datasources" / "other.yaml").write_text(
        PROMETHEUS.replace("name: Prometheus", "name: Other").replace("uid: labctl-prometheus", "uid: other"))
    out = lab.failed_start()
    assert "datasource.yaml config is invalid. Only one datasource per organization can be marked as default" in out, out


def test_the_same_datasource_name_twice_is_refused(lab: Grafana) -> None:
    _datasources(lab, PROMETHEUS)
    (lab.provisioning / "datasources" / "other.yaml").write_text(
        PROMETHEUS.replace("uid: labctl-prometheus", "uid: other").replace("isDefault: true", "isDefault: false"))
    assert "is provisioned twice" in lab.failed_start()


def _dashboard(lab: Grafana, name: str = "labctl-vllm.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((lab.dashboards / name).read_text())
    return data


@pytest.mark.parametrize(("edit", "expected"), [
    (lambda d: d.pop("uid"), "has no uid"),
    (lambda d: d.update(uid=""), "has no uid"),
    (lambda d: d.pop("title"), "Dashboard title cannot be empty"),
    (lambda d: d.update(title="   "), "Dashboard title cannot be empty"),
    (lambda d: d.update(uid="x" * 41), "uid too long, max 40 characters"),
    (lambda d: d.update(uid="labctl vllm"), "uid contains illegal characters"),
    (lambda d: d.update(uid="labctl-gateway"), "the same UID is used more than once"),
    (lambda d: d.update(title="LiteLLM gateway"), "A dashboard with the same name in the folder already exists"),
    (lambda d: d["panels"][0].update(datasource={"type": "prometheus", "uid": "gone"}), "datasource uid 'gone', which is not provisioned"),
])
def test_a_dashboard_grafana_would_skip_stops_the_start(lab: Grafana, edit: Any, expected: str) -> None:
    data = _dashboard(lab)
    edit(data)
    (lab.dashboards / "labctl-vllm.json").write_text(json.dumps(data))
    out = lab.failed_start()
    assert "Failed to provision dashboard" in out and expected in out, out


def test_a_dashboard_file_that_is_no_json_stops_the_start(lab: Grafana) -> None:
    (lab.dashboards / "broken.json").write_text('{"uid": "x",')
    assert "failed to load dashboard from" in lab.failed_start()


def test_the_providers_path_must_be_a_directory(lab: Grafana) -> None:
    shutil.rmtree(lab.dashboards)
    assert "is no directory" in lab.failed_start()


@pytest.mark.parametrize(("variable", "expected"), [
    ("GF_SECURITY_ADMIN_PASWORD", "GF_SECURITY_ADMIN_PASWORD: no such setting"),
    ("GF_SERVER_PROTOCOLL", "GF_SERVER_PROTOCOLL: no such setting"),
])
def test_a_gf_variable_grafana_would_ignore_stops_the_start(lab: Grafana, variable: str, expected: str) -> None:
    lab.env[variable] = "x"
    assert expected in lab.failed_start()


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("GF_SERVER_CERT_FILE", "", "cert_file cannot be empty when using HTTPS"),
    ("GF_SERVER_CERT_KEY", "/nonexistent/server.key", 'cannot find SSL key_file at "/nonexistent/server.key"'),
    ("GF_SERVER_PROTOCOL", "h2", 'invalid protocol "h2"'),
])
def test_https_needs_its_certificate_and_key(lab: Grafana, variable: str, value: str, expected: str) -> None:
    if value:
        lab.env[variable] = value
    else:
        lab.env.pop(variable)
    assert expected in lab.failed_start()


def test_a_key_that_does_not_match_the_certificate_stops_the_start(lab: Grafana, tmp_path: Path) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "other.key").write_bytes(other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    lab.env["GF_SERVER_CERT_KEY"] = str(tmp_path / "other.key")
    assert "could not load SSL certificate" in lab.failed_start()


# --- what it serves -------------------------------------------------------------------------------


def test_https_only_with_the_configured_certificate(lab: Grafana, tls: Path) -> None:
    assert lab.start() is None
    assert lab.request("/api/health", user=None, cafile=tls / "ca.crt")[0] == 200
    served = ssl.get_server_certificate(("127.0.0.1", lab.port))
    assert x509.load_pem_x509_certificate(served.encode()) == x509.load_pem_x509_certificate((tls / "server.crt").read_bytes())
    # Plain HTTP on the port: Go's answer; an untrusting client fails the handshake.
    with socket.create_connection(("127.0.0.1", lab.port), timeout=5) as sock:
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = sock.recv(4096)
    assert answer == b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(lab.url("/api/health"), timeout=5, context=ssl.create_default_context())
    lab.stop()


def test_http_when_the_settings_say_http(lab: Grafana) -> None:
    for key in ("GF_SERVER_PROTOCOL", "GF_SERVER_CERT_FILE", "GF_SERVER_CERT_KEY"):
        lab.env.pop(key)
    assert lab.start() is None
    status, _, health = lab.request("/api/health", user=None)
    assert status == 200 and health["database"] == "ok" and set(health) == {"commit", "database", "version"}
    with pytest.raises((ssl.SSLError, OSError)):
        ssl.get_server_certificate(("127.0.0.1", lab.port), timeout=5)
    lab.stop()


def test_the_admin_password_is_enforced_with_grafanas_answers(lab: Grafana, tls: Path) -> None:
    ca = tls / "ca.crt"
    assert lab.start() is None
    assert lab.request("/api/datasources/uid/labctl-prometheus", cafile=ca)[0] == 200
    refused = {"message": "Invalid username or password", "messageId": "password-auth.failed", "statusCode": 401, "traceID": ""}
    assert lab.request("/api/datasources/uid/labctl-prometheus", password="wrong", cafile=ca)[::2] == (401, refused)
    assert lab.request("/api/search", user=None, cafile=ca)[0] == 401  # no anonymous access (GF_AUTH_ANONYMOUS_ENABLED)
    # Brute-force protection: after 5 failures in 5 minutes the right password is refused too.
    for _ in range(4):
        lab.request("/api/search", password="wrong", cafile=ca)
    status, _, body = lab.request("/api/search", cafile=ca)
    assert (status, body["messageId"]) == (401, "login-attempt.blocked")
    lab.stop()


def test_the_admin_password_applies_at_the_first_start_only(lab: Grafana, tls: Path) -> None:
    ca = tls / "ca.crt"
    assert lab.start() is None
    lab.stop()
    lab.env["GF_SECURITY_ADMIN_PASSWORD"] = "another-password-0123456789"
    assert lab.start() is None
    assert lab.request("/api/search", password="another-password-0123456789", cafile=ca)[0] == 401
    assert lab.request("/api/search", cafile=ca)[0] == 200
    lab.stop()
    reset = subprocess.run([sys.executable, str(STANDIN / "grafana.py"), "cli", f"--homepath={lab.root / 'home'}",
                            f"--config={lab.root / 'grafana.ini'}", f"--configOverrides=cfg:default.paths.data={lab.root / 'data'}",
                            "admin", "reset-admin-password", "reset-password-0123456789"],
                           env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, check=False)
    assert reset.returncode == 0, reset.stderr
    assert lab.start() is None
    assert lab.request("/api/search", password="reset-password-0123456789", cafile=ca)[0] == 200
    lab.stop()


@pytest.mark.parametrize("secure", [True, False])
def test_the_session_cookie_is_secure_when_cookie_secure(lab: Grafana, tls: Path, secure: bool) -> None:
    if not secure:
        lab.env.pop("GF_SECURITY_COOKIE_SECURE", None)
    assert lab.start() is None
    status, headers, body = lab.request("/login", user=None, body={"user": "admin", "password": PASSWORD}, cafile=tls / "ca.crt")
    assert (status, body) == (200, {"message": "Logged in", "redirectUrl": "/"})
    cookie = headers["Set-Cookie"]
    assert cookie.startswith("grafana_session=") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert ("; Secure" in cookie) is secure, cookie
    lab.stop()


def test_the_api_answers_in_grafanas_shapes(lab: Grafana, tls: Path) -> None:
    ca = tls / "ca.crt"
    assert lab.start() is None
    status, _, ds = lab.request("/api/datasources/uid/labctl-prometheus", cafile=ca)
    assert status == 200
    assert set(ds) == {"id", "uid", "orgId", "name", "type", "typeLogoUrl", "access", "url", "user", "database", "basicAuth",
                       "basicAuthUser", "withCredentials", "isDefault", "jsonData", "secureJsonFields", "version",
                       "readOnly", "apiVersion"}
    assert (ds["type"], ds["url"], ds["isDefault"], ds["readOnly"], ds["jsonData"]["timeInterval"]) == \
        ("prometheus", "http://127.0.0.1:9090", True, True, "5s")
    assert lab.request("/api/datasources/uid/nope", cafile=ca)[::2] == (404, {"message": "Data source not found"})
    uids = {d.stem: _dashboard(lab, d.name)["uid"] for d in lab.dashboards.glob("*.json")}
    status, _, hits = lab.request("/api/search?type=dash-db", cafile=ca)
    assert status == 200 and sorted(h["uid"] for h in hits) == sorted(uids.values())
    assert {h["type"] for h in hits} == {"dash-db"} and {h["folderTitle"] for h in hits} == {"LLM service"}
    assert [h["title"] for h in hits] == sorted((h["title"] for h in hits), key=str.lower)
    status, _, folders = lab.request("/api/search?type=dash-folder", cafile=ca)
    assert [f["title"] for f in folders] == ["LLM service"] and folders[0]["uid"] == hits[0]["folderUid"]
    assert [h["uid"] for h in lab.request("/api/search?query=vllm", cafile=ca)[2]] == ["labctl-vllm"]
    for name, uid in uids.items():
        status, _, body = lab.request(f"/api/dashboards/uid/{uid}", cafile=ca)
        assert status == 200 and body["dashboard"]["uid"] == uid and body["dashboard"]["title"] == _dashboard(lab, name + ".json")["title"]
        meta = body["meta"]
        assert meta["provisioned"] is True and meta["provisionedExternalId"] == name + ".json"
        assert meta["folderTitle"] == "LLM service" and meta["url"].startswith(f"/d/{uid}/") and isinstance(body["dashboard"]["id"], int)
    assert lab.request("/api/dashboards/uid/nope", cafile=ca)[::2] == (404, {"message": "Dashboard not found"})
    lab.stop()


def test_dashboard_files_are_read_again_and_a_bad_one_is_dropped(lab: Grafana, tls: Path) -> None:
    ca = tls / "ca.crt"
    provider = lab.provisioning / "dashboards" / "labctl.yaml"
    provider.write_text(provider.read_text().replace("updateIntervalSeconds: 30", "updateIntervalSeconds: 1"))
    assert lab.start() is None
    data = _dashboard(lab)
    data["title"] = "vLLM serving, renamed"
    (lab.dashboards / "labctl-vllm.json").write_text(json.dumps(data))
    deadline = time.monotonic() + 15
    while lab.request("/api/dashboards/uid/labctl-vllm", cafile=ca)[2]["dashboard"]["title"] != data["title"]:
        assert time.monotonic() < deadline, "the changed file was not read again"
        time.sleep(0.2)
    assert lab.request("/api/dashboards/uid/labctl-vllm", cafile=ca)[2]["meta"]["version"] == 2
    data.pop("title")
    (lab.dashboards / "labctl-vllm.json").write_text(json.dumps(data))
    while lab.request("/api/dashboards/uid/labctl-vllm", cafile=ca)[0] != 404:
        assert time.monotonic() < deadline + 15, "a dashboard without a title is still served"
        time.sleep(0.2)
    assert "Dashboard title cannot be empty" in lab.stop()


def test_only_the_labs_settings_keep_it_from_phoning_home(lab: Grafana) -> None:
    assert lab.start() is None
    assert "contacting" not in lab.stop()
    for key in QUIET:
        lab.env.pop(key)
    assert lab.start() is None
    time.sleep(0.5)
    out = lab.stop()
    for host in ("stats.grafana.org", "raw.githubusercontent.com", "grafana.com"):
        assert f"contacting {host}" in out, out


# --- settings: Grafana's layers and override rules ----------------------------------------------


def _home(tmp_path: Path, custom: str) -> tuple[Path, Path]:
    home = tmp_path / "home"
    shutil.copytree(FIXTURE / "package" / "conf", home / "conf")
    (tmp_path / "grafana.ini").write_text(custom)
    return home, tmp_path / "grafana.ini"


def test_settings_layers_in_grafanas_order(tmp_path: Path) -> None:
    home, config = _home(tmp_path, "[server]\nhttp_port = 3001\nprotocol =\ndomain = lab ; an inline comment\n"
                                   "[security]\nadmin_password = \"\"\"p#ss;word\"\"\"\n[paths]\nlogs = /from/file\n")
    loaded = gfsettings.load(home, str(config), ["cfg:default.paths.logs=/from/cli-default", "cfg:paths.data=/from/cli",
                                                 "cfg:default.server.http_port=3002"],
                             {"GF_SERVER_HTTP_PORT": "3003", "GF_PATHS_DATA": "/from/env", "GF_AUTH_ANONYMOUS_ENABLED": "true",
                              "GF_SECURITY_DISABLE_GRAVATAR": "", "GF_DEFAULT_INSTANCE_NAME": "lab-1"})
    ini = loaded.ini
    assert ini.get("server", "http_port") == "3003"          # env over file over cfg:default
    assert ini.get("paths", "logs") == "/from/file"           # file over cfg:default
    assert ini.get("paths", "data") == "/from/cli"            # cfg: over env
    assert ini.get("server", "protocol") == "http"            # an empty value in the file is skipped
    assert ini.get("server", "domain") == "lab"               # inline comment
    assert ini.get("security", "admin_password") == "p#ss;word"
    assert ini.bool("auth.anonymous", "enabled", False) is True   # [auth.anonymous] <- GF_AUTH_ANONYMOUS_ENABLED
    assert ini.get("security", "disable_gravatar") == "false"    # an empty variable is ignored
    assert ini.get("DEFAULT", "instance_name") == "lab-1"
    assert ini.get("server", "root_url") == "http://lab:3003/"   # %(key)s of the same section
    assert gfsettings.env_key("auth.anonymous", "enabled") == "GF_AUTH_ANONYMOUS_ENABLED"
    assert gfsettings.env_key("plugin.grafana-x", "a.b") == "GF_PLUGIN_GRAFANA_X_A_B"
    assert gfsettings.unknown_env_overrides(ini, {"GF_SERVER_HTTP_PORT": "1", "GF_SERVR_HTTP_PORT": "1"}) == ["GF_SERVR_HTTP_PORT"]
    assert "GF_SECURITY_ADMIN_PASSWORD=*********" in gfsettings.load(
        home, str(config), [], {"GF_SECURITY_ADMIN_PASSWORD": "x"}).env_applied


def test_settings_refuse_what_grafana_refuses(tmp_path: Path) -> None:
    home, config = _home(tmp_path, "[server]\nhttp_port\n")
    with pytest.raises(gfsettings.SettingsError, match="key-value delimiter not found"):
        gfsettings.load(home, str(config), [], {})
    with pytest.raises(gfsettings.SettingsError, match="Could not find config defaults"):
        gfsettings.load(tmp_path / "nowhere", None, [], {})
    home, config = _home(tmp_path / "b", "[server]\ndomain = $__vault{x}\n")
    with pytest.raises(gfsettings.SettingsError, match="could not find expander for __vault"):
        gfsettings.load(home, str(config), [], {})


@pytest.mark.parametrize(("text", "expected"), [
    ("a: 1\na: 2\n", 'mapping key "a" already defined at line 1'),
    ("a:\n\tb: 1\n", "tab character"),
    ("a: &x 1\n", "anchors are not read"),
    ("a: |\n  x\n", "block scalars are not read"),
    ("a: b\n  c\n", "plain scalar over several lines"),
    ("a: 1\n---\nb: 2\n", "a second YAML document"),
])
def test_the_yaml_reader_refuses_what_it_does_not_model(text: str, expected: str) -> None:
    with pytest.raises(gfyaml.YamlError, match=expected):
        gfyaml.load(text)


def test_the_yaml_reader_reads_the_roles_files_as_yaml_does() -> None:
    import yaml

    for name in ("datasources/labctl.yaml", "dashboards/labctl.yaml"):
        text = _render(f"provisioning/{name}.j2")
        assert gfyaml.plain(gfyaml.load(text)) == yaml.safe_load(text), name


# --- the package ------------------------------------------------------------------------------------


def test_the_package_has_grafanas_name_layout_unit_and_dependencies(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(FIXTURE / "build.py")], capture_output=True, text=True, check=True).stdout.strip()
    deb = next(Path(out).glob("grafana_*_amd64.deb"))
    info = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line and not line.startswith(" "))
    assert (fields["Package"], fields["Version"], fields["Architecture"]) == ("grafana", "12.4.2", "amd64")
    assert fields["Depends"] == "adduser, libfontconfig1, musl, python3" and "Test double" in info
    subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path)], check=True)
    for path in ("usr/share/grafana/bin/grafana", "usr/share/grafana/conf/defaults.ini", "usr/share/grafana/conf/sample.ini",
                 "etc/default/grafana-server", "lib/systemd/system/grafana-server.service", "usr/sbin/grafana-server"):
        assert (tmp_path / path).exists(), path
    unit = (tmp_path / "lib/systemd/system/grafana-server.service").read_text()
    assert "EnvironmentFile=/etc/default/grafana-server" in unit and "User=grafana" in unit
    assert "ExecStart=/usr/share/grafana/bin/grafana server" in unit and "cfg:default.paths.provisioning=${PROVISIONING_CFG_DIR}" in unit
    assert "PROVISIONING_CFG_DIR=/etc/grafana/provisioning" in (tmp_path / "etc/default/grafana-server").read_text()
    control = subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "DEBIAN")], check=True)
    assert control.returncode == 0 and (tmp_path / "DEBIAN" / "conffiles").read_text() == "/etc/default/grafana-server\n"


# --- the role's own checks against the stand-in ----------------------------------------------------


def _check_play(tmp_path: Path, grafana: Grafana, tls_dir: Path | None, timeout: int = 10) -> subprocess.CompletedProcess[str]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "check.yml"
    playbook.write_text(
        "- name: The grafana role's checks on this machine\n  hosts: localhost\n  connection: local\n  gather_facts: false\n"
        "  tasks:\n    - name: Check\n      ansible.builtin.import_role:\n        name: grafana\n        tasks_from: check.yml\n")
    args = {"grafana_port": grafana.port, "grafana_tls_enabled": tls_dir is not None, "grafana_tls_dir": str(tls_dir or ""),
            "grafana_admin_password": PASSWORD, "grafana_listen_address": "127.0.0.1", "grafana_health_timeout": timeout,
            # The URL the provisioned datasource names (the lab's topology's Prometheus port; no topology play here).
            "grafana_prometheus_url": role_vars(GRAFANA_ROLE)["grafana_prometheus_url"],
            "ansible_python_interpreter": sys.executable}
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_LOCAL_TEMP=str(tmp_path / ".ansible-tmp"), ANSIBLE_HOME=str(tmp_path / ".ansible"))
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(playbook), "-e", json.dumps(args)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600, check=False)


def _tasks(stdout: str) -> dict[str, str]:
    """Each grafana task's first result line (ok, changed, skipping, fatal)."""
    results: dict[str, str] = {}
    for chunk in stdout.split("TASK [")[1:]:
        name, _, rest = chunk.partition("]")
        lines = [line for line in rest.splitlines() if line.split(":")[0] in ("ok", "changed", "skipping", "fatal")]
        results[name] = lines[0].split(":")[0] if lines else ""
    return results


CHECKS = ["grafana : Wait until Grafana answers", "grafana : Read the datasource as the admin",
          "grafana : Check that the datasource is provisioned", "grafana : Wait until Grafana serves every dashboard",
          "grafana : Check that every dashboard is served in its folder"]


def test_the_roles_checks_pass_over_https_with_the_lab_ca(lab: Grafana, tls: Path, tmp_path: Path) -> None:
    assert lab.start() is None
    result = _check_play(tmp_path, lab, tls)
    lab.stop()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    tasks = _tasks(result.stdout)
    assert all(tasks.get(name) == "ok" for name in CHECKS), tasks
    assert PASSWORD not in result.stdout + result.stderr


def test_the_roles_checks_fail_on_a_wrong_password_and_a_missing_dashboard(lab: Grafana, tls: Path, tmp_path: Path) -> None:
    lab.env["GF_SECURITY_ADMIN_PASSWORD"] = "the-first-start-had-another-one"
    (lab.dashboards / "labctl-gateway.json").unlink()
    assert lab.start() is None
    result = _check_play(tmp_path, lab, tls, timeout=2)
    assert result.returncode != 0
    assert "answered 401" in result.stdout and "wrong admin password" in result.stdout, result.stdout[-3000:]
    lab.stop()
    lab.env["GF_SECURITY_ADMIN_PASSWORD"] = PASSWORD
    shutil.rmtree(lab.root / "data")  # a first start again: the lab's password
    assert lab.start() is None
    result = _check_play(tmp_path / "again", lab, tls, timeout=2)
    lab.stop()
    assert result.returncode != 0 and "dashboards missing: labctl-gateway" in result.stdout, result.stdout[-3000:]


def test_the_roles_checks_speak_http_when_tls_is_off(tmp_path: Path) -> None:
    grafana = _layout(tmp_path / "g", _free_port(), None)
    try:
        assert "GF_SERVER_PROTOCOL" not in grafana.env and "GF_SECURITY_COOKIE_SECURE" not in grafana.env
        assert grafana.start() is None
        result = _check_play(tmp_path, grafana, None)
        grafana.stop()
        assert result.returncode == 0, result.stdout[-4000:]
    finally:
        if grafana.proc and grafana.proc.poll() is None:
            grafana.proc.kill()


def test_the_units_drop_in_takes_the_overrides() -> None:
    """grafana_unit_overrides become settings of the role's drop-in, after the settings file and
    the TLS group (systemd syntax for booleans)."""
    text = _render("unit-dropin.conf.j2", grafana_unit_overrides={"ProtectClock": False, "LimitNOFILE": 20000},
                   grafana_tls_enabled=True)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == ["[Service]", "EnvironmentFile=/etc/labctl/grafana/grafana.env", "SupplementaryGroups=labctl-tls",
                     "LimitNOFILE=20000", "ProtectClock=false"], lines
    assert [line for line in _render("unit-dropin.conf.j2", grafana_tls_enabled=False).splitlines()
            if line and not line.startswith("#")] == ["[Service]", "EnvironmentFile=/etc/labctl/grafana/grafana.env"]
