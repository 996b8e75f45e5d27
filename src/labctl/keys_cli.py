"""``labctl keys add|list|revoke|push``: the gateway's application keys (no database needed).

The store is the inventory's ``lab_app_keys_file`` (Ansible says where: playbooks/keys.yml, tag
``locate``, which also gives the inventory's lab_models: a key's ``--model`` is checked against them
before the store changes). ``add`` prints the new key once; ``add`` and ``revoke`` then send the
hashes to every gateway host (``push``: playbooks/keys.yml, under the inventory's lock, recorded
like a provision run), where they take effect with the next request, without a restart. A push
sends every good record and every revocation; a bad record is left out and named, and the push
exits non-zero.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer
from rich.console import Console
from rich.table import Table

from labctl import models as models_mod
from labctl.ansible_run import run_playbook
from labctl.keys import CLASSES, KeyRefused, KeyStore
from labctl.paths import repo_root
from labctl.runs import cli as runs_cli
from labctl.runs.exitcodes import Exit
from labctl.runs.playbook import execute, print_summary

PLAYBOOK = "playbooks/keys.yml"

keys_app = typer.Typer(help="Application keys of the gateway (per application: class, limits, expiry).",
                       no_args_is_help=True)

NoPush = Annotated[bool, typer.Option("--no-push", help="Only change the store; send it later with labctl keys push.")]


def _fail(message: str, code: Exit = Exit.USAGE) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(int(code))


class Located(NamedTuple):
    """Where the inventory keeps its keys, and what `labctl keys` checks a key against."""

    path: Path
    database_mode: bool
    # lab_models as the inventory gives it (unparsed); None: a one-model lab.
    lab_models: Any = None


def locate(inventory: Path) -> Located:
    """The inventory's key store, as Ansible resolves lab_app_keys_file, whether the gateway runs in
    database mode, and the lab's models (lab_models) (contacts no host)."""
    if not inventory.exists():
        raise _fail(f"--inventory {inventory}: no such file or directory")
    result = run_playbook(repo_root() / PLAYBOOK, inventory, args=["--tags", "locate"])
    found = result.data.get("labctl_keys_file")
    if result.status != "successful" or not found:
        detail = " / ".join(result.failures) or result.output_tail.splitlines()[-1:] or ["no gateway host"]
        raise _fail(f"cannot tell where {inventory} keeps its keys: {detail}", Exit.FAILED)
    path = Path(str(found))
    if not path.is_absolute():
        raise _fail(f"lab_app_keys_file {path} is not an absolute path", Exit.USAGE)
    return Located(path, str(result.data.get("labctl_keys_database_mode", "")).lower() == "true",
                   result.data.get("labctl_keys_lab_models") or None)


def _lab_models(located: Located) -> list[dict[str, Any]] | None:
    """The inventory's lab_models, checked (labctl.models.parse, as the topology does); None
    without it: a one-model lab, whose keys take no --model."""
    if located.lab_models is None:
        return None
    try:
        return models_mod.parse(located.lab_models)
    except models_mod.ModelsError as exc:
        raise _fail(f"cannot check --model: {exc}", Exit.FAILED) from exc


def _push(inventory: Path, json_output: bool, new_key: tuple[str, str] | None = None) -> int:
    """playbooks/keys.yml under the lock, recorded. new_key (database mode): name and key, handed to
    the run in a 0600 file that is deleted afterwards (never in the record or on a command line)."""
    request = runs_cli.build_request("keys-push", inventory, Path(PLAYBOOK), None, None, False, False, None, json_output, 30)
    with tempfile.TemporaryDirectory(prefix="labctl-key-") as scratch:
        if new_key is not None:
            handoff = Path(scratch) / "new-key.json"
            fd = os.open(handoff, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"name": new_key[0], "key": new_key[1]}, handle)
            request.extra_vars["litellm_app_key_new_file"] = str(handoff)
        code, record = execute(request)
    if record is not None:
        print_summary(record, json_output)
    return int(code)


