"""ONNX export of models built from :mod:`quanta.tensor_quant.nn` modules, in the Q/DQ form TensorRT fuses.

Every enabled :class:`~quanta.tensor_quant.TensorQuantizer` becomes a QuantizeLinear/DequantizeLinear pair
with zero point 0 (symmetric int8: inputs per tensor, weights per output channel, ``narrow_range`` as the
descriptor says; FP8 quantizers, ``num_bits=(4, 3)``: a ``float8e4m3fn`` zero point and scale ``amax / 448``,
opset 19 or later) — the graph ``torch.onnx.export`` writes while ``TensorQuantizer.use_fb_fake_quant`` is True
(pytorch_quantization's procedure), which :func:`export_onnx` sets around the export after checking that the
model can be exported that way: every enabled quantizer calibrated (a static ``amax``), integer, per tensor or
one axis.

>>> import os, tempfile, torch
>>> from quanta.tensor_quant import nn as quant_nn
>>> layer = quant_nn.QuantLinear(8, 4)
>>> for q in (layer.input_quantizer, layer.weight_quantizer):
...     q.disable_quant(); q.enable_calib()
>>> _ = layer(torch.randn(16, 8))
>>> for q in (layer.input_quantizer, layer.weight_quantizer):
...     q.load_calib_amax(); q.disable_calib(); q.enable_quant()
>>> path = os.path.join(tempfile.mkdtemp(), "layer.onnx")
>>> export_onnx(layer, (torch.randn(1, 8),), path)
>>> import onnx
>>> sorted({n.op_type for n in onnx.load(path).graph.node})
['Constant', 'DequantizeLinear', 'Gemm', 'QuantizeLinear']
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator

import torch
from torch import nn

from quanta._files import atomic_write
from quanta.kernels.amax_quant import is_fp8
from quanta.tensor_quant.quantizer import TensorQuantizer

__all__ = ["export_onnx", "fb_fake_quant"]


@contextlib.contextmanager
def fb_fake_quant() -> Iterator[None]:
    """``TensorQuantizer.use_fb_fake_quant = True`` inside the block (restored after)."""
    old = TensorQuantizer.use_fb_fake_quant
    TensorQuantizer.use_fb_fake_quant = True
    try:
        yield
    finally:
        TensorQuantizer.use_fb_fake_quant = old


def _check_exportable(model: nn.Module, opset_version: int) -> None:
    problems = []
    for name, q in model.named_modules():
        if not isinstance(q, TensorQuantizer) or q._disabled or not q._if_quant:
            continue
        if is_fp8(q.num_bits) and opset_version < 19:
            problems.append(f"{name}: FP8 needs opset_version >= 19 (float8 QuantizeLinear), got {opset_version}")
        elif not q.fake_quant:
            problems.append(f"{name}: real quantization (fake_quant=False); export the fake-quantized model")
        elif q.amax is None and not q._learn_amax:
            problems.append(f"{name}: no calibrated amax (dynamic amax cannot be written as a constant scale)")
        elif q.axis is not None and not isinstance(q.axis, int) and len(tuple(q.axis)) != 1:
            problems.append(f"{name}: amax over several axes {q.axis} (ONNX scales are per tensor or one axis)")
    if problems:
        raise ValueError("cannot export these quantizers as QuantizeLinear/DequantizeLinear: " + "; ".join(problems))


def export_onnx(model: nn.Module, args: tuple[Any, ...], path: str | os.PathLike, *, opset_version: int = 17,
                **export_kwargs: Any) -> None:
    """Write ``model`` (called on ``args``) to ``path`` as ONNX with TensorRT's Q/DQ placement, atomically.

    ``export_kwargs`` go to ``torch.onnx.export`` (``input_names``, ``dynamic_axes``, ...). ``opset_version``
    must be 13 or more (per-channel DequantizeLinear).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple of the model's inputs, got {type(args).__name__}")
    if isinstance(opset_version, bool) or not isinstance(opset_version, int) or opset_version < 13:
        raise ValueError(f"opset_version must be an int >= 13 (per-channel DequantizeLinear), got {opset_version!r}")
    _check_exportable(model, opset_version)
    was_training = model.training
    model.eval()
    try:
        with fb_fake_quant(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            atomic_write(path, lambda tmp: torch.onnx.export(model, args, tmp, opset_version=opset_version,
                                                             dynamo=False, **export_kwargs))
    finally:
        model.train(was_training)
