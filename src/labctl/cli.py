"""The ``labctl`` command line; each area registers its own Typer sub-app here."""

from __future__ import annotations

import typer

from labctl import __version__
from labctl.bundle.cli import app as bundle_app
from labctl.gateway_config import gateway_config
from labctl.helptext import HelpGroup
from labctl.keys_cli import keys_app
from labctl.plan_cli import plan_command
from labctl.runs import cli as runs_cli

app = typer.Typer(
    name="labctl",
    cls=HelpGroup,  # reflows every command's help: docstrings' line breaks are not the screen's
    help="Build and verify offline bundles and drive the air-gapped lab playbooks.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(bundle_app, name="bundle")
app.command("plan")(plan_command)
app.command("provision")(runs_cli.provision)
app.command("drift")(runs_cli.drift)
app.command("status")(runs_cli.status)
app.command("smoke")(runs_cli.smoke)
app.command("rolling-restart")(runs_cli.rolling_restart)
app.command("patch")(runs_cli.patch)
app.command("gpu-clear")(runs_cli.gpu_clear)
app.add_typer(runs_cli.runs_app, name="runs")
app.command("gateway-config")(gateway_config)
app.add_typer(keys_app, name="keys")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"labctl {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """labctl: offline bundles for air-gapped GPU LLM servers."""
