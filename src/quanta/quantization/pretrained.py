"""Checkpoints larger than memory: quantize a transformers checkpoint directory block by block, and load it back.

:func:`quantize_pretrained` builds the model with its parameters on the
``meta`` device (no memory), reads from the safetensors shards only the weights
of the modules outside the blocks (embeddings, final norm, ``lm_head``) and then,
one block at a time, that block's weights; it calibrates and quantizes the block
as :func:`~quanta.quantization.quantize_sequential` does (on the outputs of the
blocks already quantized), writes the quantized block to its own shard at once
and drops it. Peak memory: one block in float, its calibration activations, and
the modules outside the blocks. The layers outside the blocks are calibrated
last, the model replaying the last block's outputs instead of running the blocks.

The output directory holds quanta safetensors shards
(:func:`~quanta.dtypes.save_quantized`, one per block plus one for the rest),
``model.safetensors.index.json``, the source's other files (tokenizer,
generation config) and ``config.json`` with a ``quantization_config``
(``quant_method: "quanta"``) that :func:`load_pretrained` reads back into the
model class. The directory appears whole or not at all: it is written beside its
destination and renamed into place.

Non-persistent buffers (rotary embeddings' ``inv_freq``) are computed by the
model class's own ``_init_weights``, as transformers does when it loads a model.

>>> import os, tempfile, torch, transformers
>>> from quanta.quantization import GPTQConfig, Int4WeightOnlyConfig
>>> cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
...                                num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
>>> src, dst = (os.path.join(tempfile.mkdtemp(), d) for d in ("float", "int4"))
>>> transformers.LlamaForCausalLM(cfg).save_pretrained(src)
>>> data = [torch.randint(0, 100, (2, 16)) for _ in range(2)]
>>> report = quantize_pretrained(src, dst, GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32)), data,
...                              progress=False)
>>> report.blocks
['model.layers.0', 'model.layers.1']
>>> model = load_pretrained(dst)
>>> type(model.model.layers[0].mlp.up_proj.weight).__name__, model(data[0]).logits.shape
('AffineQuantizedTensor', torch.Size([2, 16, 100]))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from quanta._progress import make_bar
from quanta.dtypes.serialization import FORMAT_VERSION, load_quantized, save_quantized
from quanta.quantization.linear_like import is_linear_like
from quanta.quantization.quant_api import AOBaseConfig
from quanta.quantization.sequential import (
    SequentialReport,
    _call,
    _capture_inputs,
    _hidden,
    _no_cache,
    _resolve_blocks,
    _steps,
    calibrate_block,
    calibrate_rest,
)

__all__ = ["quantize_pretrained", "load_pretrained", "QUANT_METHOD"]

QUANT_METHOD = "quanta"
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("quantize_pretrained/load_pretrained read transformers checkpoints: "
                          "pip install transformers") from None
    return transformers


def _renames(model: nn.Module) -> list[tuple[re.Pattern, str]]:
    """transformers' renames from checkpoint keys to the model's parameter names (``embed_out.`` -> ``lm_head.``...),
    the plain renames only (tensor conversions are not read here)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # an older transformers: checkpoints hold the parameters' own names
        return []
    out = []
    for t in get_model_conversion_mapping(model):
        if type(t) is WeightRenaming and len(t.target_patterns) == 1 and not getattr(t, "scope_prefix", None):
            out += [(re.compile(src), t.target_patterns[0]) for src in t.source_patterns]
    return out


class _Shards:
    """The tensors of a checkpoint directory, read one at a time from its safetensors shards.

    ``where`` maps the model's parameter names to ``(file, checkpoint key)``.
    """

    def __init__(self, path: str, renames: Sequence[tuple[re.Pattern, str]] = ()) -> None:
        from safetensors import safe_open

        index = os.path.join(path, _INDEX)
        if os.path.exists(index):
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index}: no 'weight_map' object")
        elif os.path.exists(os.path.join(path, _SINGLE)):
            weight_map = None
        else:
            raise ValueError(f"{path}: no {_SINGLE} or {_INDEX}: not a safetensors checkpoint directory")
        files = sorted(set(weight_map.values())) if weight_map else [_SINGLE]
        self._open = {f: safe_open(os.path.join(path, f), framework="pt") for f in files}
        stored = weight_map or {k: _SINGLE for k in self._open[_SINGLE].keys()}
        self.where: dict[str, tuple[str, str]] = {}
        for key, file in stored.items():
            name = key
            for pattern, target in renames:
                name = pattern.sub(target, name)
            self.where[name] = (file, key)

    def get(self, name: str) -> torch.Tensor:
        file, key = self.where[name]
        return self._open[file].get_tensor(key)