@keys_app.command("add")
def add(
    name: Annotated[str, typer.Argument(help="The application's name (lowercase letters, digits, . _ -).")],
    inventory: runs_cli.Inventory,
    key_class: Annotated[str, typer.Option("--class", help=f"Model class it reaches, and so its priority: {' or '.join(CLASSES)}.")],
    rpm: Annotated[int | None, typer.Option("--rpm", help="Requests per minute (429 beyond).")] = None,
    tpm: Annotated[int | None, typer.Option("--tpm", help="Tokens per minute (429 beyond).")] = None,
    max_parallel: Annotated[int | None, typer.Option(
        "--max-parallel", help="Requests in flight at once (429 beyond); default: the gateway's share "
                               "(litellm_app_key_max_parallel_share of its admission slots).")] = None,
    expires: Annotated[str | None, typer.Option("--expires", help="YYYY-MM-DD (end of that day, UTC) or an ISO date-time.")] = None,
    model: Annotated[list[str] | None, typer.Option(
        "--model", help="Several models (lab_models): a model it may use, its name or a served name, checked against the "
                        "inventory's lab_models (repeat for more); default: every model of its class.")] = None,
    no_push: NoPush = False,
) -> None:
    """Make a key for one application; prints it once (it is stored nowhere), then sends its hash."""
    if key_class not in CLASSES:  # before Ansible is asked anything
        raise _fail(f"--class {key_class}: no such key class (one of {', '.join(CLASSES)})")
    located = locate(inventory)
    database_mode = located.database_mode
    store = KeyStore(located.path)
    try:
        record, key = store.add(name, key_class, rpm=rpm, tpm=tpm, max_parallel=max_parallel, expires=expires, models=model,
                                lab_models=_lab_models(located))
    except KeyRefused as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"key {record.name} ({record.key_class}) made; give it to the application now, it is not shown again:",
               err=True)
    typer.echo(key)
    if no_push:
        if database_mode:
            typer.echo("database mode: --no-push cannot make the virtual key later (the key is not kept); revoke "
                       "it and add it again without --no-push", err=True)
        else:
            typer.echo("not sent: run labctl keys push -i INVENTORY to make it work", err=True)
        return
    raise typer.Exit(_push(inventory, False, (record.name, key) if database_mode else None))


@keys_app.command("models")
def models(
    name: Annotated[str, typer.Argument(help="The key's name.")],
    inventory: runs_cli.Inventory,
    model: Annotated[list[str] | None, typer.Option(
        "--model", help="A model it may use, checked against the inventory's lab_models (repeat for more); none: every "
                        "model of its class.")] = None,
    no_push: NoPush = False,
) -> None:
    """Change the models a key may use (several models, lab_models): the application keeps its key,
    the gateway applies the change from the next request (moving keys to a new model)."""
    located = locate(inventory)
    store = KeyStore(located.path)
    try:
        record = store.set_models(name, model, _lab_models(located) if model else None)
    except KeyRefused as exc:
        raise _fail(str(exc)) from exc
    reached = ", ".join(record.models) if record.models else "every model of its class"
    _then_push(inventory, no_push, f"key {name} now reaches {reached}", "not sent: run labctl keys push -i INVENTORY to make it work")


@keys_app.command("revoke")
def revoke(
    name: Annotated[str, typer.Argument(help="The key's name.")],
    inventory: runs_cli.Inventory,
    no_push: NoPush = False,
) -> None:
    """Revoke a key: refused (401) from the next request once sent; requests already running finish."""
    store = KeyStore(locate(inventory).path)
    try:
        store.revoke(name)
    except KeyRefused as exc:
        raise _fail(str(exc)) from exc
    _then_push(inventory, no_push, f"key {name} revoked in {store.path}", "not sent: it still works until labctl keys push -i INVENTORY")


def _then_push(inventory: Path, no_push: bool, done: str, not_sent: str) -> None:
    """Say what changed in the store, then send it to the gateways (exits with the push's status)."""
    typer.echo(done, err=True)
    if no_push:
        typer.echo(not_sent, err=True)
        return
    raise typer.Exit(_push(inventory, False))


@keys_app.command("push")
def push(inventory: runs_cli.Inventory, json_output: runs_cli.JsonOut = False) -> None:
    """Send the store's hashes to every gateway host (site.yml does it too)."""
    raise typer.Exit(_push(inventory, json_output))


@keys_app.command("list")
def list_keys(inventory: runs_cli.Inventory, json_output: runs_cli.JsonOut = False) -> None:
    """Every key of the store: class, limits, expiry, status. Never the key or its hash."""
    store = KeyStore(locate(inventory).path)
    try:
        keys = store.load()
    except KeyRefused as exc:
        raise _fail(str(exc), Exit.FAILED) from exc
    now = datetime.now(UTC)
    rows = [{"name": k.name, "class": k.key_class, "models": ",".join(k.models) if k.models else None, "rpm": k.rpm,
             "tpm": k.tpm, "max_parallel": k.max_parallel, "expires": k.expires,
             "created": k.created, "revoked": k.revoked, "status": k.status(now)} for k in keys]
    if json_output:
        typer.echo(json.dumps(rows, indent=1))
        return
    columns = ("name", "class", "models", "rpm", "tpm", "max_parallel", "expires", "status")
    table = Table(*columns, title=str(store.path))
    for row in rows:
        table.add_row(*(str(row[c]) if row[c] is not None else "-" for c in columns))
    Console().print(table)
