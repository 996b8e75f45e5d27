"""``labctl provision``, ``labctl drift``, ``labctl status`` and ``labctl runs show``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from labctl.ansible_run import stats_data
from labctl.paths import repo_root
from labctl.redact import redact_argv
from labctl.runs.exitcodes import Exit
from labctl.runs.playbook import RunRequest, execute, print_summary
from labctl.runs.records import RecordStore

STATE_DIR_ENV = "LABCTL_STATE_DIR"

runs_app = typer.Typer(help="Run records.", no_args_is_help=True)

Inventory = Annotated[Path, typer.Option("--inventory", "-i", help="Inventory directory or file.")]
Limit = Annotated[str | None, typer.Option("--limit", "-l", help="ansible-playbook --limit.")]
Tags = Annotated[str | None, typer.Option("--tags", "-t", help="ansible-playbook --tags.")]
ExtraVars = Annotated[list[str] | None, typer.Option("--extra-vars", "-e",
                                                     help="Passed to ansible-playbook -e as given: key=value (quoted values "
                                                          "included), JSON/YAML, or @file (vault-encrypted too) (repeatable).")]
VaultFile = Annotated[list[Path] | None, typer.Option("--vault-password-file", help="ansible-playbook --vault-password-file "
                                                                                  "(repeatable; for vault-encrypted @files and vars).")]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="ansible-playbook -v (repeat for more, up to -vvvv).")]
JsonOut = Annotated[bool, typer.Option("--json", help="JSON lines on stdout instead of a display.")]
Playbook = Annotated[Path, typer.Option("--playbook", help="Playbook to run, relative to the repository (default site.yml).")]
KeepDays = Annotated[float, typer.Option("--keep-days", help="Delete run records older than this.")]
ModelFilter = Annotated[str | None, typer.Option(
    "--model", "-m", help="Several models (lab_models): only this model's replicas (its name or a public name).")]


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or "~/.local/state/labctl").expanduser()


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(int(Exit.USAGE))


def extra_vars_args(items: list[str]) -> list[str]:
    """ansible-playbook's -e arguments, each item as given: ansible-playbook itself parses key=value
    (with its quoting), JSON/YAML and @file (decrypting a vault file with --vault-password-file).
    Only what labctl can check without changing meaning is checked here: an @file must exist."""
    args: list[str] = []
    for item in items:
        text = item.strip()
        if not text:
            raise _fail("--extra-vars: an empty value")
        if text.startswith("@") and not Path(text[1:]).expanduser().is_file():
            raise _fail(f"--extra-vars {item}: no such file")
        args += ["-e", item]
    return args


def _pass_through(extra_vars: list[str] | None, vault_password_files: list[Path] | None, verbose: int) -> list[str]:
    args = extra_vars_args(extra_vars or [])
    for path in vault_password_files or []:
        if not path.expanduser().exists():
            raise _fail(f"--vault-password-file {path}: no such file")
        args += ["--vault-password-file", str(path.expanduser().resolve())]
    if verbose:
        args.append("-" + "v" * min(verbose, 4))
    return args


def build_request(command: str, inventory: Path, playbook: Path, limit: str | None, tags: str | None, check: bool,
             diff: bool, extra_vars: list[str] | None, json_output: bool, keep_days: float,
             vault_password_files: list[Path] | None = None, verbose: int = 0) -> RunRequest:
    if not inventory.exists():
        raise _fail(f"--inventory {inventory}: no such file or directory")
    path = playbook if playbook.is_absolute() else repo_root() / playbook
    if not path.is_file():
        raise _fail(f"--playbook {playbook}: no such playbook in {repo_root()}")
    return RunRequest(command=command, playbook=path, inventory=inventory, state_dir=state_dir(),
                      argv=redact_argv(["labctl", *sys.argv[1:]]), limit=limit, tags=tags, check=check, diff=diff,
                      passthrough=_pass_through(extra_vars, vault_password_files, verbose), json_output=json_output,
                      keep_days=keep_days)


def _execute_and_exit(request: RunRequest) -> None:
    code, record = execute(request)
    if record is not None:
        print_summary(record, request.json_output)
    raise typer.Exit(code)


def provision(
    inventory: Inventory,
    limit: Limit = None,
    tags: Tags = None,
    check: Annotated[bool, typer.Option("--check", help="ansible-playbook --check.")] = False,
    diff: Annotated[bool, typer.Option("--diff", help="ansible-playbook --diff.")] = False,
    extra_vars: ExtraVars = None,
    vault_password_file: VaultFile = None,
    verbose: Verbose = 0,
    json_output: JsonOut = False,
    playbook: Playbook = Path("site.yml"),
    keep_days: KeepDays = 30,
) -> None:
    """Run site.yml against an inventory: locked, recorded, exit code per outcome."""
    request = build_request("provision", inventory, playbook, limit, tags, check, diff, extra_vars, json_output, keep_days,
                            vault_password_file, verbose)
    _execute_and_exit(request)


def drift(
    inventory: Inventory,
    limit: Limit = None,
    tags: Tags = None,
    extra_vars: ExtraVars = None,
    vault_password_file: VaultFile = None,
    verbose: Verbose = 0,
    json_output: JsonOut = False,
    playbook: Playbook = Path("site.yml"),
    keep_days: KeepDays = 30,
) -> None:
    """Check mode with diff over the site: list each task that would change, per host. Changes
    nothing on the hosts but its own record (labctl_drift.prom). Exit 0: no drift; 5: drift."""
    request = build_request("drift", inventory, playbook, limit, tags, True, True, extra_vars, json_output, keep_days,
                            vault_password_file, verbose)
    _execute_and_exit(request)


def status(
    count: Annotated[int, typer.Option("--last", "-n", help="How many runs.")] = 10,
    json_output: JsonOut = False,
) -> None:
    """The last runs: when, what, outcome, changed counts, duration."""
    records = RecordStore(state_dir()).latest(count)
    if json_output:
        print(json.dumps([r.to_json() for r in records], indent=2))
        return
    if not records:
        typer.echo(f"no runs recorded in {state_dir() / 'runs'}")
        return
    table = Table(title=f"labctl runs ({state_dir() / 'runs'})")
    for column in ("run", "started", "command", "outcome", "hosts", "changed", "failed", "duration"):
        table.add_column(column)
    for record in records:
        table.add_row(record.id, time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started)), record.command,
                      record.outcome, str(len(record.hosts)), str(sum(s.changed for s in record.hosts.values())),
                      str(sum(s.failed + s.unreachable for s in record.hosts.values())), f"{record.duration:.0f} s")
    Console(width=None if sys.stdout.isatty() else 200).print(table)


@runs_app.command("show")
def show(run_id: Annotated[str, typer.Argument(help="A run id (or a unique part of it) from labctl status.")],
         json_output: JsonOut = False) -> None:
    """One run: its command, outcome, per-host counts, and failed tasks with their messages."""
    try:
        record = RecordStore(state_dir()).load(run_id)
    except FileNotFoundError as exc:
        raise _fail(str(exc)) from exc
    if json_output:
        print(json.dumps(record.to_json(), indent=2))
        return
    typer.echo(f"run {record.id}: {' '.join(record.argv)}")
    typer.echo(f"inventory {record.inventory}, revision {record.revision}")
    print_summary(record, False)


def rolling_restart(
    inventory: Inventory,
    replica: Annotated[list[int] | None, typer.Option("--replica", "-r", help="Only this replica index (repeatable).")] = None,
    model: ModelFilter = None,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    vault_password_file: VaultFile = None,
    verbose: Verbose = 0,
    json_output: JsonOut = False,
    keep_days: KeepDays = 30,
) -> None:
    """Restart vLLM replicas one at a time, each serving again before the next (the planned
    weekly restart against memory fragmentation)."""
    request = build_request("rolling-restart", inventory, Path("playbooks/rolling-restart.yml"), limit, None, False, False,
                       extra_vars, json_output, keep_days, vault_password_file, verbose)
    request.extra_vars["labctl_restart_replicas"] = list(replica or [])
    if model:
        request.extra_vars["labctl_restart_model"] = model
    _execute_and_exit(request)


def patch(
    inventory: Inventory,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    vault_password_file: VaultFile = None,
    verbose: Verbose = 0,
    json_output: JsonOut = False,
    keep_days: KeepDays = 30,
) -> None:
    """Apply a bundle's security updates (labctl bundle build --updates-from) one host at a time:
    replicas drained, apt upgrade, reboot only for a new kernel, services on replaced code
    restarted one by one, then the next host. Give the new bundle with -e lab_bundle_src=DIR."""
    request = build_request("patch", inventory, Path("playbooks/patch.yml"), limit, None, False, False,
                       extra_vars, json_output, keep_days, vault_password_file, verbose)
    _execute_and_exit(request)


def gpu_clear(
    inventory: Inventory,
    host: Annotated[str, typer.Option("--host", help="The GPU host (its inventory name).")],
    gpu: Annotated[str, typer.Option("--gpu", help="The GPU: its index, UUID or PCI bus id.")],
    reason: Annotated[str, typer.Option("--reason", help="Why it may serve again (the repair, a ticket); recorded.")],
    extra_vars: ExtraVars = None,
    vault_password_file: VaultFile = None,
    verbose: Verbose = 0,
    json_output: JsonOut = False,
    keep_days: KeepDays = 30,
) -> None:
    """Clear a GPU's latched fault (Xid 48/63/79/94/119, uncorrectable ECC errors, row remapping)
    once it is repaired: the gateways take its replicas back. Refused while the GPU still reports
    it; the run and the reason are recorded (docs/runbooks/monitoring.md, "GPU faults")."""
    if not reason.strip():
        raise _fail("--reason must say why the GPU may serve again")
    request = build_request("gpu-clear", inventory, Path("playbooks/gpu-clear.yml"), None, None, False, False,
                            extra_vars, json_output, keep_days, vault_password_file, verbose)
    request.extra_vars.update(labctl_gpu_clear_host=host, labctl_gpu_clear_gpu=gpu, labctl_gpu_clear_reason=reason,
                              labctl_gpu_clear_operator=os.environ.get("SUDO_USER") or os.environ.get("USER") or "unknown")
    _execute_and_exit(request)


def execute_quiet(request: RunRequest) -> tuple[int, Any]:
    """execute() with its JSON event lines kept off stdout (smoke prints its own table)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return execute(request)


