"""A Hugging Face model folder read: its JSON files, its weights (one safetensors file, sharded
ones through their index, or pytorch_model.bin), special token ids from its tokenizer files,
and a Hub name fetched to a local folder when online. Every damaged or missing file is one line
saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxgpt.errors import UserError


def read_json(path: Path, missing: str) -> dict:
    """A JSON object of a Hugging Face folder; one line, naming the file, if it is absent (then
    `missing` says what to do), not JSON, or not an object."""
    if not path.is_file():
        raise UserError(f"{path.parent} has no {path.name}; {missing}")
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UserError(f"{path} is not JSON ({error}); the file is damaged or cut short: download it again") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, not an object; download it again")
    return value


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files holding a folder's weights (one, or the shards its index names,
    each checked to be there); [] when it has none."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    if single.exists():
        return [single]
    if not index.exists():
        return []
    weight_map = read_json(index, "").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UserError(f"{index} has no weight_map naming the shards; download it again")
    shards = [directory / name for name in sorted(set(weight_map.values()))]
    if absent := [shard.name for shard in shards if not shard.is_file()]:
        raise UserError(f"{index} names {', '.join(absent)}, which {directory} lacks; download the missing shards")
    return shards


def read_safetensors(path: Path, *, header_only: bool = False):
    """A safetensors file's arrays by name (with header_only, its names alone, reading only the
    header); one line for a damaged or cut-short file."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    try:
        if header_only:
            with safe_open(path, "np") as opened:
                return list(opened.keys())
        return load_file(path)
    except (SafetensorError, OSError) as error:
        raise UserError(
            f"{path} cannot be read as safetensors ({error}); the file is damaged or cut short: download it again"
        ) from None


def read_weights(directory: Path) -> dict[str, np.ndarray]:
    if files := weight_files(directory):
        weights = {}
        for path in files:
            weights |= read_safetensors(path)
        return weights
    if (directory / "pytorch_model.bin").exists():
        try:
            import torch
        except ImportError:
            raise UserError(
                f"{directory} holds PyTorch weights: pip install -r requirements-hf.txt to read them"
            ) from None
        state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in state.items()}
    raise UserError(f"{directory} has no model.safetensors, sharded safetensors or pytorch_model.bin")


def local_directory(path_or_name: str) -> Path:
    path = Path(path_or_name).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.safetensors"]
        return Path(snapshot_download(path_or_name, allow_patterns=patterns))
    except Exception as error:  # offline, unknown name, gated repo
        raise UserError(
            f"{path_or_name!r} is not a local directory (a jaxgpt run's workdir, or a Hugging Face folder) and could "
            f"not be fetched from the Hub ({type(error).__name__}); train that run first, or download the weights "
            "where you have a network and pass their directory"
        ) from None


def token_id(directory: Path, token: str) -> int | None:
    """The id of a special token in the directory's tokenizer.json or vocab.txt, if either says."""
    if (directory / "tokenizer.json").exists():
        added = json.loads((directory / "tokenizer.json").read_text()).get("added_tokens", [])
        if found := [t["id"] for t in added if t.get("content") == token]:
            return found[0]
    if (directory / "vocab.txt").exists():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
        if token in lines:
            return lines.index(token)
    return None


class ReadWeights(dict):
    """A folder's weights by name, remembering which names the conversion read."""

    def __init__(self, weights: dict):
        super().__init__(weights)
        self.read: set[str] = set()

    def __getitem__(self, name: str):
        self.read.add(name)
        return super().__getitem__(name)
