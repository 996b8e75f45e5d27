"""``labctl plan -i INVENTORY``: the memory plan of every gpu_hosts host (see ``labctl.plan``).

Settings come from the inventory (``ansible-inventory --list``, with the plays' variable
precedence) over the vLLM role's defaults (roles/vllm/defaults/main.yml); options override both.
GPU sizes come from ``--gpu NAME:MiB``, from ``--facts FILE`` (labctl_gpu_facts output saved with
``ansible -i INV gpu_hosts -m labctl_gpu_facts > FILE``, an ``ansible_facts``/``gpus`` JSON, or a
tests/fixtures/nvidia-smi data table), or else from a live ``ansible ... -m labctl_gpu_facts`` run.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from labctl.ansible_run import InventoryError, list_inventory, run_playbook
from labctl.paths import repo_root
from labctl.plan import DEFAULT_REQUEST_TOKENS, Gpu, HostPlan
from labctl.plan_hosts import HostReport, InputError, Overrides, plan_for_host

GPU_GROUP = "gpu_hosts"
# One host's result in `ansible -m MODULE` output: "gpu01 | SUCCESS => {...}".
_ADHOC = re.compile(r"^(\S+) \| ([A-Z]+!?)(?: \| rc=\d+)? => ", re.MULTILINE)


# --- inventory ----------------------------------------------------------------------------------


def _group_hosts(data: dict[str, Any], group: str, seen: set[str] | None = None) -> list[str]:
    seen = set() if seen is None else seen
    if group in seen:
        return []
    seen.add(group)
    entry = data.get(group) or {}
    hosts = list(entry.get("hosts") or [])
    for child in entry.get("children") or []:
        hosts += [h for h in _group_hosts(data, child, seen) if h not in hosts]
    return hosts


def read_inventory(inventory: Path) -> dict[str, dict[str, Any]]:
    """Hostvars of every gpu_hosts host, group_vars merged, as the plays in playbooks/ see them."""
    if not inventory.exists():
        raise InputError(f"inventory {inventory}: no such file or directory")
    try:
        data = list_inventory(inventory)
    except InventoryError as exc:
        raise InputError(str(exc)) from exc
    hosts = _group_hosts(data, GPU_GROUP)
    if not hosts:
        raise InputError(f"inventory {inventory} has no hosts in group {GPU_GROUP}")
    hostvars = data.get("_meta", {}).get("hostvars", {})
    return {host: dict(hostvars.get(host) or {}) for host in hosts}


# --- GPU facts ----------------------------------------------------------------------------------


def _gpu(entry: Any, position: int, where: str) -> Gpu:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: GPU {position} is not a mapping: {entry!r}")
    name = str(entry.get("name") or f"GPU {entry.get('index', position)}")
    raw = entry.get("memory_total_mib", entry.get("memory.total"))
    try:
        memory = int(str(raw).strip())
    except ValueError:
        raise InputError(
            f"{where}: GPU {entry.get('index', position)} ({name}) reports no memory size ({raw!r}); "
            f'give it with --gpu "{name}:MiB"'
        ) from None
    if memory <= 0:
        raise InputError(f"{where}: GPU {entry.get('index', position)} ({name}) has {memory} MiB")
    return Gpu(name, memory)


def _gpus_of(data: Any, where: str) -> list[Gpu]:
    """GPUs from a list of GPU entries, {"gpus": [...]}, or {"ansible_facts": {"gpus": [...]}}."""
    if isinstance(data, dict) and isinstance(data.get("ansible_facts"), dict):
        data = data["ansible_facts"]
    if isinstance(data, dict):
        if "gpus" not in data:
            raise InputError(f"{where}: no 'gpus' list (expected labctl_gpu_facts output or an nvidia-smi table)")
        reason = data.get("gpu_facts_reason")
        data = data["gpus"]
        if not data:
            raise InputError(f"{where}: no GPUs" + (f" ({reason})" if reason else ""))
    if not isinstance(data, list) or not data:
        raise InputError(f"{where}: expected a non-empty list of GPUs")
    return [_gpu(entry, i, where) for i, entry in enumerate(data)]


def parse_adhoc(text: str, where: str) -> dict[str | None, list[Gpu]]:
    """GPUs per host from ``ansible HOSTS -m labctl_gpu_facts`` output ("host | SUCCESS => {...}")."""
    decoder = json.JSONDecoder()
    found: dict[str | None, list[Gpu]] = {}
    for match in _ADHOC.finditer(text):
        host, status = match.groups()
        try:
            result, _end = decoder.raw_decode(text, match.end())
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: cannot read {host}'s result: {exc}") from exc
        if status not in ("SUCCESS", "CHANGED"):
            raise InputError(f"{where}: {host}: {status} {result.get('msg', '')}".rstrip())
        found[host] = _gpus_of(result, f"{where} ({host})")
    if not found:
        raise InputError(f"{where}: neither JSON nor `ansible -m labctl_gpu_facts` output")
    return found


def load_facts(path: Path) -> dict[str | None, list[Gpu]]:
    """GPUs from a saved facts file: per host for ad-hoc output, else one machine (key None)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"--facts {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return parse_adhoc(text, str(path))
    return {None: _gpus_of(data, str(path))}


