"""Every download the start-up of the pinned vLLM could make for gpt-oss on Hopper, and the proof
that the bundle satisfies it. Runs in the network-less target container with the venv's python
(in_container.py), under a guard that records every attempt to reach a host; the environment is the
replicas' own, read from the files the roles render (vllm.env, tiktoken.env) as systemd reads them.

The list comes from reading the pinned sources (vLLM 0.32.0, FlashInfer 0.7.0.post1, oss-harmony 0.0.11;
docs/bundle.md, "The CUDA line"):

| id | what would be fetched | from (source) | satisfied by |
|---|---|---|---|
| hf-hub | model config, tokenizer, generation config | huggingface.co (huggingface_hub; vllm/transformers_utils/config.py, repo_utils.py, tokenizers/registry.py, model_loader/weight_utils.py) | a local model directory and HF_HUB_OFFLINE=1 (vllm.env) |
| modelscope | the same from ModelScope | modelscope.cn, only with VLLM_USE_MODELSCOPE=1 (vllm/envs.py) | not set |
| usage-stats | the usage report at engine start | VLLM_USAGE_STATS_SERVER, https://stats.vllm.ai (vllm/usage/usage_lib.py) | VLLM_NO_USAGE_STATS=1, DO_NOT_TRACK=1 |
| harmony-vocab | o200k_base for gpt-oss's harmony format | openaipublic.blob.core.windows.net (oss-harmony) | TIKTOKEN_ENCODINGS_BASE = the bundle's tiktoken files (tiktoken.env) |
| artifactory-probe | a GET of NVIDIA's cubin artifactory, to decide whether TRTLLM attention can be used: reached on Hopper, the attention selector validates FlashInfer's backend for gpt-oss's sinks | FLASHINFER_CUBINS_REPOSITORY, edge.urm.nvidia.com (vllm/utils/flashinfer.py: has_nvidia_artifactory; v1/attention/backends/flashinfer.py: supports_sink) | the replicas' `attention-config: {use_trtllm_attention: false}` (replica-<i>.yaml, with no cubins in the bundle): supports_sink answers before the probe; or flashinfer-cubin installed |
| flashinfer-cubins | cubins and their headers | FLASHINFER_CUBINS_REPOSITORY (flashinfer/jit/cubin_loader.py: get_artifact) into ~/.cache/flashinfer/cubins | nothing on the Hopper gpt-oss path fetches one (trtllm-gen, XQA, sm100 kernels do); FLASHINFER_NO_DOWNLOAD=1 (vllm.env) turns an unexpected fetch into an error; with flashinfer-cubin in the set, its files |
| flashinfer-jit | vLLM's FlashInfer sampler (top-k/top-p, on by default on Hopper): the `sampling` module, compiled with nvcc at the first top_p/top_k request (and the all-reduce modules at TP > 1, at start) | no URL: nvcc at CUDA_HOME, ninja on PATH (flashinfer/jit/core.py, cpp_ext.py; vllm/v1/sample/ops/topk_topp_sampler.py) | the set's own CUDA 13 compiler (cuda-toolkit[nvcc,cccl]) as CUDA_HOME, of torch's CUDA major, and the venv's ninja on PATH (vllm.env); the vllm role builds the modules before the start (files/labctl-flashinfer-prebuild, run in the container by tests/bundle/test_lab_vllm_offline.py); or flashinfer-jit-cache + its sm90a provider |
| triton | the MoE (OAI triton_kernels, vendored in vllm/third_party) and torch.compile kernels | no URL: ptxas bundled in the triton wheel; gcc and Python headers from the bundle's apt part | the triton wheel's ptxas; vllm_system_packages |

Not on that path (and why) is REVIEWED below: every other place in the installed vLLM and FlashInfer
that opens a connection. A file that is in neither list fails the check, so a new vLLM cannot add a
download without someone reading it.
"""  # noqa: E501 - the table above: one download a row

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import re
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# --- the replicas' environment -----------------------------------------------------------------


