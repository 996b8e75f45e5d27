"""The vllm role's filters."""

from __future__ import annotations

from typing import Any


def labctl_restart_queue(replicas: list[dict[str, Any]], hosts: list[str], hostvars: Any) -> list[dict[str, Any]]:
    """The replicas to restart, host by host in play order: the topology's replicas (``replicas``,
    lab_topology.replicas) whose index each host's vllm role marked (its ``vllm_restart_pending``)."""
    queue = []
    for host in hosts:
        marked = set(hostvars[host].get("vllm_restart_pending") or [])
        queue += [dict(r) for r in replicas if r.get("host") == host and r["index"] in marked]
    return queue


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_restart_queue": labctl_restart_queue,
        }
