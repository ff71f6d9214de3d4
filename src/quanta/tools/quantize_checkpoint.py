"""``quanta quantize CHECKPOINT_DIR --algorithm ...``: a transformers checkpoint, quantized block by block.

The command behind it is :func:`quanta.quantization.quantize_pretrained`; this
module turns its options into a config and its calibration file into token
batches:

* a text file (``.txt``, or any file that is not ``.pt``/``.npy``): the lines joined by blank lines, tokenized with
  the checkpoint's tokenizer, cut into windows of ``--seq-len`` tokens (the usual LLM calibration: GPTQ's paper uses
  random windows of C4);
* a ``.pt`` / ``.npy`` file holding an integer tensor of token ids ``[samples, length]``.

>>> config_for("gptq", None, 128)
GPTQConfig(step='observe', base_config=Int4WeightOnlyConfig(group_size=128, layout=Int4CPULayout(), use_hqq=False, zero_point_domain=None, set_inductor_config=True, preserve_zero=None), percdamp=0.01, gptq_quantize_block_size=256, act_order=False)
>>> print(config_for("smoothquant", None, 128).describe())
SmoothQuantConfig(step='prepare', alpha=0.5, base_config=Int8DynamicActivationInt8WeightConfig)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["ALGORITHMS", "WEIGHTS", "config_for", "token_batches", "quantize_checkpoint", "CheckpointResult"]

ALGORITHMS = ("gptq", "awq", "smoothquant", "rtn")
WEIGHTS = ("int4", "int3", "int8", "w8a8", "nvfp4", "mxfp4", "mxfp8")
_BLOCK_SCALED = ("nvfp4", "mxfp4", "mxfp8")  # round to nearest only (their scales come from each block)
_INT4_GROUPS = (32, 64, 128, 256)
_DEFAULT_WEIGHTS = {"gptq": "int4", "awq": "int4", "rtn": "int4", "smoothquant": "w8a8"}


def config_for(algorithm: str, weights: Optional[str], group_size: int):
    """The ``quantize_pretrained`` config of ``--algorithm``, ``--weights`` and ``--group-size``."""
    from quanta.quantization import (
        AWQConfig,
        GPTQConfig,
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
        IntxWeightOnlyConfig,
        MXDynamicActivationMXWeightConfig,
        NVFP4WeightOnlyConfig,
        PerGroup,
        SmoothQuantConfig,
    )

    if algorithm not in ALGORITHMS:
        raise ValueError(f"--algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    weights = weights or _DEFAULT_WEIGHTS[algorithm]
    if weights not in WEIGHTS:
        raise ValueError(f"--weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"--group-size must be a positive integer, got {group_size!r}")
    if weights == "int4" and group_size not in _INT4_GROUPS:
        raise ValueError(f"--group-size for int4 weights must be one of {', '.join(map(str, _INT4_GROUPS))} (the "
                         f"int4 CPU kernel's), got {group_size}")
    if weights in _BLOCK_SCALED and algorithm != "rtn":
        raise ValueError(f"--weights {weights} goes with --algorithm rtn (its block scales come from each block of "
                         f"the weight; {algorithm} searches integer grids), got --algorithm {algorithm}")
    mx = MXDynamicActivationMXWeightConfig
    base = {"int4": lambda: Int4WeightOnlyConfig(group_size=group_size),
            "int3": lambda: IntxWeightOnlyConfig(torch.int3, PerGroup(group_size)),
            "int8": Int8WeightOnlyConfig, "w8a8": Int8DynamicActivationInt8WeightConfig,
            "nvfp4": NVFP4WeightOnlyConfig,
            "mxfp4": lambda: mx(activation_dtype=torch.float4_e2m1fn_x2, weight_dtype=torch.float4_e2m1fn_x2),
            "mxfp8": mx}[weights]()
    if algorithm == "gptq":
        return GPTQConfig(base_config=base)
    if algorithm == "awq":
        return AWQConfig(base)
    if algorithm == "smoothquant":
        return SmoothQuantConfig(base)
    return base


def token_batches(path: str | os.PathLike, checkpoint: str | os.PathLike, *, seq_len: int, batch_size: int,
                  num_batches: Optional[int] = None) -> list[torch.Tensor]:
    """Calibration batches of token ids ``[batch_size, seq_len]`` (the last may be smaller) from ``path``."""
    path = os.fspath(path)
    for name, v in (("--seq-len", seq_len), ("--batch-size", batch_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--calib {path!r} does not exist")
    if path.endswith((".pt", ".npy")):
        import numpy as np

        data = torch.from_numpy(np.load(path)) if path.endswith(".npy") else torch.load(path, weights_only=True)
        if not isinstance(data, torch.Tensor) or data.dim() != 2 or data.dtype.is_floating_point:
            got = (data.dtype, tuple(data.shape)) if isinstance(data, torch.Tensor) else type(data).__name__
            raise ValueError(f"--calib {path!r} must hold an integer tensor of token ids [samples, length], got {got}")
        windows = data.long()
    else:
        from transformers import AutoTokenizer

        with open(path, encoding="utf-8") as f:
            text = "\n\n".join(line.rstrip("\n") for line in f if line.strip())
        if not text:
            raise ValueError(f"--calib {path!r} holds no text")
        ids = AutoTokenizer.from_pretrained(os.fspath(checkpoint))(text, return_tensors="pt")["input_ids"][0]
        n = max(1, ids.numel() // seq_len)
        windows = ids[: n * seq_len].reshape(n, -1) if ids.numel() >= seq_len else ids[None]
    batches = list(windows.split(batch_size))
    return batches[:num_batches] if num_batches else batches


@dataclass
class CheckpointResult:
    """What ``quanta quantize`` did on a checkpoint: the report, the output directory, the calibration size."""

    report: object
    out_dir: str
    num_batches: int
    num_tokens: int


def quantize_checkpoint(checkpoint: str | os.PathLike, calib: str | os.PathLike, out: str | os.PathLike, *,
                        algorithm: str, weights: Optional[str] = None, group_size: int = 128, seq_len: int = 512,
                        batch_size: int = 4, num_batches: Optional[int] = None, progress: bool = True,
                        log: Callable[[str], None] = lambda _m: None) -> CheckpointResult:
    """``quantize_pretrained(checkpoint, out, config_for(...), token_batches(calib, ...))``."""
    from quanta.quantization.pretrained import quantize_pretrained

    config = config_for(algorithm, weights, group_size)
    batches = token_batches(calib, checkpoint, seq_len=seq_len, batch_size=batch_size, num_batches=num_batches)
    tokens = sum(b.numel() for b in batches)
    log(f"{config.describe()}: {len(batches)} calibration batch(es), {tokens} tokens")
    report = quantize_pretrained(checkpoint, out, config, batches, progress=progress)
    return CheckpointResult(report, os.fspath(out), len(batches), tokens)