def load_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads the role's files (comments, blank lines
    skipped; the files quote nothing)."""
    values = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise SystemExit(f"{path}: not KEY=VALUE: {line!r}")
        values[key.strip()] = value.strip()
    return values


# --- the network guard -------------------------------------------------------------------------

ATTEMPTS: list[dict[str, str]] = []
_LOCAL = {None, "", "localhost", "127.0.0.1", "::1", "0.0.0.0"}


_TRANSPORT = ("urllib3/", "requests/", "httpx/", "httpcore/", "aiohttp/", "http/", "urllib/", "socket.py", "ssl.py")


def _caller() -> str:
    """The innermost frame of the installed code that asked for the connection (not the HTTP library)."""
    frames = [f for f in traceback.extract_stack()[:-3] if "offline_paths.py" not in f.filename]
    for frame in reversed(frames):
        if "site-packages/" in frame.filename:
            where = frame.filename.split("site-packages/", 1)[1]
            if not where.startswith(_TRANSPORT):
                return f"{where}:{frame.lineno}"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def install_guard() -> None:
    """Record and refuse every attempt to resolve or reach a host (the container has no network;
    this names who tried). Unix sockets and loopback stay allowed."""
    real_connect, real_connect_ex, real_getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def remote(sock: socket.socket, address: Any) -> bool:
        return sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL

    def connect(self: socket.socket, address: Any) -> None:
        if remote(self, address):
            ATTEMPTS.append({"host": str(address[0]), "port": str(address[1]), "by": _caller()})
            raise OSError(errno.ENETUNREACH, "no network (offline_paths guard)")
        return real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if remote(self, address):
            ATTEMPTS.append({"host": str(address[0]), "port": str(address[1]), "by": _caller()})
            return errno.ENETUNREACH
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in _LOCAL:
            ATTEMPTS.append({"host": str(name), "port": str(args[0] if args else ""), "by": _caller()})
            raise socket.gaierror(socket.EAI_NONAME, "no network (offline_paths guard)")
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]
    socket.getaddrinfo = getaddrinfo


def _watched(step: Callable[[], Any]) -> tuple[Any, list[dict[str, str]], str | None]:
    """step()'s value, the connection attempts it made, and its error (type: message) if it raised."""
    before = len(ATTEMPTS)
    try:
        value, error = step(), None
    except Exception as exc:  # reported, not raised: every item is evaluated
        value, error = None, f"{type(exc).__name__}: {str(exc)[:300]}"
    return value, ATTEMPTS[before:], error


# --- what the installed code does --------------------------------------------------------------