def smoke_results(events: Path) -> list[dict[str, Any]]:
    """The checks the smoke playbook handed over (set_stats labctl_smoke, every host's in one list)."""
    for line in events.read_text(encoding="utf-8").splitlines():
        data = stats_data(json.loads(line))
        if data is not None:
            return [dict(c) for c in data.get("labctl_smoke") or []]
    return []


def smoke(
    inventory: Inventory,
    limit: Limit = None,
    model: ModelFilter = None,
    json_output: JsonOut = False,
) -> None:
    """One request to every replica and through every gateway, one Prometheus query: a
    pass/fail table. Exit 0 when every check passes, 1 otherwise."""
    request = build_request("smoke", inventory, Path("playbooks/smoke.yml"), limit, None, False, False, None, True, 30)
    if model:
        request.extra_vars["labctl_smoke_model"] = model
    request.record_hosts = False
    request.json_output = True
    code, record = execute_quiet(request)
    if record is None:
        raise typer.Exit(code)
    checks = smoke_results(RecordStore(state_dir()).root / record.id / "events.jsonl")
    passed = bool(checks) and all(str(c.get("ok")).lower() == "true" for c in checks) and code == Exit.OK
    if json_output:
        print(json.dumps({"passed": passed, "checks": checks, "run": record.id}))
    else:
        table = Table(title=f"labctl smoke ({record.id})")
        for column in ("host", "check", "target", "result", "detail"):
            table.add_column(column)
        for c in checks:
            ok = str(c.get("ok")).lower() == "true"
            table.add_row(c["host"], c.get("check", ""), c.get("target", ""), "PASS" if ok else "FAIL", c.get("detail", ""))
        Console(width=None if sys.stdout.isatty() else 200).print(table)
        if code != Exit.OK:
            print_summary(record, False)
    raise typer.Exit(int(Exit.OK) if passed else int(Exit.FAILED) if code in (Exit.OK, Exit.FAILED) else code)