def gather_facts(inventory: Path) -> dict[str | None, list[Gpu]]:
    """Run labctl_gpu_facts (library/labctl_gpu_facts.py) on every gpu_hosts host over the inventory's own
    connection settings (playbooks/gpu-facts.yml; become off: nvidia-smi needs no root)."""
    where = f"playbooks/gpu-facts.yml -i {inventory}"
    result = run_playbook(repo_root() / "playbooks" / "gpu-facts.yml", inventory, args=["-e", "ansible_become=false"])
    facts = result.data.get("labctl_gpu_facts") or {}
    if result.status != "successful" or not facts:
        last = result.output_tail.splitlines()[-1:]
        why = "; ".join(result.failures) or (last[0] if last else result.status)
        raise InputError(f"{where} failed: {why}; give --facts FILE or --gpu NAME:MiB")
    return {str(host): _gpus_of(entry, f"{where} ({host})") for host, entry in facts.items()}


def parse_gpu_option(text: str) -> Gpu:
    name, sep, size = text.rpartition(":")
    try:
        memory = int(size.strip())
    except ValueError:
        memory = 0
    if not sep or not name.strip() or memory <= 0:
        raise InputError(f'--gpu {text!r}: expected "NAME:MiB", e.g. "NVIDIA H200:143771"')
    return Gpu(name.strip(), memory)


# --- the report ---------------------------------------------------------------------------------


def to_json(inventory: Path, source: str, reports: list[HostReport]) -> dict[str, Any]:
    hosts = []
    for report in reports:
        plan = report.plan
        hosts.append(
            {
                "host": report.host,
                "model": asdict(plan.model),
                "settings": asdict(plan.settings),
                "settings_origin": report.origins,
                "request_tokens": plan.request_tokens,
                "gpus": [{"index": i, "name": g.name, "memory_mib": g.memory_mib} for i, g in enumerate(plan.gpus)],
                "replicas": [
                    {
                        "index": r.index,
                        "gpus": list(r.gpus),
                        "gpu_name": r.gpu_name,
                        "memory_gib": round(r.memory.memory_gib, 2),
                        "budget_gib": round(r.memory.budget_gib, 2),
                        "weights_gib": round(r.memory.weights_gib, 2),
                        "overhead_gib": round(r.memory.overhead_gib, 2),
                        "kv_cache_gib": round(r.memory.kv_cache_gib, 2),
                        "kv_share": round(r.memory.kv_share, 4),
                        "kv_tokens": r.memory.kv_tokens,
                        "full_context_sequences": round(r.full_context_sequences, 2),
                        "concurrency": r.concurrency,
                        "warnings": list(r.warnings),
                    }
                    for r in plan.replicas
                ],
                "warnings": report.warnings(),
                "recommendation": asdict(plan.recommendation),
            }
        )
        if report.gpu_shares:
            hosts[-1]["placement"] = {
                "replicas": [{k: r[k] for k in ("model", "index", "port", "gpus", "gpu_memory_utilization", "kind")}
                             for r in report.placement],
                "gpu_shares": {str(g): v for g, v in sorted(report.gpu_shares.items())},
            }
    return {"inventory": str(inventory), "gpu_source": source, "hosts": hosts}