# Every file of the installed vLLM and FlashInfer that opens a connection (the pattern below), and
# why it is not on a replica's start-up: read in vLLM 0.32.0 and FlashInfer 0.7.0.post1.
REVIEWED: dict[str, str] = {
    # on the start-up path: items above
    "vllm/transformers_utils/config.py": "hf-hub: local model directory, HF_HUB_OFFLINE",
    "vllm/transformers_utils/repo_utils.py": "hf-hub: local model directory, HF_HUB_OFFLINE",
    "vllm/transformers_utils/utils.py": "modelscope: only with VLLM_USE_MODELSCOPE=1",
    "vllm/tokenizers/registry.py": "hf-hub / modelscope: local tokenizer files",
    "vllm/model_executor/model_loader/weight_utils.py": "hf-hub: weights are downloaded only for a hub id; the model is a local directory",
    "vllm/usage/usage_lib.py": "usage-stats: VLLM_NO_USAGE_STATS=1",
    "vllm/utils/flashinfer.py": "artifactory-probe: not reached with use_trtllm_attention false (or flashinfer-cubin)",
    "flashinfer/jit/cubin_loader.py": "flashinfer-cubins: nothing on the Hopper gpt-oss path fetches one; FLASHINFER_NO_DOWNLOAD=1",
    "flashinfer/artifacts.py": "flashinfer-cubins: `flashinfer download-cubin` (an operator's command, not the start)",
    # not on the start-up path of a local gpt-oss replica
    "flashinfer/attention/cute_dsl/fmha.py": "CuTe DSL FMHA kernels for sm100+ (Blackwell); Hopper uses vLLM's FlashAttention 3",
    "vllm/assets/base.py": "example and benchmark assets (vllm.assets), not used by the server",
    "vllm/assets/video.py": "example video assets, not used by the server",
    "vllm/benchmarks/datasets/create_txt_slices_dataset.py": "`vllm bench` datasets",
    "vllm/benchmarks/datasets/datasets.py": "`vllm bench` datasets",
    "vllm/benchmarks/serve.py": "`vllm bench serve`, a client",
    "vllm/benchmarks/sweep/server.py": "`vllm bench sweep`",
    "vllm/connections.py": "per request, not at start: media URLs in a request (image_url ...); gpt-oss takes text only",
    "vllm/distributed/kv_transfer/kv_connector/v1/hf3fs/hf3fs_metadata_server.py": "KV transfer connector (not configured)",
    "vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py": "KV transfer connector (not configured)",
    "vllm/distributed/weight_transfer/clients.py": "RL weight sync between trainer and engine (not configured)",
    "vllm/entrypoints/launchers/dp_supervisor.py": "data-parallel supervisor (not used: one replica per GPU)",
    "vllm/entrypoints/launchers/run_batch.py": "`vllm run-batch` input URLs",
    "vllm/lora/utils.py": "LoRA adapters from the hub (no LoRA configured)",
    "vllm/model_executor/model_loader/tensorizer.py": "--load-format tensorizer (not used)",
    "vllm/snapshot/runtime.py": "`vllm snapshot` probes a server it started",
    "vllm/tokenizers/kimi_audio.py": "Kimi-Audio's tokenizer",
}
_NETWORK_CALL = re.compile(
    r"(?<![\w.])requests\.(get|post|head|put|request|Session)\(|urlopen\(|urlretrieve\(|"
    r"(hf_hub_download|snapshot_download|list_repo_files|HfApi)\(|download_file\(|"
    r"aiohttp\.ClientSession\(|httpx\.(get|post|Client|AsyncClient)\("
)


def network_code(packages: tuple[str, ...] = ("vllm", "flashinfer")) -> list[str]:
    """Files of the installed packages that open a connection (relative to site-packages)."""
    found = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            if _NETWORK_CALL.search(path.read_text(errors="replace")):
                found.append(str(path.relative_to(root.parent)))
    return found


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cubin_files(cubin_dir: Path) -> dict[str, Any]:
    """FlashInfer's artifact manifests (flashinfer.artifacts: CheckSumHash.map_checksums, the
    checksums.txt of every artifact directory for this host's CPU) against the files under its
    FLASHINFER_CUBIN_DIR: what get_artifact() would read instead of downloading."""
    from flashinfer import artifacts

    cpu = artifacts._get_host_cpu_arch()
    dsl = artifacts.ArtifactPath.DSL_FMHA
    manifests = {path: sha for path, sha in artifacts.CheckSumHash.map_checksums.items()
                 if not path.startswith(dsl) or path.startswith(f"{dsl}{cpu}/")}
    bad_manifests, listed, present, missing = [], 0, 0, []
    for manifest, sha in sorted(manifests.items()):
        local = cubin_dir / manifest
        if not local.is_file() or _sha256(local) != sha:
            bad_manifests.append(manifest)
            continue
        base = manifest.rsplit("/", 1)[0]
        for line in local.read_text().splitlines():
            if not line.strip():
                continue
            digest, name = line.split()
            if not name.endswith((".cubin", ".h")):
                continue  # what `flashinfer download-cubin` fetches, and so what the wheel carries
            listed += 1
            path = cubin_dir / base / name
            if path.is_file() and _sha256(path) == digest:
                present += 1
            else:
                missing.append(f"{base}/{name}")
    return {"manifests": len(manifests), "bad_manifests": bad_manifests, "listed": listed,
            "present": present, "missing": missing[:5], "missing_count": len(missing)}


# --- the proof ---------------------------------------------------------------------------------


def _item(id_: str, url: str, needs: list[str], satisfied: bool, evidence: dict[str, Any],
          attempts: list[dict[str, str]], error: str | None) -> dict[str, Any]:
    return {"id": id_, "url": url, "needs": needs, "satisfied": bool(satisfied and not attempts and error is None),
            "evidence": evidence, "attempts": attempts, "error": error}