def _config_and_class(path: str) -> tuple[Any, type]:
    transformers = _transformers()
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{path}: no config.json: not a transformers checkpoint directory")
    config = transformers.AutoConfig.from_pretrained(path)
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ValueError(f"{path}: config.json names no transformers model class in 'architectures' ({names})")
    return config, cls


def _skeleton(config: Any, cls: type) -> nn.Module:
    """The model with every parameter on ``meta``; buffers on the CPU, computed by the class's ``_init_weights``."""
    with torch.device("meta"):
        model = cls(config)
    for module in model.modules():
        meta = [n for n, b in module._buffers.items() if b is not None and b.device.type == "meta"]
        for n in meta:
            module._buffers[n] = torch.empty_like(module._buffers[n], device="cpu")
        if meta and hasattr(model, "_init_weights"):
            model._init_weights(module)
    return model.eval()


def _owners(model: nn.Module) -> dict[int, list[tuple[nn.Module, str, str]]]:
    """Every parameter (by id) -> the modules holding it, the attribute name and the full name (ties share one)."""
    out: dict[int, list[tuple[nn.Module, str, str]]] = {}
    for mname, module in model.named_modules(remove_duplicate=False):
        for pname, p in module._parameters.items():
            if p is not None:
                out.setdefault(id(p), []).append((module, pname, f"{mname}.{pname}" if mname else pname))
    return out


def _materialize(model: nn.Module, shards: _Shards, where: Callable[[str], bool]) -> None:
    """Read from the shards every ``meta`` parameter whose full name ``where`` takes (a tied parameter once, into
    every module holding it)."""
    owners = _owners(model)
    for full, p in list(model.named_parameters(remove_duplicate=False)):
        if p.device.type != "meta" or not where(full):
            continue
        holders = owners[id(p)]
        key = next((name for _, _, name in holders if name in shards.where), None)
        if key is None:
            raise ValueError(f"the checkpoint has no tensor for parameter {full!r} (or stores it in a converted "
                             "layout, which quanta does not read: load the model with transformers and use "
                             "quantize_sequential)")
        value = shards.get(key)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"the checkpoint's {key!r} has shape {tuple(value.shape)}, the model expects "
                             f"{tuple(p.shape)}")
        new = nn.Parameter(value, requires_grad=False)
        for holder, attr, _ in holders:
            holder._parameters[attr] = new


class _Replay(nn.Module):
    """Stands in for a finished block: returns its input hidden states or, given ``keys`` and ``outputs`` (the last
    block), the output the block gave for the batch whose first-block input equals this call's hidden states."""

    def __init__(self, like: Any, outputs: Optional[list[Any]] = None,
                 keys: Optional[list[torch.Tensor]] = None) -> None:
        super().__init__()
        self._like_tuple = not isinstance(like, torch.Tensor)
        self._outputs, self._keys = outputs, keys

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        hidden = _hidden(args, kwargs)
        if self._outputs is None:
            return (hidden,) if self._like_tuple else hidden
        for key, out in zip(self._keys, self._outputs):
            if key.shape == hidden.shape and torch.equal(key, hidden):
                return out
        raise RuntimeError("quantize_pretrained: the model ran the blocks on hidden states of no calibration batch")


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _check_chained_streaming(model: nn.Module, blocks: list[tuple[str, nn.Module]], batch: Any, like: Any,
                             first_input: torch.Tensor) -> None:
    """With every block replaced by an identity, the hidden states must reach every block unchanged."""
    seen: list[torch.Tensor] = []
    originals = [b for _, b in blocks]
    stubs = [_Replay(like) for _ in blocks]
    for stub in stubs:
        stub.register_forward_pre_hook(lambda _m, a, k: seen.append(a[0] if a else k.get("hidden_states")),
                                       with_kwargs=True)
    try:
        for (name, _), stub in zip(blocks, stubs):
            _replace(model, name, stub)
        _call(model, batch)
    finally:
        for (name, _), block in zip(blocks, originals):
            _replace(model, name, block)
    if len(seen) != len(blocks) or any(not torch.equal(h, first_input) for h in seen):
        raise ValueError("the blocks do not pass the hidden states from one to the next unchanged (the model "
                         "changes them between the blocks): quantize_pretrained needs blocks that chain")


