"""The Prometheus textfile a run leaves on every host it reached (contract:
docs/runbooks/monitoring.md, "Provisioning metrics"; alerts in roles/prometheus)."""

from __future__ import annotations

from labctl.runs.records import HostStats

METRICS = (
    ("labctl_last_run_timestamp_seconds", "Unix time the last labctl run of this command ended."),
    ("labctl_last_run_success", "1 if the last labctl run of this command succeeded on this host."),
    ("labctl_last_run_changed_tasks", "Tasks the last labctl run of this command changed on this host."),
    ("labctl_last_run_failed_tasks", "Tasks that failed on this host in the last labctl run of this command."),
    ("labctl_last_run_drift_tasks", "Tasks the last drift check found that would change this host."),
    ("labctl_last_run_duration_seconds", "Seconds the last labctl run of this command took."),
)


def file_name(command: str) -> str:
    return f"labctl_{command.replace('-', '_')}.prom"


def render(command: str, inventory: str, stats: HostStats, ended: float, duration: float, interrupted: bool) -> str:
    success = stats.failed == 0 and stats.unreachable == 0 and not interrupted
    drift = stats.changed if command == "drift" else 0
    values = (int(ended), int(success), 0 if command == "drift" else stats.changed, stats.failed, drift,
              round(duration, 1))
    labels = f'{{command="{command}",inventory="{inventory}"}}'
    lines = []
    for (name, help_text), value in zip(METRICS, values, strict=True):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{labels} {value}"]
    return "\n".join(lines) + "\n"