def prove(model_dir: str, attention_config: dict[str, Any]) -> dict[str, Any]:
    env = os.environ
    items = []

    def hub() -> dict[str, Any]:
        import huggingface_hub.constants as hub_constants
        from vllm.tokenizers.registry import get_tokenizer
        from vllm.transformers_utils.config import get_config, try_get_generation_config

        config = get_config(model_dir, trust_remote_code=False)
        tokenizer = get_tokenizer(model_dir)
        generation = try_get_generation_config(model_dir, trust_remote_code=False)
        return {"HF_HUB_OFFLINE": hub_constants.HF_HUB_OFFLINE, "endpoint": hub_constants.ENDPOINT,
                "config": type(config).__name__, "tokenizer": type(tokenizer).__name__,
                "generation_config": generation is not None}

    value, attempts, error = _watched(hub)
    items.append(_item("hf-hub", (value or {}).get("endpoint", "https://huggingface.co"), [],
                       bool(value and value["HF_HUB_OFFLINE"] and env.get("TRANSFORMERS_OFFLINE") == "1"),
                       value or {}, attempts, error))

    def modelscope() -> bool:
        import vllm.envs

        return bool(vllm.envs.VLLM_USE_MODELSCOPE)

    value, attempts, error = _watched(modelscope)
    items.append(_item("modelscope", "https://www.modelscope.cn", [], value is False,
                       {"VLLM_USE_MODELSCOPE": value}, attempts, error))

    def usage() -> dict[str, Any]:
        import vllm.envs
        from vllm.usage.usage_lib import is_usage_stats_enabled

        return {"enabled": is_usage_stats_enabled(), "server": vllm.envs.VLLM_USAGE_STATS_SERVER}

    value, attempts, error = _watched(usage)
    items.append(_item("usage-stats", (value or {}).get("server", ""), [], bool(value) and value["enabled"] is False,
                       value or {}, attempts, error))

    def harmony() -> dict[str, Any]:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        return {"TIKTOKEN_ENCODINGS_BASE": env.get("TIKTOKEN_ENCODINGS_BASE"),
                "tokens_of_hello_world": len(encoding.encode("hello world", allowed_special="all"))}

    value, attempts, error = _watched(harmony)
    items.append(_item("harmony-vocab", "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken", [],
                       bool(value), value or {}, attempts, error))

    def artifactory() -> dict[str, Any]:
        import vllm.utils.flashinfer as fi
        from vllm.config import AttentionConfig, VllmConfig, set_current_vllm_config
        from vllm.v1.attention.backends.flashinfer import FlashInferBackend

        # The attention selector validates every backend for gpt-oss's sinks, FlashInfer's included: its
        # supports_sink() reaches has_nvidia_artifactory() unless the replica's attention config says no.
        config = AttentionConfig(**attention_config)
        with set_current_vllm_config(VllmConfig(attention_config=config)):
            sinks = FlashInferBackend.supports_sink()
        return {"repository": fi.FLASHINFER_CUBINS_REPOSITORY, "has_flashinfer_cubin": fi.has_flashinfer_cubin(),
                "replica_attention_config": attention_config, "flashinfer_supports_sink": sinks}

    value, attempts, error = _watched(artifactory)
    items.append(_item("artifactory-probe", (value or {}).get("repository", ""), [],
                       bool(value) and (value["has_flashinfer_cubin"] or value["flashinfer_supports_sink"] is False),
                       value or {}, attempts, error))

    def cubins() -> dict[str, Any]:
        import flashinfer  # the whole package: what vLLM imports on CUDA
        from flashinfer.jit import cubin_loader
        from flashinfer.jit import env as fi_env

        package = importlib.util.find_spec("flashinfer_cubin")
        package_dir = None
        if package is not None:
            import flashinfer_cubin

            package_dir = str(Path(flashinfer_cubin.get_cubin_dir()).resolve())
        cubin_dir = Path(fi_env.FLASHINFER_CUBIN_DIR).resolve()
        return {"repository": cubin_loader.FLASHINFER_CUBINS_REPOSITORY, "FLASHINFER_CUBIN_DIR": str(cubin_dir),
                "flashinfer_cubin_package": package_dir, "flashinfer": flashinfer.__version__,
                "FLASHINFER_NO_DOWNLOAD": env.get("FLASHINFER_NO_DOWNLOAD"), **_cubin_files(cubin_dir)}

    value, attempts, error = _watched(cubins)
    if value and value["flashinfer_cubin_package"]:
        ok = (value["flashinfer_cubin_package"] == value["FLASHINFER_CUBIN_DIR"] and not value["bad_manifests"]
              and value["present"] > 0 and value["missing_count"] == 0)
    else:  # the default set: nothing on the Hopper gpt-oss path fetches a cubin, and a fetch is an error
        ok = bool(value)
    items.append(_item("flashinfer-cubins", (value or {}).get("repository", ""), [],
                       ok and (value or {}).get("FLASHINFER_NO_DOWNLOAD") == "1", value or {}, attempts, error))

    def jit() -> dict[str, Any]:
        import shutil
        import subprocess

        import torch
        import vllm.utils.flashinfer as fi
        from flashinfer.jit import cpp_ext
        from flashinfer.jit import env as fi_env
        from flashinfer.jit.sampling import gen_sampling_module

        spec = gen_sampling_module()
        artifacts = spec.aot_artifacts
        cuda_home = cpp_ext.get_cuda_path()
        nvcc = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"], capture_output=True, text=True,
                              check=False)
        release = re.search(r"release (\d+\.\d+)", nvcc.stdout)
        return {"module": spec.name, "targets": sorted(fi_env._target_cuda_architectures()),
                "aot": [{"provider": a.provider_id, "path": str(a.path), "exists": a.path.is_file()} for a in artifacts],
                "vllm_uses_flashinfer": fi.has_flashinfer(), "CUDA_HOME": env.get("CUDA_HOME"),
                "flashinfer_cuda_path": cuda_home, "nvcc_release": release.group(1) if release else None,
                "torch_cuda": torch.version.cuda, "ninja": shutil.which("ninja"),
                "would_compile_into": None if artifacts else str(spec.jit_library_path)}

    value, attempts, error = _watched(jit)
    if value and value["aot"]:
        ok = all(a["exists"] for a in value["aot"])
    else:  # compiled with the set's own compiler: of torch's CUDA major, found where FlashInfer looks
        ok = (bool(value) and value["flashinfer_cuda_path"] == value["CUDA_HOME"] and bool(value["nvcc_release"])
              and str(value["nvcc_release"]).split(".")[0] == str(value["torch_cuda"]).split(".")[0] and bool(value["ninja"]))
    items.append(_item("flashinfer-jit", "no URL: nvcc at CUDA_HOME compiles the `sampling` module", [],
                       ok and "sm90a" in (value or {}).get("targets", []), value or {}, attempts, error))

    def triton() -> dict[str, Any]:
        from triton import knobs
        from vllm.utils.import_utils import get_triton_kernels_version, has_triton_kernels

        ptxas = knobs.nvidia.ptxas.path
        return {"ptxas": ptxas, "ptxas_bundled": "site-packages/triton/backends/nvidia/bin/" in ptxas
                and os.access(ptxas, os.X_OK), "triton_kernels": has_triton_kernels(),
                "triton_kernels_api": get_triton_kernels_version()}

    value, attempts, error = _watched(triton)
    items.append(_item("triton", "no URL: ptxas from the triton wheel", [],
                       bool(value) and value["ptxas_bundled"] and value["triton_kernels"], value or {}, attempts, error))

    files, _, scan_error = _watched(network_code)
    unreviewed = sorted(set(files or []) - set(REVIEWED))
    items.append(_item("unreviewed-network-code", "any", [], not unreviewed and bool(files),
                       {"files": len(files or []), "unreviewed": unreviewed,
                        "reviewed_but_gone": sorted(set(REVIEWED) - set(files or []))}, [], scan_error))
    return {"target": "sm90a (FLASHINFER_CUDA_ARCH_LIST=9.0a: an H200's capability 9.0 as FlashInfer normalises it)",
            "items": items, "attempts": ATTEMPTS}


if __name__ == "__main__":
    sys.exit("imported by in_container.py")