_COLUMNS = ("replica", "GPUs", "budget", "weights", "overhead", "KV cache", "KV share", "KV tokens",
            "max-len seqs", "requests")


# The same columns, narrow enough for an 80-column terminal.
_RICH_COLUMNS = ("#", "GPUs", "budget", "weights", "over-\nhead", "KV\ncache", "KV\nshare", "KV\ntokens",
                 "max-len\nseqs", "requests")


def _rows(plan: HostPlan) -> list[tuple[str, ...]]:
    return [
        (
            str(r.index),
            ",".join(str(g) for g in r.gpus),
            f"{r.memory.budget_gib:.1f}",
            f"{r.memory.weights_gib:.1f}",
            f"{r.memory.overhead_gib:.1f}",
            f"{r.memory.kv_cache_gib:.1f}",
            f"{r.memory.kv_share:.1%}",
            f"{r.memory.kv_tokens:,}",
            f"{r.full_context_sequences:.1f}",
            f"{r.concurrency:,}",
        )
        for r in plan.replicas
    ]


def _header(report: HostReport) -> list[str]:
    plan, s = report.plan, report.plan.settings
    model = plan.model
    kinds = Counter((g.name, g.memory_mib) for g in plan.gpus)
    sizes = [f"{n} x {name} ({mib / 1024:.1f} GiB)" for (name, mib), n in sorted(kinds.items())]
    context = f", context {model.max_context:,}" if model.max_context else ""
    return [
        f"{report.host}: {', '.join(sizes)}",
        (f"model {model.name}: weights {model.weights_gib:.1f} GiB, overhead {model.overhead_gib:.1f} GiB "
        f"per GPU, KV {model.kv_bytes_per_token:,} bytes per token{context} ({model.source})"),
        (f"settings: gpu_memory_utilization {s.gpu_memory_utilization:.2f}, max_model_len "
        f"{s.max_model_len:,}, max_num_seqs {s.max_num_seqs}, tensor_parallel_size "
        f"{s.tensor_parallel_size}, replicas {s.replicas or 'auto'} -> {len(plan.replicas)}"),
        (f"(budget to KV cache: GiB per GPU; KV tokens: per replica; max-len seqs: KV tokens / "
        f"max_model_len; requests: KV tokens / {plan.request_tokens:,} tokens per request)"),
    ]


def _recommendation(report: HostReport) -> str:
    rec = report.plan.recommendation
    return ("recommendation: " if rec.fits else "recommendation (does not fit): ") + rec.reason


def render_plain(reports: list[HostReport], width: int = 100) -> str:
    lines: list[str] = []
    for report in reports:
        head = _header(report)
        for line in head[:3]:
            lines += textwrap.wrap(line, width, subsequent_indent="  ")
        rows = [_COLUMNS, *_rows(report.plan)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
        for row in rows:
            lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        lines += textwrap.wrap(head[3], width, initial_indent="  ", subsequent_indent="  ")
        warnings = report.warnings()
        lines.append("warnings: none" if not warnings else "warnings:")
        for warning in warnings:
            lines += textwrap.wrap(warning, width, initial_indent="  - ", subsequent_indent="    ")
        lines += textwrap.wrap(_recommendation(report), width, subsequent_indent="  ")
        placement = report.placement_lines()
        if placement:
            lines.append("models (lab_models), each GPU's memory shares:")
            for line in placement:
                lines += textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="    ")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_rich(reports: list[HostReport], console: Console) -> None:
    for report in reports:
        head = _header(report)
        table = Table(
            box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False, caption=head[3], caption_justify="left"
        )
        for title in _RICH_COLUMNS:
            table.add_column(title, justify="right", no_wrap=True)
        for row in _rows(report.plan):
            table.add_row(*row)
        console.print(head[0], style="bold", markup=False, highlight=False)
        console.print(head[1], markup=False, highlight=False)
        console.print(head[2], markup=False, highlight=False)
        console.print(table)
        for warning in report.warnings():
            console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
        style = "green" if report.plan.recommendation.fits else "red"
        console.print(_recommendation(report), style=style, markup=False, highlight=False)
        placement = report.placement_lines()
        if placement:
            console.print("models (lab_models), each GPU's memory shares:", markup=False, highlight=False)
            for line in placement:
                console.print(f"  {line}", markup=False, highlight=False)
        console.print()


