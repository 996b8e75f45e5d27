"""Last of the stack verify (the name sorts it after every other file): what the whole converge
and every test before it left behind.

- No phone-home. prepare.yml made a logging resolver (tests/fixtures/dnslog/dnslog.py) the only
  nameserver before the converge, so every name lookup of the converge, the second runs, the
  faults and all the serving of the verify (well over 5 minutes) is in its log with the process
  that asked. Any name outside the host fails the test, listed with that process.
- No secret in any log: every generated secret is absent from the whole journal (every field of
  every entry, so every labctl unit) and from every file under /var/log.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess

import pytest
from test_stack import REPO, SECRETS_DIR, _report, _secrets  # same directory

DNSLOG = "/var/log/labctl-test-dnslog.jsonl"
RESOLVER_UNIT = "labctl-test-dnslog.service"
_SPEC = importlib.util.spec_from_file_location("dnslog", REPO / "tests" / "fixtures" / "dnslog" / "dnslog.py")
assert _SPEC and _SPEC.loader
dnslog = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(dnslog)

# Runs inside the target with the secrets on stdin (never on a command line: ansible's command
# module logs its arguments to the journal). Prints where each secret was found, masked.
_FIND = r"""
import json, os, subprocess, sys
secrets = json.load(sys.stdin)
hits, units = [], set()
journal = subprocess.run(["journalctl", "--no-pager", "-o", "json"], capture_output=True, text=True, check=True).stdout
for line in journal.splitlines():
    entry = json.loads(line)
    units.update({entry.get("_SYSTEMD_UNIT", ""), entry.get("UNIT", "")})
    for i, secret in enumerate(secrets):
        if secret in line:
            message = str(entry.get("MESSAGE", ""))[:300].replace(secret, "<secret %d>" % i)
            hits.append(["journal", entry.get("_SYSTEMD_UNIT") or entry.get("SYSLOG_IDENTIFIER"), i, message])
files = 0
for root, _, names in os.walk("/var/log"):
    for name in names:
        path = os.path.join(root, name)
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        files += 1
        for i, secret in enumerate(secrets):
            if secret.encode() in data:
                hits.append(["file", path, i, ""])
# Files that hold a secret on purpose (the services' settings) must not be world-readable.
holders = []
for top in ("/etc", "/usr/local", "/var/lib/prometheus", "/root", "/home", "/srv/labctl"):
    for root, _, names in os.walk(top):
        for name in names:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
                data = open(path, "rb").read() if os.path.isfile(path) and not os.path.islink(path) else b""
            except OSError:
                continue
            found = [i for i, secret in enumerate(secrets) if secret.encode() in data]
            if found:
                holders.append([path, oct(st.st_mode & 0o7777), st.st_uid, st.st_gid, found])
