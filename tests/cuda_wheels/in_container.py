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
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older layouts
    from vllm.utils import FlexibleArgumentParser
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402

parsed = {}
for config in sys.argv[1:]:
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-compatible server"))
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
from openai_harmony import HarmonyEncodingName, load_harmony_encoding  # noqa: E402

encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
result["harmony_tokens_of_hello"] = len(encoding.encode("hello world", allowed_special="all"))
print(json.dumps(result, default=str))
