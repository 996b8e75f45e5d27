"""Grafana on the stack, as its users reach it: the grafana role installed the test bundle's
`grafana` package (the stand-in of tests/fixtures/grafana: Grafana's package, unit and default
file, a server as strict as Grafana inside), started grafana-server and checked it.

Every request runs inside the target (no curl there: Python), with the secrets read there from
the role's settings file: a command line would put them in the journal (test_stack_zz_final.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from typing import Any

from test_stack import CA_FILE, REPO, SECRETS_DIR  # the scenario's helpers (same directory)

GRAFANA = "https://127.0.0.1:3000"
ENV = "/etc/labctl/grafana/grafana.env"
DASHBOARDS = REPO / "roles" / "grafana" / "files" / "dashboards"

# Runs inside the target: argv[1] a JSON list of requests [path, auth, body]; auth "admin" is the
# admin account from the role's settings file, "wrong" a wrong password, null none. Prints a JSON
# list of [status, headers, body] (status 0: no HTTP answer).
_REQUESTS = r"""
import base64, json, ssl, sys, urllib.error, urllib.request
env = dict(l.rstrip("\n").split("=", 1) for l in open(%(env)r) if "=" in l and not l.startswith("#"))
out = []
for path, auth, body in json.loads(sys.argv[1]):
    url = path if "://" in path else %(base)r + path
    ctx = ssl.create_default_context(cafile=%(ca)r) if url.startswith("https") else None
    headers = {"Content-Type": "application/json"}
    if auth:
        password = env["GF_SECURITY_ADMIN_PASSWORD"] if auth == "admin" else "not-the-password"
        headers["Authorization"] = "Basic " + base64.b64encode(("admin:" + password).encode()).decode()
    if body == "login":
        body = {"user": "admin", "password": env["GF_SECURITY_ADMIN_PASSWORD"]}
    data = json.dumps(body).encode() if body is not None else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30, context=ctx) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    except Exception as e:
        status, hdrs, raw = 0, {}, repr(e).encode()
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = raw.decode(errors="replace")
    out.append([status, hdrs, parsed])
print(json.dumps(out))
""" % {"env": ENV, "base": GRAFANA, "ca": CA_FILE}


def _requests(host, *requests: tuple[str, str | None, object]) -> list[list]:
    code = subprocess.run(["docker", "exec", host.check_output("hostname"), "python3", "-c", _REQUESTS,
                           json.dumps([list(r) for r in requests])], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(code.stdout)


def _get(host, path: str, auth: str | None = "admin") -> tuple[int, Any]:
    status, _, body = _requests(host, (path, auth, None))[0]
    return status, body


def test_grafana_is_the_bundles_package_run_by_its_unit(host):
    """The package's unit with the role's drop-in, as the grafana user, HTTPS on every address."""
    package = host.package("grafana")
    assert package.is_installed and package.version == "12.4.2"
    assert "Test double" in host.check_output("dpkg-query -W -f '${Description}' grafana")
    service = host.service("grafana-server")
    assert service.is_enabled and service.is_running
    shown: dict[str, str] = {}
    for line in host.check_output("systemctl show grafana-server -p User -p EnvironmentFiles -p SupplementaryGroups"
                                  " -p ProtectSystem -p FragmentPath -p DropInPaths").splitlines():
        key, _, value = line.partition("=")
        shown[key] = (shown[key] + " " + value) if key in shown else value  # EnvironmentFiles: a line each
    assert shown["User"] == "grafana" and shown["ProtectSystem"] == "full", shown
    assert shown["FragmentPath"] == "/lib/systemd/system/grafana-server.service", shown
    assert "/etc/default/grafana-server" in shown["EnvironmentFiles"] and ENV in shown["EnvironmentFiles"], shown
    assert shown["SupplementaryGroups"] == "labctl-tls" and "90-labctl.conf" in shown["DropInPaths"], shown
    assert host.socket("tcp://0.0.0.0:3000").is_listening
    journal = host.check_output("journalctl -u grafana-server --no-pager -o cat")
    assert "level=error" not in journal, [line for line in journal.splitlines() if "level=error" in line][:5]
    assert "Config overridden from Environment variable\" var=GF_SERVER_PROTOCOL=https" in journal


def test_grafana_answers_over_https_with_the_lab_ca_and_not_over_plain_http(host):
    (status, _, health), (plain, _, text), (by_name, _, _) = _requests(
        host, ("/api/health", None, None), ("http://127.0.0.1:3000/api/health", None, None),
        ("https://localhost:3000/api/health", None, None))
    assert status == 200 and health["database"] == "ok", health
    # Plain HTTP on the port: Go's answer (Grafana's server), which the role's old check got.
    assert (plain, text) == (400, "Client sent an HTTP request to an HTTPS server.\n"), (plain, text)
    assert by_name == 200  # with the lab CA, by name too (the certificate names localhost)
    bare = host.run("python3 -c \"import urllib.request; urllib.request.urlopen('https://127.0.0.1:3000/api/health', timeout=10)\"")
    assert bare.rc != 0 and "CERTIFICATE_VERIFY_FAILED" in bare.stderr, bare.stderr[-500:]


def test_the_admin_password_is_the_generated_one_and_enforced(host):
    """The control node's generated password (the role's settings file holds it) opens the API, a
    wrong one gets Grafana's 401, no credentials get 401 (no anonymous access)."""
    generated = (SECRETS_DIR / "grafana-admin-password").read_text().split()[0]
    digest = host.check_output(f"sed -n 's/^GF_SECURITY_ADMIN_PASSWORD=//p' {ENV} | tr -d '\\n' | sha256sum | cut -c1-64")
    assert digest == hashlib.sha256(generated.encode()).hexdigest()
    (ok, _, _), (wrong, _, refused), (none, _, _) = _requests(
        host, ("/api/search", "admin", None), ("/api/search", "wrong", None), ("/api/search", None, None))
    assert ok == 200 and none == 401
    assert (wrong, refused) == (401, {"message": "Invalid username or password", "messageId": "password-auth.failed",
                                      "statusCode": 401, "traceID": ""})