# --- the command --------------------------------------------------------------------------------


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def plan_command(
    inventory: Annotated[Path, typer.Option("-i", "--inventory", help="Ansible inventory (file or directory).")],
    facts: Annotated[
        Path | None,
        typer.Option(help="Saved GPU facts: `ansible -m labctl_gpu_facts` output, labctl_gpu_facts JSON or an nvidia-smi table."),
    ] = None,
    gpu: Annotated[
        list[str] | None, typer.Option(help='A GPU as "NAME:MiB" (e.g. "NVIDIA H200:143771"); repeat per GPU.')
    ] = None,
    model: Annotated[str | None, typer.Option(
        help="Model profile (default: lab_model_name); with lab_models: the model whose replicas are listed.")] = None,
    gpu_memory_utilization: Annotated[float | None, typer.Option(help="Override vllm_gpu_memory_utilization.")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Override vllm_max_model_len.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Override vllm_max_num_seqs.")] = None,
    tensor_parallel_size: Annotated[int | None, typer.Option(help="Override vllm_tensor_parallel_size.")] = None,
    replicas: Annotated[int | None, typer.Option(help="Override vllm_replicas (0: one per GPU group).")] = None,
    request_tokens: Annotated[
        int, typer.Option(help="Tokens of a typical request (the lab's average: 2,380).")
    ] = DEFAULT_REQUEST_TOKENS,
    weights_gib: Annotated[float | None, typer.Option(help="Override the model's weights (GiB).")] = None,
    kv_bytes_per_token: Annotated[int | None, typer.Option(help="Override the model's KV bytes per token.")] = None,
    overhead_gib: Annotated[float | None, typer.Option(help="Override the per-GPU runtime overhead (GiB).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Memory budget per GPU, KV-cache tokens, concurrency and a layout recommendation.

    Without --facts or --gpu: `ansible -i INVENTORY gpu_hosts -m labctl_gpu_facts` reads the GPUs live.
    """
    given = Overrides(
        model=model,
        weights_gib=weights_gib,
        kv_bytes_per_token=kv_bytes_per_token,
        overhead_gib=overhead_gib,
        settings={
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "max_num_seqs": max_num_seqs,
            "tensor_parallel_size": tensor_parallel_size,
            "replicas": replicas,
        },
        request_tokens=request_tokens,
    )
    try:
        if facts is not None and gpu:
            raise InputError("give --facts or --gpu, not both")
        hosts = read_inventory(inventory)
        if gpu:
            gpus_by_host: dict[str | None, list[Gpu]] = {None: [parse_gpu_option(g) for g in gpu]}
            source = "--gpu"
        elif facts is not None:
            gpus_by_host, source = load_facts(facts), str(facts)
        else:
            gpus_by_host, source = gather_facts(inventory), "labctl_gpu_facts (live)"
        reports = []
        for host, hostvars in hosts.items():
            gpus = gpus_by_host.get(host, gpus_by_host.get(None))
            if gpus is None:
                known = ", ".join(sorted(h for h in gpus_by_host if h)) or "none"
                raise InputError(f"{source}: no GPU facts for {host} (hosts there: {known})")
            reports.append(plan_for_host(host, hostvars, gpus, given))
    except InputError as exc:
        _fail(str(exc))
    if as_json:
        sys.stdout.write(json.dumps(to_json(inventory, source, reports), indent=2) + "\n")
    elif sys.stdout.isatty():
        render_rich(reports, Console())
    else:
        sys.stdout.write(f"GPUs from {source}\n\n" + render_plain(reports))
