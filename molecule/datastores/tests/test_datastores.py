"""The gateway's datastores after converge: PostgreSQL (loopback only, LiteLLM's user with the
control node's secret, nightly dump with retention) and Redis (loopback only, password).

The last tests re-run the postgresql role with another port and setting (restart vs reload)
and then with the defaults again; they run in file order."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
CONVERGE = REPO / "molecule" / "datastores" / "converge.yml"
BACKUP_DIR = "/var/backups/labctl/postgresql"
DUMP_UNIT = "labctl-pg-dump.service"


def _ansible_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    return env


@pytest.fixture(scope="module")
def secrets_dir() -> Path:
    """lab_secrets_dir as the converge saw it (molecule's settings name one per scenario). The
    converge's playbook directory, not the checkout's: ad-hoc `ansible` reads group_vars/ beside
    its playbook directory (the current one by default), and the checkout's group_vars/all/project.yml
    would then override the inventory's molecule settings."""
    out = subprocess.run(
        ["ansible", "all", "-i", os.environ["MOLECULE_INVENTORY_FILE"], "--playbook-dir", str(CONVERGE.parent),
         "-m", "ansible.builtin.debug", "-a", "var=lab_secrets_dir"],
        capture_output=True, text=True, check=True, cwd=REPO, env=_ansible_env(),
    ).stdout
    data, _ = json.JSONDecoder().raw_decode(out[out.index("{"):])
    (result,) = data["plays"][0]["tasks"][0]["hosts"].values()
    return Path(result["lab_secrets_dir"])


@pytest.fixture(scope="module")
def db_password(secrets_dir: Path) -> str:
    return (secrets_dir / "litellm-database-password").read_text().split()[0]


@pytest.fixture(scope="module")
def redis_password(secrets_dir: Path) -> str:
    return (secrets_dir / "redis-password").read_text().split()[0]


def _listeners(host, port: int) -> set[str]:
    """Local addresses of the TCP sockets listening on port."""
    lines = host.check_output("ss -Hltn").splitlines()
    return {line.split()[3].rsplit(":", 1)[0] for line in lines if line.split()[3].rsplit(":", 1)[1] == str(port)}


def _psql_tcp(host, password: str, sql: str, user: str = "litellm", port: int = 5432):
    return host.run(
        "PGPASSWORD=%s PGCONNECT_TIMEOUT=5 psql -h 127.0.0.1 -p %s -U %s -d litellm -XtAc %s",
        password, str(port), user, sql,
    )


def _pg_version(host) -> str:
    depends = host.check_output("dpkg-query --show --showformat='${Depends}' postgresql")
    return depends.split("postgresql-", 1)[1].split()[0].rstrip(",")


def _postmaster_pid(host) -> str:
    return host.check_output(f"head -1 /var/lib/postgresql/{_pg_version(host)}/main/postmaster.pid")


def _journal_on_failure(host, unit: str) -> str:
    return host.run(f"journalctl -u {unit} --no-pager -n 40").stdout


# --- control node ----------------------------------------------------------------------------

def test_secret_files_on_the_control_node_are_private(secrets_dir: Path):
    assert stat.S_IMODE(secrets_dir.stat().st_mode) == 0o700
    for name in ("litellm-database-password", "redis-password"):
        path = secrets_dir / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert len(path.read_text().split()[0]) == 40


# --- PostgreSQL --------------------------------------------------------------------------------

def test_default_cluster_runs_and_starts_at_boot(host):
    version = _pg_version(host)
    unit = f"postgresql@{version}-main.service"
    assert host.service(unit).is_running, _journal_on_failure(host, unit)
    assert host.service(unit).is_enabled
    clusters = [line.split()[:4] for line in host.check_output("pg_lsclusters --no-header").splitlines()]
    assert clusters == [[version, "main", "5432", "online"]]
    dropin = host.file(f"/etc/postgresql/{version}/main/conf.d/90-labctl.conf")
    assert (dropin.user, dropin.group, dropin.mode) == ("postgres", "postgres", 0o644)
    hba = host.file(f"/etc/postgresql/{version}/main/pg_hba.conf")
    assert (hba.user, hba.group, hba.mode) == ("postgres", "postgres", 0o640)


def test_postgres_listens_on_loopback_only(host):
    assert host.socket("tcp://127.0.0.1:5432").is_listening
    assert not host.socket("tcp://0.0.0.0:5432").is_listening
    assert _listeners(host, 5432) <= {"127.0.0.1", "[::1]"}, _listeners(host, 5432)
    assert "127.0.0.1" in _listeners(host, 5432)


def test_settings_are_in_effect(host):
    show = host.check_output(
        "su postgres -c \"psql -XtAc 'SELECT name, setting FROM pg_settings WHERE name IN "
        "(\\$\\$listen_addresses\\$\\$, \\$\\$password_encryption\\$\\$, \\$\\$log_connections\\$\\$) ORDER BY name'\"")
    assert show.splitlines() == ["listen_addresses|localhost", "log_connections|on", "password_encryption|scram-sha-256"]


def test_litellm_user_logs_in_over_tcp_with_the_secret(host, db_password):
    result = _psql_tcp(host, db_password, "SELECT current_user, current_database(), "
                       "pg_encoding_to_char(encoding), datcollate, pg_get_userbyid(datdba) "
                       "FROM pg_database WHERE datname = current_database()")
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == "litellm|litellm|UTF8|C.UTF-8|litellm"
    # Stored as a SCRAM verifier, and the user has no extra powers.
    flags = host.check_output(
        "su postgres -c \"psql -XtAc 'SELECT rolsuper, rolcreatedb, rolcreaterole, left(rolpassword, 14) "
        "FROM pg_authid WHERE rolname = \\$\\$litellm\\$\\$'\"")
    assert flags == "f|f|f|SCRAM-SHA-256$"


def test_wrong_password_is_refused(host, db_password):
    result = _psql_tcp(host, db_password[::-1], "SELECT 1")
    assert result.rc != 0
    assert 'password authentication failed for user "litellm"' in result.stderr


def test_only_litellm_may_connect_over_tcp(host, db_password):
    # The superuser has no TCP entry in pg_hba.conf, whatever the password.
    result = _psql_tcp(host, db_password, "SELECT 1", user="postgres")
    assert result.rc != 0 and "no pg_hba.conf entry" in result.stderr, result.stderr


def test_dump_timer_is_enabled_and_waiting(host):
    timer = host.service("labctl-pg-dump.timer")
    assert timer.is_enabled and timer.is_running
    unit = host.file("/etc/systemd/system/labctl-pg-dump.timer").content_string
    assert "OnCalendar=*-*-* 02:30:00" in unit and "Persistent=true" in unit
    backup_dir = host.file(BACKUP_DIR)
    assert (backup_dir.user, backup_dir.group, backup_dir.mode) == ("postgres", "postgres", 0o700)
    assert host.file(os.path.dirname(BACKUP_DIR)).mode == 0o755


def test_dump_service_writes_a_dump_pg_restore_reads(host, db_password):
    created = _psql_tcp(host, db_password, "CREATE TABLE IF NOT EXISTS labctl_probe (x int); "
                        "INSERT INTO labctl_probe VALUES (42)")
    assert created.rc == 0, created.stderr
    before = set(host.check_output(f"ls -1 {BACKUP_DIR}").split())
    run = host.run(f"systemctl start {DUMP_UNIT}")
    assert run.rc == 0, _journal_on_failure(host, DUMP_UNIT)
    new = sorted(set(host.check_output(f"ls -1 {BACKUP_DIR}").split()) - before)
    assert len(new) == 1 and new[0].startswith("litellm_") and new[0].endswith("Z.dump"), new
    dump = host.file(f"{BACKUP_DIR}/{new[0]}")
    assert (dump.user, dump.mode) == ("postgres", 0o600)
    listing = host.check_output(f"pg_restore -l {BACKUP_DIR}/{new[0]}")
    assert "TABLE DATA public labctl_probe" in listing
    assert "dumped litellm to" in host.check_output(f"journalctl -u {DUMP_UNIT} --no-pager -n 20")


def test_the_dump_restores_into_a_fresh_database(host):
    """The newest dump (the one just written) restores into a new, empty database: the probe
    table comes back with its row, owned by LiteLLM's user."""
    newest = host.check_output(f"ls -1t {BACKUP_DIR} | grep -E '^litellm_.*Z\\.dump$' | head -1")
    assert newest, "no dump to restore"
    fresh = "labctl_restore_check"
    as_postgres = "su postgres -c %s"
    host.run(as_postgres, f"dropdb --if-exists {fresh}")
    try:
        host.run_expect([0], as_postgres, f"createdb --owner=litellm {fresh}")
        restored = host.run(as_postgres, f"pg_restore --exit-on-error --dbname={fresh} {BACKUP_DIR}/{newest}")
        assert restored.rc == 0, restored.stderr
        rows = host.check_output(as_postgres, f"psql -d {fresh} -XtAc 'SELECT x FROM labctl_probe'")
        assert set(rows.split()) == {"42"}, rows
        owner = host.check_output(
            as_postgres, f"psql -d {fresh} -XtAc \"SELECT tableowner FROM pg_tables WHERE tablename = 'labctl_probe'\"")
        assert owner == "litellm"
    finally:
        host.run(as_postgres, f"dropdb --if-exists {fresh}")


def test_dumps_older_than_the_retention_are_deleted(host):
    old = f"{BACKUP_DIR}/litellm_20000101T000000Z.dump"
    recent = f"{BACKUP_DIR}/litellm_20000102T000000Z.dump"
    foreign = f"{BACKUP_DIR}/notes-kept-by-an-admin.txt"
    host.run_expect([0], f"""set -e
        install -o postgres -g postgres -m 0600 /dev/null {old}
        install -o postgres -g postgres -m 0600 /dev/null {recent}
        install -o postgres -g postgres -m 0600 /dev/null {foreign}
        touch -d '15 days ago' {old} {foreign}
        touch -d '13 days ago' {recent}""")
    run = host.run(f"systemctl start {DUMP_UNIT}")
    assert run.rc == 0, _journal_on_failure(host, DUMP_UNIT)
    assert not host.file(old).exists  # past 14 days
    assert host.file(recent).exists  # within them
    assert host.file(foreign).exists  # not the script's
    assert f"deleted (older than 14 days): {old}" in host.check_output(f"journalctl -u {DUMP_UNIT} --no-pager -n 20")
    host.run_expect([0], f"rm -f {recent} {foreign}")


# --- Redis -------------------------------------------------------------------------------------

def test_redis_runs_with_the_templated_config(host):
    assert host.service("redis-server").is_running, _journal_on_failure(host, "redis-server")
    assert host.service("redis-server").is_enabled
    conf = host.file("/etc/redis/redis.conf")
    assert (conf.user, conf.group, conf.mode) == ("redis", "redis", 0o640)


def test_redis_answers_ping_with_the_password(host, redis_password):
    result = host.run("REDISCLI_AUTH=%s redis-cli -h 127.0.0.1 -p 6379 ping", redis_password)
    assert result.stdout.strip() == "PONG", result.stdout + result.stderr


def test_redis_refuses_without_the_password(host, redis_password):
    result = host.run("redis-cli -h 127.0.0.1 -p 6379 ping")
    assert "NOAUTH" in result.stdout + result.stderr
    wrong = host.run("REDISCLI_AUTH=%s redis-cli -h 127.0.0.1 -p 6379 ping", redis_password[::-1])
    assert "WRONGPASS" in wrong.stdout + wrong.stderr


def test_redis_is_bound_to_loopback_only(host, redis_password):
    assert host.socket("tcp://127.0.0.1:6379").is_listening
    assert not host.socket("tcp://0.0.0.0:6379").is_listening
    assert _listeners(host, 6379) <= {"127.0.0.1", "[::1]"}, _listeners(host, 6379)
    config = host.check_output(
        "REDISCLI_AUTH=%s redis-cli -h 127.0.0.1 -p 6379 --raw config get %s", redis_password, "*").splitlines()
    settings: dict[str, Any] = dict(zip(config[::2], config[1::2], strict=False))
    assert settings["protected-mode"] == "yes"
    assert settings["maxmemory-policy"] == "allkeys-lru"
    assert settings["maxmemory"] == str(2 * 1024**3)
    assert settings["save"] == "" and settings["appendonly"] == "no"
    assert settings["dir"] == "/var/lib/redis"


# --- re-runs: restart only when a setting needs it, and no secret in the output -------------------

def _converge(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(CONVERGE), "--diff", "-v", *extra],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPO,
    )