def test_the_secret_key_is_generated_once_and_the_cookie_secure(host):
    generated = (SECRETS_DIR / "grafana-secret-key").read_text().split()[0]
    assert len(generated) >= 32 and oct((SECRETS_DIR / "grafana-secret-key").stat().st_mode & 0o777) == "0o600"
    digest = host.check_output(f"sed -n 's/^GF_SECURITY_SECRET_KEY=//p' {ENV} | tr -d '\\n' | sha256sum | cut -c1-64")
    assert digest == hashlib.sha256(generated.encode()).hexdigest()
    assert "GF_SECURITY_COOKIE_SECURE=true" in host.check_output(f"grep ^GF_SECURITY_COOKIE_SECURE= {ENV}")
    status, headers, body = _requests(host, ("/login", None, "login"))[0]
    assert (status, body) == (200, {"message": "Logged in", "redirectUrl": "/"})
    cookie = headers["Set-Cookie"]
    assert cookie.startswith("grafana_session=") and "; Secure" in cookie and "HttpOnly" in cookie, cookie


def test_the_datasource_by_uid_is_the_labs_prometheus(host):
    status, ds = _get(host, "/api/datasources/uid/labctl-prometheus")
    assert status == 200, ds
    assert (ds["name"], ds["type"], ds["url"], ds["access"], ds["isDefault"], ds["readOnly"]) == \
        ("Prometheus", "prometheus", "http://127.0.0.1:9090", "proxy", True, True), ds
    assert ds["jsonData"] == {"timeInterval": "5s", "httpMethod": "POST"}
    # The URL Grafana queries is the lab's Prometheus.
    ready = _requests(host, (ds["url"] + "/-/ready", None, None))[0]
    assert ready[0] == 200, ready
    assert _get(host, "/api/datasources/uid/nope") == (404, {"message": "Data source not found"})


def test_every_dashboard_via_search_and_by_uid_as_installed(host):
    files = {json.loads(p.read_text())["uid"]: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}
    status, hits = _get(host, "/api/search?type=dash-db")
    assert status == 200, hits
    assert sorted(h["uid"] for h in hits) == sorted(files), hits
    assert {h["folderTitle"] for h in hits} == {"LLM service"} and {h["type"] for h in hits} == {"dash-db"}
    for uid, source in files.items():
        status, body = _get(host, f"/api/dashboards/uid/{uid}")
        assert status == 200, body
        served = body["dashboard"]
        installed = json.loads(host.file(f"/var/lib/grafana/dashboards/labctl/{uid}.json").content_string)
        assert {k: v for k, v in served.items() if k not in ("id", "version")} == \
            {k: v for k, v in installed.items() if k not in ("id", "version")}, uid
        assert served["title"] == source["title"] and len(served["panels"]) == len(source["panels"])
        assert body["meta"]["provisioned"] is True and body["meta"]["folderTitle"] == "LLM service"
    # The gateway dashboard's spend prices are the lab's (the role's filter set them in the file Grafana read).
    gateway = _get(host, "/api/dashboards/uid/labctl-gateway")[1]["dashboard"]
    prices = {v["name"]: v["query"] for v in gateway["templating"]["list"] if v["name"].startswith("usd_per_mtok")}
    assert prices == {"usd_per_mtok_input": "0.15", "usd_per_mtok_output": "0.6"}, prices


def test_the_roles_own_checks_ran_and_a_rerun_changes_nothing(host):
    """The grafana role's checks ran (not skipped) and passed; the run changed nothing and did not
    restart Grafana."""
    pid = host.check_output("systemctl show -p MainPID --value grafana-server")
    run = subprocess.run(["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(REPO / "playbooks" / "monitoring.yml"),
                          "--tags", "grafana"], capture_output=True, text=True, timeout=1200, check=False, cwd=REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = {}
    for chunk in run.stdout.split("TASK [")[1:]:
        name, _, rest = chunk.partition("]")
        lines = [line for line in rest.splitlines() if re.match(r"^(ok|changed|skipping|fatal): ", line)]
        results[name] = lines[0].split(":")[0] if lines else ""
    checks = ["grafana : Wait until Grafana answers", "grafana : Read the datasource as the admin",
              "grafana : Check that the datasource is provisioned", "grafana : Wait until Grafana serves every dashboard",
              "grafana : Check that every dashboard is served in its folder"]
    assert {name: results.get(name) for name in checks} == dict.fromkeys(checks, "ok"), results
    recap = re.findall(r"changed=(\d+)", run.stdout.split("PLAY RECAP")[-1])
    assert recap and set(recap) == {"0"}, run.stdout[-2000:]
    assert host.check_output("systemctl show -p MainPID --value grafana-server") == pid
