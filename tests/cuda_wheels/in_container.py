#!/usr/bin/python3
"""Runs inside the network-less target container with the venv's python (tests/cuda_wheels/check.py):
the CUDA vLLM wheel set imports, its argument parser takes the replicas' configs, and harmony loads
gpt-oss's encoding from the bundle's tiktoken files only. Prints one JSON object.
usage: in_container.py REPLICA_CONFIG..."""
import json
import os
import sys
import time

result = {}
started = time.monotonic()
import torch  # noqa: E402

result["torch"] = torch.__version__
result["torch_cuda"] = torch.version.cuda
result["torch_cuda_available"] = torch.cuda.is_available()
import vllm  # noqa: E402

result["vllm"] = vllm.__version__
result["import_s"] = round(time.monotonic() - started, 1)
# No GPU and no driver here: vLLM's platform detection finds none, its config defaults cannot name
# a device, and its CUDA platform class cannot even be imported (vllm._C links libcuda.so.1, the
# driver's library). The flags, their types and choices do not depend on the platform
# (EngineArgs, FrontendArgs): a minimal platform that names the CUDA device lets the parser be
# built as on a GPU host. Nothing else of vLLM runs.
import vllm.platforms  # noqa: E402
from vllm.platforms.interface import Platform, PlatformEnum  # noqa: E402


class _CudaNamed(Platform):
    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"


vllm.platforms._current_platform = _CudaNamed()
result["platform"] = "minimal CUDA-named platform (no GPU, no libcuda.so.1 here)"

# What `python -m vllm.entrypoints.openai.api_server` (the vllm@ unit's ExecStart) runs to read its
# flags: vllm/entrypoints/launchers/api_server/entry.py main() in 0.33.
try:
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:  # before the launchers move
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402

parsed = {}
for config in sys.argv[1:]:
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(["--config", config])
    validate_parsed_serve_args(args)
    parsed[os.path.basename(config)] = {
        key: getattr(args, key)
        for key in ("model", "served_model_name", "host", "port", "tensor_parallel_size", "max_model_len",
                    "max_num_batched_tokens", "max_num_seqs", "scheduling_policy", "enable_prefix_caching",
                    "gpu_memory_utilization", "disable_access_log_for_endpoints")
        if hasattr(args, key)
    }
result["replicas"] = parsed
# The check can fail: a flag this vLLM does not know is refused the way the unit's start would be.
bogus = "/tmp/bogus.yaml"
with open(sys.argv[1]) as source, open(bogus, "w") as out:
    out.write(source.read() + "not-a-vllm-flag: 1\n")
try:
    make_arg_parser(FlexibleArgumentParser()).parse_args(["--config", bogus])
    result["unknown_flag_refused"] = False
except SystemExit:
    result["unknown_flag_refused"] = True
from openai_harmony import HarmonyEncodingName, load_harmony_encoding  # noqa: E402

encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
result["harmony_tokens_of_hello"] = len(encoding.encode("hello world", allowed_special="all"))
print(json.dumps(result, default=str))