def _identity(host) -> dict[str, str]:
    """What a dropped and recreated database would change: its OID, the probe table's OID, its rows."""
    sql = ("SELECT (SELECT oid FROM pg_database WHERE datname = 'litellm') || ' ' || "
           "'labctl_probe'::regclass::oid || ' ' || (SELECT string_agg(x::text, ',') FROM labctl_probe)")
    database, table, rows = host.check_output("su postgres -c %s", f"psql -d litellm -XtAc \"{sql}\"").split()
    return {"database_oid": database, "table_oid": table, "rows": rows, "postmaster": _postmaster_pid(host)}


@pytest.fixture(scope="module")
def identity_before_reruns(host) -> dict[str, str]:
    """Taken before the first re-run of the role below (the probe table exists since the dump test)."""
    return _identity(host)


def test_reload_only_setting_changes_without_a_restart(host, db_password, redis_password, identity_before_reruns):
    pid = _postmaster_pid(host)
    result = _converge("--tags", "postgresql,redis", "-e",
                       json.dumps({"postgresql_settings": {"max_connections": 100, "log_connections": False}}))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "RUNNING HANDLER [postgresql : Reload postgresql]" in result.stdout
    assert "Restart postgresql" not in result.stdout
    assert _postmaster_pid(host) == pid
    assert host.check_output("su postgres -c \"psql -XtAc 'SHOW log_connections'\"") == "off"
    # -v and --diff print task results and file changes: the passwords never appear.
    assert db_password not in result.stdout + result.stderr
    assert redis_password not in result.stdout + result.stderr


