"""quanta's GroupedBlockQuantizeDequantize (LPBQ) against aimet-torch 2.42's, bit for bit.

``aimet_lpbq.json`` is written by ``generate_aimet_lpbq.py`` (run it in a venv with aimet-torch): the
calibrated range, the LPBQ and per-channel scales, the output and the gradients of input, min and max.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from _record import unpack
from quanta.quantization.affine import GroupedBlockQuantizeDequantize, QuantizeDequantize

GOLDEN = json.loads((pathlib.Path(__file__).parent / "aimet_lpbq.json").read_text())


def _quantizer(case) -> tuple[GroupedBlockQuantizeDequantize, torch.Tensor]:
    shape = tuple(case["shape"])
    torch.manual_seed(case["seed"])
    w = torch.randn(shape) * torch.logspace(-2, 1, shape[0]).reshape(-1, *[1] * (len(shape) - 1))
    scale_shape = tuple(s // b for s, b in zip(shape, case["block_size"]))
    grouping = None if case["block_grouping"] is None else tuple(case["block_grouping"])
    q = GroupedBlockQuantizeDequantize(scale_shape, case["bitwidth"], True, case["decompressed_bw"],
                                      block_size=tuple(case["block_size"]), block_grouping=grouping)
    return q, w


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _cases():
    return [pytest.param(c, id=c["name"]) for c in GOLDEN["cases"]]


@pytest.mark.parametrize("case", _cases())
def test_lpbq_matches_aimet(case):
    q, w = _quantizer(case)
    with q.compute_encodings():
        q(w)
    scale_shape = q.shape
    assert torch.equal(_bits(q.min), _bits(unpack(case["min"], scale_shape)))
    assert torch.equal(_bits(q.max), _bits(unpack(case["max"], scale_shape)))
    assert torch.equal(_bits(q.get_scale()), _bits(unpack(case["scale"], scale_shape)))
    per_channel = q.get_per_channel_scale()
    assert torch.equal(_bits(per_channel), _bits(unpack(case["per_channel_scale"], per_channel.shape)))
    x = w.clone().requires_grad_(True)
    out = q(x)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape))
    assert torch.equal(_bits(out), _bits(unpack(case["output"], w.shape)))
    assert torch.equal(_bits(x.grad), _bits(unpack(case["grad_input"], w.shape)))
    # the range's gradients sum over each block in another order than AIMET's: equal to float32 rounding
    torch.testing.assert_close(q.min.grad, unpack(case["grad_min"], scale_shape), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q.max.grad, unpack(case["grad_max"], scale_shape), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_scale_factors_multiply_back(case):
    q, w = _quantizer(case)
    with q.compute_encodings():
        q(w)
    ints = q.get_per_block_int_scale()
    assert torch.equal(ints, ints.round()) and ints.min() >= 1 and ints.max() <= 2 ** (q.decompressed_bw - q.bitwidth)
    per_channel = q.get_per_channel_scale()
    expanded = per_channel
    for dim, (n, size) in enumerate(zip(per_channel.shape, ints.shape)):
        expanded = expanded.repeat_interleave(size // n, dim)
    assert torch.equal(ints * expanded, q.get_scale().detach())


def test_every_block_its_own_group_is_blockwise_with_rounded_scales():
    torch.manual_seed(0)
    w = torch.randn(4, 32)
    lpbq = GroupedBlockQuantizeDequantize((4, 4), 4, True, 8, block_size=(1, 8))
    plain = QuantizeDequantize((4, 4), 4, True, block_size=(1, 8))
    for q in (lpbq, plain):
        with q.compute_encodings():
            q(w)
    # one block per group: the block's own maximum scale, times 16 / 16
    assert torch.equal(lpbq.get_scale(), plain.get_scale())
    assert torch.equal(lpbq(w), plain(w))


def test_compiles_and_exports_like_eager():
    q, w = _quantizer(GOLDEN["cases"][0])
    with q.compute_encodings():
        q(w)
    with torch.no_grad():
        eager = q(w).as_subclass(torch.Tensor)
        compiled = torch.compile(q, fullgraph=True, backend="aot_eager")(w)
        exported = torch.export.export(q, (w,)).module()(w)
    assert torch.equal(compiled, eager) and torch.equal(exported, eager)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(symmetric=False), ValueError, "symmetric must be True"),
    (dict(decompressed_bw=2), ValueError, r"decompressed_bw \(2\) must be at least bitwidth \(4\)"),
    (dict(decompressed_bw=8.0), TypeError, "decompressed_bw must be an int"),
    (dict(block_grouping=(1,)), ValueError, "one entry per dimension"),
    (dict(block_grouping=(1, 3)), ValueError, r"does not divide shape \(4, 4\)"),
    (dict(block_grouping=(1, 0)), ValueError, "positive ints or -1"),
    (dict(block_grouping=2), TypeError, "block_grouping must be a tuple"),
])
def test_bad_arguments(kwargs, error, match):
    args = dict(shape=(4, 4), bitwidth=4, symmetric=True, decompressed_bw=8, block_size=(1, 8)) | kwargs
    with pytest.raises(error, match=match):
        GroupedBlockQuantizeDequantize(**args)


def test_uninitialised_forward_raises():
    q = GroupedBlockQuantizeDequantize((4, 4), 4, True, 8, block_size=(1, 8))
    assert q.get_scale() is None and q.get_per_channel_scale() is None and q.get_per_block_int_scale() is None
    with pytest.raises(RuntimeError, match="not initialized"):
        q(torch.randn(4, 32))