@contextlib.contextmanager
def _atomic_directory(dst: str) -> Iterator[str]:
    """A temporary directory beside ``dst`` that replaces it only if the block completes."""
    parent = os.path.dirname(os.path.abspath(dst)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".quanta-", dir=parent)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if os.path.exists(dst):
        old = tempfile.mkdtemp(prefix=".quanta-old-", dir=parent)
        os.rmdir(old)
        os.rename(dst, old)
    os.rename(tmp, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@torch.no_grad()
def quantize_pretrained(src: Union[str, os.PathLike], dst: Union[str, os.PathLike], config: AOBaseConfig,
                        data: Iterable[Any], *, blocks: Optional[Sequence[str]] = None,
                        filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
                        progress: bool = True) -> SequentialReport:
    """Quantize the transformers checkpoint directory ``src`` into ``dst``, one block in memory at a time.

    Args:
        src: a directory with ``config.json`` and ``model.safetensors`` (or shards and their index).
        dst: the output directory (replaced whole if it exists; never ``src``).
        config: as :func:`~quanta.quantization.quantize_sequential` (``GPTQConfig(...)``, ``AWQConfig(...)``,
            ``SmoothQuantConfig(...)`` or a plain config for round to nearest).
        data: calibration batches, as the model takes them (``model(batch)``, ``model(*batch)``, ``model(**batch)``).
        blocks: names of the blocks in the order the model runs them (default: the model's repeated layers).
        filter_fn: ``filter_fn(module, fqn) -> bool`` selects the layers to quantize (default: ``nn.Linear`` and
            transformers ``Conv1D``).
        progress: a progress bar per block (tqdm or rich, if installed).

    Returns:
        the :class:`~quanta.quantization.sequential.SequentialReport`.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if not isinstance(config, AOBaseConfig):
        raise TypeError(f"config must be a quanta.quantization config (e.g. GPTQConfig(base_config=...)), got "
                        f"{config!r}")
    if not os.path.isdir(src):
        raise ValueError(f"src {src!r} is not a directory")
    if os.path.realpath(src) == os.path.realpath(dst):
        raise ValueError("dst must differ from src (the source checkpoint is read while dst is written)")
    if isinstance(data, (torch.Tensor, dict)):
        raise TypeError("data must be an iterable of batches (a list of tensors, tuples or dicts), not one batch")
    batches = list(data)
    if not batches:
        raise ValueError("data is empty: quantize_pretrained needs at least one calibration batch")
    steps = _steps(config)
    model_config, cls = _config_and_class(src)
    model = _skeleton(model_config, cls)
    shards = _Shards(src, _renames(model))
    names = [n for n, _ in _resolve_blocks(model, blocks)]
    select = filter_fn or (lambda m, n: is_linear_like(m))
    report = SequentialReport(blocks=names)

    def in_block(n: str) -> bool:
        return any(n == b or n.startswith(b + ".") for b in names)

    _materialize(model, shards, lambda n: not in_block(n))  # embeddings, norms, lm_head: read now
    with _atomic_directory(dst) as out, _no_cache(model):
        weight_map: dict[str, str] = {}
        inputs = _capture_inputs(model, model.get_submodule(names[0]), batches)
        first_hidden = [_hidden(a, k) for a, k in inputs]
        bar = make_bar(len(names), enabled=progress, desc="quantize_pretrained", unit="block")
        outputs: list[Any] = []
        for i, name in enumerate(names):
            _materialize(model, shards, lambda n, name=name: n.startswith(name + "."))
            block = model.get_submodule(name)
            if i == 0:
                like = block(*inputs[0][0], **inputs[0][1])
                _check_chained_streaming(model, [(n, model.get_submodule(n)) for n in names], batches[0], like,
                                         _hidden(*inputs[0]))
            inputs, outputs = calibrate_block(block, name, steps, inputs, select, report)
            shard = f"model-block-{i:05d}.safetensors"
            state = {f"{name}.{k}": v for k, v in block.state_dict().items()}
            save_quantized(state, os.path.join(out, shard))
            weight_map.update({k: shard for k in state})
            del block, state
            _replace(model, name, _Replay(outputs[0]))  # the block is dropped here
            bar.advance()
        bar.close()
        # the layers outside the blocks: the model replays the last block's outputs
        _replace(model, names[-1], _Replay(outputs[0], outputs, first_hidden))

        def outside(m: nn.Module, n: str) -> bool:
            return select(m, n) and not in_block(n)
        calibrate_rest(model, steps, batches, outside, report)
        rest, seen = {}, set()
        for k, v in model.state_dict(keep_vars=True).items():
            if not in_block(k):
                rest[k] = v.detach().clone() if id(v) in seen else v.detach()  # tied weights: one copy each
                seen.add(id(v))
        save_quantized(rest, os.path.join(out, "model-rest.safetensors"))
        weight_map.update({k: "model-rest.safetensors" for k in rest})
        with open(os.path.join(out, _INDEX), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"format": "quanta", "format_version": FORMAT_VERSION},
                       "weight_map": weight_map}, f, indent=2)
        _write_config(src, out, config)
    return report


def _write_config(src: str, out: str, config: AOBaseConfig) -> None:
    for entry in os.listdir(src):  # tokenizer, generation config, pooling...: everything but the weights
        path = os.path.join(src, entry)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(out, entry))
        elif not entry.endswith((".safetensors", ".bin", ".pt", ".pth")) and entry not in (_INDEX, "config.json"):
            shutil.copy2(path, os.path.join(out, entry))
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    algorithm = type(config).__name__.removesuffix("Config")
    cfg["quantization_config"] = {"quant_method": QUANT_METHOD, "format_version": FORMAT_VERSION,
                                  "algorithm": algorithm, "config": _describe(config)}
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)


def _describe(config: AOBaseConfig) -> Any:
    """A JSON description of a config, for people (loading reads the tensors' own descriptions, not this)."""
    if dataclasses.is_dataclass(config):
        out = {"type": type(config).__name__}
        for f in dataclasses.fields(config):
            v = getattr(config, f.name)
            out[f.name] = _describe(v) if isinstance(v, AOBaseConfig) else (
                v if isinstance(v, (int, float, str, bool, type(None))) else repr(v))
        return out
    return {"type": type(config).__name__}


def load_pretrained(path: Union[str, os.PathLike]) -> nn.Module:
    """The model :func:`quantize_pretrained` wrote to ``path``, with its quantized weights, in eval mode.

    The model class comes from ``config.json``'s ``architectures``; every parameter is read from the shards
    (``ValueError`` if one is missing or the directory is not a quanta checkpoint).
    """
    path = os.fspath(path)
    model_config, cls = _config_and_class(path)
    q = getattr(model_config, "quantization_config", None)
    method = q.get("quant_method") if isinstance(q, dict) else getattr(q, "quant_method", None)
    if method != QUANT_METHOD:
        raise ValueError(f"{path}: config.json's quantization_config is not quanta's (quant_method {method!r}); "
                         "a float checkpoint loads with transformers' from_pretrained")
    index = os.path.join(path, _INDEX)
    if not os.path.isfile(index):
        raise ValueError(f"{path}: no {_INDEX}")
    with open(index, encoding="utf-8") as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_quantized(os.path.join(path, name)))
    model = _skeleton(model_config, cls)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    still_meta = [n for n, p in model.named_parameters(remove_duplicate=False) if p.device.type == "meta"]
    if still_meta or unexpected:
        raise ValueError(f"{path}: the shards do not match {cls.__name__}: parameters missing {still_meta[:5]}, "
                         f"unexpected tensors {list(unexpected)[:5]}")
    return model.eval()