print(json.dumps({"holders": holders, "hits": hits, "units": sorted(units), "files": files, "journal_entries": len(journal.splitlines())}))
"""


@pytest.fixture(scope="module")
def found(host) -> dict:
    """Where the target holds each generated secret (one search for both tests)."""
    run = subprocess.run(["docker", "exec", "-i", host.check_output("hostname"), "python3", "-c", _FIND],
                         input=json.dumps(_secrets(host)), capture_output=True, text=True, check=True, timeout=300)
    return json.loads(run.stdout)


def test_no_generated_secret_in_the_journal_or_in_var_log(found):
    # The search covered the services' own logs.
    for unit in ("vllm@0.service", "vllm@1.service", "litellm.service", "postgresql@15-main.service", "prometheus.service"):
        assert unit in found["units"], f"no journal entries of {unit}: the search saw nothing"
    assert found["files"] > 3
    print(f"searched {found['journal_entries']} journal entries of {len(found['units'])} units and {found['files']} files")
    assert not found["hits"], "\n".join(map(str, found["hits"]))


def test_files_holding_a_secret_are_private(found):
    """On the control node every generated secret is a 0600 file in a 0700 directory; on the
    host only the services' settings files hold one, none readable by other users."""
    secrets_dir = SECRETS_DIR
    assert secrets_dir.stat().st_mode & 0o777 == 0o700
    # Files 0600 (the CA's and the hosts' keys among them) but the certificates (public),
    # directories (tls/, tls/hosts/) 0700.
    modes = {str(p.relative_to(secrets_dir)): oct(p.stat().st_mode & 0o777) for p in secrets_dir.rglob("*")}
    files = {name: mode for name, mode in modes.items() if (secrets_dir / name).is_file()}
    private = {name: mode for name, mode in files.items() if not name.endswith(".crt")}
    assert len(private) >= 7 and set(private.values()) == {"0o600"}, modes
    assert "tls/ca.key" in private, modes
    assert {mode for name, mode in modes.items() if name not in files} == {"0o700"}, modes
    holders = found["holders"]
    print("files holding a secret:", holders)
    assert any(path == "/etc/labctl/litellm/litellm.env" for path, *_ in holders), holders
    readable = [h for h in holders if int(h[1], 8) & 0o007]
    assert not readable, f"world-readable files with a secret: {readable}"


def test_no_name_outside_the_host_was_looked_up(host):
    """The resolver has answered every lookup since before the converge; none was for a name
    outside the host (usage statistics, model hubs, tokenizer files, cost maps, Prisma engines)."""
    assert host.file("/etc/resolv.conf").content_string.split() == ["nameserver", "127.0.0.1"], \
        "something replaced the test's resolv.conf: lookups may have bypassed the logging resolver"
    service = dict(line.split("=", 1) for line in host.check_output(
        f"systemctl show -p ActiveState,NRestarts,ActiveEnterTimestampMonotonic {RESOLVER_UNIT}").splitlines())
    assert service["ActiveState"] == "active", service
    # Active since before the converge wrote its first file (no gap: never restarted). The power-cut
    # test (test_stack_reboot.py) boots the host again: then the resolver (Before=nss-lookup.target)
    # must have been up before every site service of this boot started, and docker's resolv.conf
    # pointed at it from the start (dns_servers in .config/molecule/config.yml).
    first_write = float(host.check_output("find /etc/labctl -printf '%T@\\n' | sort -n | head -1"))
    resolver_up = float(host.check_output(f"date -d \"$(systemctl show -p ActiveEnterTimestamp --value {RESOLVER_UNIT})\" +%s"))
    booted = float(host.check_output("date -d \"$(systemctl show -p UserspaceTimestamp --value)\" +%s"))
    assert service["NRestarts"] == "0", service
    if booted <= first_write:
        assert resolver_up <= first_write, (resolver_up, first_write, service)
    else:
        starts = [int(host.check_output(f"systemctl show -p ExecMainStartTimestampMonotonic --value {unit}"))
                  for unit in ("vllm@0", "vllm@1", "litellm", "prometheus", "redis-server", "postgresql@15-main")]
        assert int(service["ActiveEnterTimestampMonotonic"]) <= min(starts), (service, starts)
    # It still answers and logs (a lookup of a host name, which the report leaves out).
    host.run("getent hosts dnslog-probe.localhost")
    lines = host.file(DNSLOG).content_string.splitlines()
    assert any('"dnslog-probe.localhost"' in line for line in lines), "the resolver did not log a lookup"
    serving = float(host.check_output("date +%s")) - min(resolver_up, json.loads(lines[0])["time"])
    outside = dnslog.outside_lookups(lines)
    _report(dns={"lookups": len(lines), "outside": len(outside), "resolver_up_s": round(serving)})
    print(f"{len(lines)} lookups in {serving:.0f} s under the logging resolver, {len(outside)} of names outside the host")
    assert serving > 300
    assert not outside, "lookups of names outside the host:\n" + "\n".join(outside)
