"""``labctl gateway-config``: the LiteLLM config.yaml the litellm role would deploy for an inventory.

The litellm role renders it itself (playbooks/gateway-config.yml runs its ``render.yml`` entry on
the control node through ansible-runner), so this module holds no copy of the template logic.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Annotated, Any

import ansible_runner  # type: ignore[import-untyped]
import typer

from labctl.paths import repo_root
from labctl.runs.exitcodes import Exit
from labctl.runs.playbook import ansible_path

PLAYBOOK = "playbooks/gateway-config.yml"
RENDER_TASK = "Print the proxy configuration"
ADMISSION_TASK = "Print the priority admission callback"
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


def render(inventory: Path, admission: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """Run the playbook; returns the config per gateway host and the failure messages (and fills
    ``admission`` with each host's labctl_admission.py when given)."""
    configs: dict[str, str] = {}
    failures: list[str] = []

    def handler(event: dict[str, Any]) -> bool:
        data = event.get("event_data") or {}
        host = str(data.get("host") or "")
        raw = data.get("res")
        res: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if event.get("event") == "runner_on_ok" and str(data.get("task", "")).endswith(RENDER_TASK):
            configs[host] = str(res.get("msg", ""))
        elif event.get("event") == "runner_on_ok" and str(data.get("task", "")).endswith(ADMISSION_TASK):
            if admission is not None:
                admission[host] = str(res.get("msg", ""))
        elif event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            failures.append(f"{host}: {data.get('task')}: {res.get('msg', res)}")
        return True

    with tempfile.TemporaryDirectory(prefix="labctl-gateway-config-") as private:
        result = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(repo_root()),
            playbook=str(repo_root() / PLAYBOOK),
            inventory=str(inventory.resolve()),
            event_handler=handler,
            quiet=True,
            envvars={"ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", "PATH": ansible_path()},
        )
        if result.status != "successful" and not failures:
            outputs = sorted(Path(private).glob("artifacts/*/stdout"))
            tail = outputs[-1].read_text(errors="replace").strip().splitlines()[-10:] if outputs else []
            failures.append("ansible-playbook failed: " + " / ".join(tail))
    return configs, failures


def gateway_config(
    inventory: Annotated[Path, typer.Option("--inventory", "-i", help="Inventory directory or file.")],
    show_secrets: Annotated[bool, typer.Option("--show-secrets", help="Print literal secrets instead of a mask.")] = False,
    admission_out: Annotated[
        Path | None,
        typer.Option("--admission-out", help="Also write the priority admission callback (labctl_admission.py) here."),
    ] = None,
) -> None:
    """Print the LiteLLM config.yaml the litellm role would deploy for INVENTORY (contacts no host)."""
    if not inventory.exists():
        typer.echo(f"error: --inventory {inventory}: no such file or directory", err=True)
        raise typer.Exit(int(Exit.USAGE))
    admission: dict[str, str] = {}
    configs, failures = render(inventory, admission)
    if failures or not configs:
        for failure in failures or [f"no host in gateway_hosts of {inventory}"]:
            typer.echo(f"error: {failure}", err=True)
        raise typer.Exit(int(Exit.FAILED))
    if admission_out is not None:
        if not admission:
            typer.echo("error: the admission callback was not rendered", err=True)
            raise typer.Exit(int(Exit.FAILED))
        admission_out.write_text(admission[sorted(admission)[0]], encoding="utf-8")
    for host, text in sorted(configs.items()):
        if len(configs) > 1:
            typer.echo(f"# --- gateway host {host}")
        typer.echo(text if show_secrets else mask_secrets(text), nl=not text.endswith("\n"))
