"""The vllm role's filters."""

from __future__ import annotations

import itertools
from typing import Any


def labctl_restart_queue(replicas: list[dict[str, Any]], hosts: list[str], hostvars: Any) -> list[dict[str, Any]]:
    """The replicas to restart, host by host in play order: the topology's replicas (``replicas``,
    lab_topology.replicas) whose index each host's vllm role marked (its ``vllm_restart_pending``)."""
    queue = []
    for host in hosts:
        marked = set(hostvars[host].get("vllm_restart_pending") or [])
        queue += [dict(r) for r in replicas if r.get("host") == host and r["index"] in marked]
    return queue


def labctl_gpu_start_order(plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The replicas of one host that share a GPU with another, each with the order they start in.

    vLLM 0.32.0 counts every change of its GPU's memory while it profiles as its own and asserts that
    free memory did not rise meanwhile (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory:
    "we assume that the other processes using the same GPU did not change their memory usage"), and
    wants its share free when it starts (vllm/v1/worker/utils.py, request_memory). So the replicas of
    one GPU start one after another, each serving before the next starts: on each GPU in index order
    (model by model), each replica after the one before it on every GPU it uses.

    Returns a copy of each such replica (``plan``: the host's replicas, vllm_replica_plan) with
    ``start_after`` (the indexes just before it on its GPUs, sorted; empty for the first) and
    ``start_before`` (whether a replica comes after it on one of its GPUs), in index order; a replica
    alone on its GPUs is not listed (its unit has no drop-in: a one-model lab renders as before)."""
    on: dict[str, list[int]] = {}
    for r in sorted(plan, key=lambda r: int(r["index"])):
        for gpu in str(r["gpus"]).split(","):
            on.setdefault(gpu.strip(), []).append(int(r["index"]))
    after: dict[int, set[int]] = {}
    before: set[int] = set()
    for indexes in on.values():
        for earlier, later in itertools.pairwise(indexes):
            after.setdefault(later, set()).add(earlier)
            before.add(earlier)
    return [{**r, "start_after": sorted(after.get(int(r["index"]), set())), "start_before": int(r["index"]) in before}
            for r in sorted(plan, key=lambda r: int(r["index"])) if int(r["index"]) in after or int(r["index"]) in before]


def labctl_max_logprobs(limits: dict[str, Any]) -> int:
    """--max-logprobs for the replicas: the largest limit of ``limits`` (lab_logprobs_limits: per key class,
    top_logprobs and prompt_logprobs, each a whole number or null for none), 0 when none allows any."""
    from ansible.errors import AnsibleFilterError

    found = [0]
    for name, entry in (limits or {}).items():
        if not isinstance(entry, dict) or set(entry) - {"top_logprobs", "prompt_logprobs"}:
            raise AnsibleFilterError(f"lab_logprobs_limits: {name}: want {{top_logprobs: N, prompt_logprobs: N}}, not {entry!r}")
        for field, value in entry.items():
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise AnsibleFilterError(f"lab_logprobs_limits: {name}.{field}: a whole number from 0 or null, not {value!r}")
            found.append(value)
    return max(found)


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "labctl_restart_queue": labctl_restart_queue,
            "labctl_gpu_start_order": labctl_gpu_start_order,
            "labctl_max_logprobs": labctl_max_logprobs,
        }