def test_port_change_restarts_and_the_defaults_come_back(host, db_password):
    pid = _postmaster_pid(host)
    moved = _converge("--tags", "postgresql", "-e", "postgresql_port=5433")
    assert moved.returncode == 0, moved.stdout[-4000:] + moved.stderr[-2000:]
    assert "RUNNING HANDLER [postgresql : Restart postgresql]" in moved.stdout
    assert _postmaster_pid(host) != pid
    assert _listeners(host, 5433) and not _listeners(host, 5432)
    assert _psql_tcp(host, db_password, "SELECT 1", port=5433).stdout.strip() == "1"
    assert "\nport=5433\n" in host.file("/usr/local/sbin/labctl-pg-dump").content_string  # the dump follows

    back = _converge("--tags", "postgresql")
    assert back.returncode == 0, back.stdout[-4000:] + back.stderr[-2000:]
    assert "RUNNING HANDLER [postgresql : Restart postgresql]" in back.stdout
    assert _listeners(host, 5432) and not _listeners(host, 5433)
    assert _psql_tcp(host, db_password, "SELECT 1").stdout.strip() == "1"
    assert host.check_output("su postgres -c \"psql -XtAc 'SHOW log_connections'\"") == "on"


def test_reprovisioning_kept_the_database_and_its_rows(host, identity_before_reruns):
    """The role ran three more times above (a reload, a port change and back, with restarts):
    the database was never dropped or recreated, and the probe row is still there."""
    after = _identity(host)
    assert after["postmaster"] != identity_before_reruns["postmaster"], \
        "PostgreSQL was not restarted since the identity was taken: run the whole file (the re-runs above)"
    assert set(identity_before_reruns["rows"].split(",")) == {"42"}
    assert {k: v for k, v in after.items() if k != "postmaster"} == \
        {k: v for k, v in identity_before_reruns.items() if k != "postmaster"}


def test_no_password_in_the_journal(host, db_password, redis_password):
    """After the converges above (some with -v): no password in any journal field (sudo logs the
    command line of every become, so a secret passed in `environment:` would be there)."""
    journal = host.check_output("journalctl --no-pager -o json | wc -l")
    assert int(journal) > 100
    for name, secret in (("database", db_password), ("redis", redis_password)):
        # The secret goes in on stdin (docker exec, not an ansible command, which is itself logged).
        found = subprocess.run(["docker", "exec", "-i", host.check_output("hostname"), "sh", "-c",
                                'IFS= read -r s; journalctl --no-pager -o json | grep -cF -e "$s" || true'],
                               input=secret + "\n", capture_output=True, text=True, check=True).stdout.strip()
        assert found == "0", f"the {name} password is in {found} journal entries"
