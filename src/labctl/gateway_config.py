"""``labctl gateway-config``: the LiteLLM config.yaml the litellm role would deploy for an inventory.

The litellm role renders it itself (playbooks/gateway-config.yml runs its ``render.yml`` entry on
the control node through ansible-runner), so this module holds no copy of the template logic.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from labctl.ansible_run import run_playbook
from labctl.paths import repo_root
from labctl.runs.exitcodes import Exit

PLAYBOOK = "playbooks/gateway-config.yml"
MASK = "********"
# Keys whose literal values are secrets. The role's config refers to them as os.environ/NAME
# (the secrets live in litellm.env), so masking only matters for a config that inlines one.
_SECRET_LINE = re.compile(
    r"^(?P<head>\s*-?\s*(?:master_key|salt_key|database_url|redis_password|password|api_key)\s*:\s*)"
    r"(?P<value>\S.*?)\s*$"
)
_NOT_SECRET = re.compile(r"""^["']?(os\.environ/\w+|none|null|)["']?$""", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """Replace every literal secret value (not an os.environ/ reference, not "none") with a mask."""
    lines = []
    for line in text.splitlines():
        match = _SECRET_LINE.match(line)
        if match and not _NOT_SECRET.match(match.group("value")):
            line = match.group("head") + MASK
        lines.append(line)
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


def render(inventory: Path, callbacks: dict[str, dict[str, str]] | None = None) -> tuple[dict[str, str], list[str]]:
    """Run the playbook; returns the config per gateway host and the failure messages (and fills
    ``callbacks`` with each host's callback files by name, the plain Python callbacks and their
    rendered settings, when given). The role hands them over with set_stats (roles/litellm/tasks/render.yml)."""
    result = run_playbook(repo_root() / PLAYBOOK, inventory)
    failures = list(result.failures)
    if result.status != "successful" and not failures:
        failures.append("ansible-playbook failed: " + " / ".join(result.output_tail.splitlines()[-10:]))
    if callbacks is not None:
        callbacks.update({str(h): {str(n): str(t) for n, t in files.items()}
                          for h, files in (result.data.get("labctl_callbacks") or {}).items()})
    configs = {str(h): str(v) for h, v in (result.data.get("labctl_gateway_config") or {}).items()}
    return configs, failures


def gateway_config(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="Inventory directory or file.")],
    show_secrets: Annotated[bool, typer.Option("--show-secrets", help="Print literal secrets instead of a mask.")] = False,
    callbacks_out: Annotated[
        Path | None,
        typer.Option("--callbacks-out", help="Also write the gateway's callbacks (labctl_*.py) and their settings "
                     "(labctl_*.yaml) into this directory, as the role writes them beside config.yaml."),
    ] = None,
) -> None:
    """Print the LiteLLM config.yaml the litellm role would deploy for INVENTORY (contacts no host)."""
    if not inventory.exists():
        typer.echo(f"error: --inventory {inventory}: no such file or directory", err=True)
        raise typer.Exit(int(Exit.USAGE))
    callbacks: dict[str, dict[str, str]] = {}
    configs, failures = render(inventory, callbacks)
    if failures or not configs:
        for failure in failures or [f"no host in gateway_hosts of {inventory}"]:
            typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(int(Exit.FAILED))
    if callbacks_out is not None:
        if not callbacks:
            typer.echo("error: the callbacks were not rendered", err=True)
            raise typer.Exit(int(Exit.FAILED))
        callbacks_out.mkdir(parents=True, exist_ok=True)
        for name, text in callbacks[min(callbacks)].items():
            (callbacks_out / name).write_text(text, encoding="utf-8")
    for host, text in sorted(configs.items()):
        if len(configs) > 1:
            typer.echo(f"# --- gateway host {host}")
        typer.echo(text if show_secrets else mask_secrets(text), nl=not text.endswith("\n"))
