#!/usr/bin/python3
"""Runs inside the network-less target container with the venv's python (tests/bundle/test_lab_vllm_offline.py):
the CUDA vLLM wheel set imports, its argument parser takes the replicas' configs, and every download
the start-up of vLLM could make is satisfied from the bundle (offline_paths.py), with the replicas'
own environment (the rendered vllm.env and tiktoken.env) and every attempt to reach a host recorded.
Prints one JSON object.
usage: in_container.py --env FILE [--env FILE] --model DIR REPLICA_CONFIG..."""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import offline_paths

cli = argparse.ArgumentParser()
cli.add_argument("--env", action="append", default=[], help="an EnvironmentFile= of the replica unit, in order")
cli.add_argument("--model", required=True, help="a local model directory (config, tokenizer)")
cli.add_argument("configs", nargs="+")
opts = cli.parse_args()
# The unit's environment, before anything reads it (huggingface_hub reads HF_HUB_OFFLINE at import).
for env_file in opts.env:
    os.environ.update(offline_paths.load_env_file(env_file))
# FlashInfer detects the GPU's architecture; with none here, the H200's (capability 9.0 -> sm90a).
os.environ["FLASHINFER_CUDA_ARCH_LIST"] = "9.0a"
offline_paths.install_guard()

result = {}
started = time.monotonic()
import torch  # noqa: E402

result["torch"] = torch.__version__
result["torch_cuda"] = torch.version.cuda  # "13.0": the set's CUDA (lab_vllm_cuda_version)
result["torch_cuda_available"] = torch.cuda.is_available()
import vllm  # noqa: E402

result["vllm"] = vllm.__version__
result["import_s"] = round(time.monotonic() - started, 1)
# No GPU and no driver here: vLLM's platform detection finds none, its config defaults cannot name
# a device, and its CUDA platform class cannot even be imported (vllm._C links libcuda.so.1, the
# driver's library). The flags, their types and choices do not depend on the platform
# (EngineArgs, FrontendArgs): a minimal platform that names the CUDA device lets the parser be
# built as on a GPU host. What runs after it (offline_paths.prove) asks nothing of the platform.
import vllm.platforms  # noqa: E402
from vllm.platforms.interface import Platform, PlatformEnum  # noqa: E402


class _CudaNamed(Platform):  # type: ignore[misc]  # vLLM's class: only the container has vLLM
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"


vllm.platforms._current_platform = _CudaNamed()
result["platform"] = "minimal CUDA-named platform (no GPU, no libcuda.so.1 here)"

# What `vllm serve --config replica-<i>.yaml` (the vllm@ unit's ExecStart) runs to read its flags: the
# serve subcommand's parser and its validation (vllm/entrypoints/cli/serve.py, ServeSubcommand).
from vllm.entrypoints.cli.serve import ServeSubcommand  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def serve_parser() -> FlexibleArgumentParser:
    cli = FlexibleArgumentParser(description="vLLM CLI")
    return ServeSubcommand().subparser_init(cli.add_subparsers(dest="subparser"))


parsed = {}
attention: dict[str, object] = {}
for config in opts.configs:
    args = serve_parser().parse_args(["--config", config])
    ServeSubcommand().validate(args)
    parsed[os.path.basename(config)] = {
        key: getattr(args, key)
        for key in ("model", "served_model_name", "host", "port", "tensor_parallel_size", "max_model_len",
                    "max_num_batched_tokens", "max_num_seqs", "scheduling_policy", "enable_prefix_caching",
                    "gpu_memory_utilization", "disable_access_log_for_endpoints", "runner", "convert")
        if hasattr(args, key)
    }
    given = getattr(args, "attention_config", None)
    attention = given if isinstance(given, dict) else (vars(given) if given is not None else {})
    attention = {k: v for k, v in attention.items() if k == "use_trtllm_attention" and v is not None}
    parsed[os.path.basename(config)]["attention_config"] = attention
result["replicas"] = parsed
# The check can fail: a flag this vLLM does not know is refused the way the unit's start would be.
bogus = "/tmp/bogus.yaml"
with open(opts.configs[0]) as source, open(bogus, "w") as out:
    out.write(source.read() + "not-a-vllm-flag: 1\n")
try:
    serve_parser().parse_args(["--config", bogus])
    result["unknown_flag_refused"] = False
except SystemExit:
    result["unknown_flag_refused"] = True
result["offline"] = offline_paths.prove(opts.model, attention)
harmony = next(item for item in result["offline"]["items"] if item["id"] == "harmony-vocab")
result["harmony_tokens_of_hello"] = harmony["evidence"].get("tokens_of_hello_world")
print(json.dumps(result, default=str))
