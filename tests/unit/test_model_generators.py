"""scripts/make-tiny-model.py and scripts/make-synthetic-weights.py: deterministic, well-formed.

make-tiny-model.py needs tokenizers/safetensors/numpy; it re-runs itself in build/gen-venv and
creates that venv on first use (pip, ~15 s, needs PyPI once). The tensors are checked by
parsing the safetensors header here (8-byte length + JSON), so no library is needed in .venv.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from labctl.paths import repo_root

TINY = repo_root() / "scripts" / "make-tiny-model.py"
SYNTHETIC = repo_root() / "scripts" / "make-synthetic-weights.py"
FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}
EPOCH = 1748736000


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header: dict[str, Any] = json.loads(handle.read(length))
    return header, 8 + length


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "r1"
    proc = run(TINY, str(out))
    assert proc.stdout.strip() == str(out)
    return out


def test_tiny_model_is_deterministic(tiny: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    run(TINY, str(again))
    assert {p.name for p in tiny.iterdir()} == FILES
    for name in FILES:
        assert (again / name).read_bytes() == (tiny / name).read_bytes(), name
        assert (tiny / name).stat().st_mtime == EPOCH
    proc = run(TINY, str(again))  # unchanged files are not rewritten
    assert "unchanged" in proc.stderr


def test_tiny_model_config_and_tokenizer(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    expected = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 512,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    assert {key: config[key] for key in expected} == expected
    tokenizer = json.loads((tiny / "tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "BPE"
    assert tokenizer["pre_tokenizer"]["type"] == "ByteLevel"
    vocab = tokenizer["model"]["vocab"]
    assert config["vocab_size"] == len(vocab) and 256 < len(vocab) <= 512
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    assert specials == {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 3)
    tok_config = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (tok_config["bos_token"], tok_config["eos_token"], tok_config["pad_token"]) == ("<s>", "</s>", "<pad>")
    assert "add_generation_prompt" in tok_config["chat_template"]
    assert json.loads((tiny / "generation_config.json").read_text())["eos_token_id"] == 2


def test_tiny_model_tensors(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    header, data_start = safetensors_header(tiny / "model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt"}
    vocab, hidden, inter = config["vocab_size"], 128, 256
    expected = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for layer in range(2):
        p = f"model.layers.{layer}"
        expected |= {
            f"{p}.self_attn.q_proj.weight": [128, hidden],
            f"{p}.self_attn.k_proj.weight": [64, hidden],
            f"{p}.self_attn.v_proj.weight": [64, hidden],
            f"{p}.self_attn.o_proj.weight": [hidden, 128],
            f"{p}.mlp.gate_proj.weight": [inter, hidden],
            f"{p}.mlp.up_proj.weight": [inter, hidden],
            f"{p}.mlp.down_proj.weight": [hidden, inter],
            f"{p}.input_layernorm.weight": [hidden],
            f"{p}.post_attention_layernorm.weight": [hidden],
        }
    assert {name: info["shape"] for name, info in header.items()} == expected
    assert "lm_head.weight" not in header  # tied embeddings
    end = 0
    for info in sorted(header.values(), key=lambda i: i["data_offsets"][0]):
        assert info["dtype"] == "F32"
        start, stop = info["data_offsets"]
        assert start == end and stop - start == 4 * _numel(info["shape"])
        end = stop
    assert (tiny / "model.safetensors").stat().st_size == data_start + end


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def test_tiny_model_seed_changes_only_weights(tiny: Path, tmp_path: Path) -> None:
    r2 = tmp_path / "r2"
    run(TINY, str(r2), "--seed", "2")
    for name in FILES - {"model.safetensors"}:
        assert (r2 / name).read_bytes() == (tiny / name).read_bytes(), name
    assert (r2 / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    assert safetensors_header(r2 / "model.safetensors") == safetensors_header(tiny / "model.safetensors")


def test_tiny_model_refuses_foreign_dir(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep")
    proc = subprocess.run([sys.executable, str(TINY), str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "holds other files (precious.txt)" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_synthetic_weights(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    run(SYNTHETIC, str(a), "--files", "3", "--size", "5MiB")
    run(SYNTHETIC, str(b), "--files", "3", "--size", "5MiB")
    names = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert sorted(p.name for p in a.iterdir()) == sorted([*names, "model.safetensors.index.json"])
    contents = []
    for name in names:
        data = (a / name).read_bytes()
        assert len(data) == 5 * 1024 * 1024
        assert data == (b / name).read_bytes()
        header, start = safetensors_header(a / name)
        (tensor,) = [k for k in header if k != "__metadata__"]
        assert header[tensor]["data_offsets"] == [0, len(data) - start]
        contents.append(data[start:])
    assert len(set(contents)) == 3
    assert contents[0][:1 << 20] != contents[0][1 << 20 : 2 << 20]
    index = json.loads((a / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"].values()) == names
    proc = run(SYNTHETIC, str(a), "--files", "3", "--size", "5MiB")
    assert "up to date" in proc.stderr
    run(SYNTHETIC, str(a), "--files", "2", "--size", "1MiB")  # other shape: rewritten, stale shards removed
    assert sorted(p.name for p in a.iterdir()) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
