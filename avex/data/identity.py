"""What a feature cache's tensors and token ids depend on, as hashes: a model's weights, its
tokenizer, its processor's settings. The export's resume identity holds them (a partial export
of other weights is refused, not mixed), the cache records them, and training checks the
captioner's tokenizer against the cache's."""
from __future__ import annotations

import hashlib
import json

import torch

__all__ = ["weights_sha256", "tokenizer_sha256", "tokenizer_record", "settings_sha256"]


def weights_sha256(model) -> str:
    """SHA-256 over every tensor of ``model.state_dict()`` (names, dtypes, shapes, bytes), in
    name order: the same weights give the same hash on any device."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{data.dtype}|{list(tensor.shape)}|".encode())
        digest.update(memoryview(data.view(torch.uint8).numpy()))
    return digest.hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    """SHA-256 of what a tokenizer maps text to and from: a fast tokenizer's whole definition
    (``tokenizer.json``'s content: vocabulary, merges, normalisation, added tokens, decoder;
    truncation and padding state left out), else its vocabulary and special tokens. Two
    copies of one tokenizer saved in different folders hash the same; a tokenizer with the
    same words at other ids does not."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
    else:
        spec = {"vocab": sorted(tokenizer.get_vocab().items()),
                "special": sorted(map(str, tokenizer.all_special_tokens))}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def tokenizer_record(tokenizer) -> dict:
    """What a cache records of the tokenizer its token ids came from."""
    return {"class": type(tokenizer).__name__, "sha256": tokenizer_sha256(tokenizer)}


def settings_sha256(value) -> str:
    """SHA-256 of JSON-able settings (a processor part's ``to_dict()``), in key order."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
