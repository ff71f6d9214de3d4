"""Quantized counterparts of common ``torch.nn`` modules (AIMET v2 style).

Each class subclasses its float module and :class:`~quanta.nn.base.QuantizationMixin`.
Defaults (see ``_init_quantizers``): inputs off; one per-tensor asymmetric 8-bit
output quantizer; ``weight`` signed symmetric 8-bit per output channel
(``shape=(C_out, 1, ...)``); bias off. Exceptions: Embedding takes integer
indices (no input quantizer slot is usable), norm weights are per tensor, and
BatchNorm quantizes only its normalised output (no folding here).

>>> import quanta.nn
>>> conv = quanta.nn.QuantizedConv2d(3, 8, kernel_size=3)
>>> conv.param_quantizers["weight"]
QuantizeDequantize(shape=(8, 1, 1, 1), qmin=-128, qmax=127, symmetric=True)
>>> conv.param_quantizers["bias"] is None, conv.input_quantizers[0] is None
(True, True)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quanta.kernels.range_affine import relu_quantize_dequantize
from quanta.nn.base import QuantizationMixin, plain
from quanta.nn.functional import (
    Add,
    Baddbmm,
    ChannelsFirstLayerNorm,
    Concat,
    Divide,
    Einsum,
    Interpolate,
    MatMul,
    Mean,
    Multiply,
    OffsetRMSNorm,
    Pointwise,
    QuickGELU,
    Subtract,
    TransposedLinear,
    _channels_first,
    _channels_last,
    offset_rms_norm,
)
from quanta.quantization.affine import QuantizeDequantize

__all__ = [
    "QuantizedAdaptiveAvgPool1d",
    "QuantizedAdaptiveAvgPool2d",
    "QuantizedAdaptiveAvgPool3d",
    "QuantizedAdd",
    "QuantizedAvgPool1d",
    "QuantizedAvgPool2d",
    "QuantizedAvgPool3d",
    "QuantizedBaddbmm",
    "QuantizedBatchNorm1d",
    "QuantizedBatchNorm2d",
    "QuantizedChannelsFirstLayerNorm",
    "QuantizedConcat",
    "QuantizedConv1d",
    "QuantizedConv2d",
    "QuantizedConv3d",
    "QuantizedConvTranspose1d",
    "QuantizedConvTranspose2d",
    "QuantizedDivide",
    "QuantizedELU",
    "QuantizedEinsum",
    "QuantizedEmbedding",
    "QuantizedGELU",
    "QuantizedGroupNorm",
    "QuantizedHardsigmoid",
    "QuantizedHardswish",
    "QuantizedHardtanh",
    "QuantizedInterpolate",
    "QuantizedLayerNorm",
    "QuantizedLeakyReLU",
    "QuantizedLinear",
    "QuantizedMatMul",
    "QuantizedMean",
    "QuantizedMish",
    "QuantizedMultiply",
    "QuantizedOffsetRMSNorm",
    "QuantizedPReLU",
    "QuantizedPointwise",
    "QuantizedQuickGELU",
    "QuantizedReLU",
    "QuantizedReLU6",
    "QuantizedRMSNorm",
    "QuantizedSiLU",
    "QuantizedSigmoid",
    "QuantizedSoftmax",
    "QuantizedSubtract",
    "QuantizedTanh",
    "QuantizedTransposedLinear",
]


# -- layers with weights ------------------------------------------------------------------
class QuantizedLinear(QuantizationMixin, nn.Linear):
    """``QDQ_out(F.linear(QDQ_in(x), QDQ_w(weight), QDQ_b(bias)))``."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._qoutput(F.linear(self._qinput(0, input), self._qparam("weight"), self._qparam("bias")),
                             owned=True)


class QuantizedTransposedLinear(QuantizationMixin, TransposedLinear):
    """Quantized :class:`~quanta.nn.TransposedLinear` (GPT-2's ``Conv1D``): weight scales along dim 1, the
    output features.

    >>> import quanta.nn
    >>> q = quanta.nn.QuantizedTransposedLinear.from_module(quanta.nn.TransposedLinear(torch.randn(8, 4)))
    >>> q.param_quantizers["weight"]
    QuantizeDequantize(shape=(1, 4), qmin=-128, qmax=127, symmetric=True)
    """

    def _weight_axis(self) -> int:
        return 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._qinput(0, x)
        w, b = self._qparam("weight"), self._qparam("bias")
        y = x.reshape(-1, x.shape[-1])
        y = torch.mm(y, w) if b is None else torch.addmm(b, y, w)
        return self._qoutput(y.reshape(*x.shape[:-1], w.shape[1]), owned=True)


class _QuantizedConvNd(QuantizationMixin):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        y = self._conv_forward(self._qinput(0, input), self._qparam("weight"), self._qparam("bias"))  # type: ignore[attr-defined]
        return self._qoutput(y, owned=True)


class QuantizedConv1d(_QuantizedConvNd, nn.Conv1d):
    """Quantized :class:`torch.nn.Conv1d` (any ``padding_mode``)."""


class QuantizedConv2d(_QuantizedConvNd, nn.Conv2d):
    """Quantized :class:`torch.nn.Conv2d` (any ``padding_mode``)."""


class QuantizedConv3d(_QuantizedConvNd, nn.Conv3d):
    """Quantized :class:`torch.nn.Conv3d` (any ``padding_mode``)."""


class _QuantizedConvTransposeNd(QuantizationMixin):
    # weight is (C_in, C_out // groups, *k): one scale per index of dim 1 (per output channel when groups == 1)
    _num_spatial_dims: int
    _op: Any

    def _weight_axis(self) -> int:
        return 1

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if self.padding_mode != "zeros":  # type: ignore[attr-defined]
            raise ValueError(f"Only `zeros` padding mode is supported for {type(self).__name__}")
        output_padding = self._output_padding(  # type: ignore[attr-defined]
            input, output_size, self.stride, self.padding, self.kernel_size,  # type: ignore[attr-defined]
            self._num_spatial_dims, self.dilation,  # type: ignore[attr-defined]
        )
        y = type(self)._op(
            self._qinput(0, input), self._qparam("weight"), self._qparam("bias"),
            self.stride, self.padding, output_padding, self.groups, self.dilation,  # type: ignore[attr-defined]
        )
        return self._qoutput(y, owned=True)


class QuantizedConvTranspose1d(_QuantizedConvTransposeNd, nn.ConvTranspose1d):
    """Quantized :class:`torch.nn.ConvTranspose1d`; weight scales along dim 1 (``C_out // groups``)."""

    _num_spatial_dims = 1
    _op = F.conv_transpose1d


class QuantizedConvTranspose2d(_QuantizedConvTransposeNd, nn.ConvTranspose2d):
    """Quantized :class:`torch.nn.ConvTranspose2d`; weight scales along dim 1 (``C_out // groups``)."""

    _num_spatial_dims = 2
    _op = F.conv_transpose2d


class QuantizedEmbedding(QuantizationMixin, nn.Embedding):
    """Quantized :class:`torch.nn.Embedding`: one weight scale per row (token); output quantized.

    The input holds integer indices, so ``input_quantizers[0]`` must stay None.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        y = F.embedding(input, self._qparam("weight"), self.padding_idx, self.max_norm, self.norm_type,
                        self.scale_grad_by_freq, self.sparse)
        return self._qoutput(y, owned=True)


# -- normalisation ------------------------------------------------------------------------
class _QuantizedNorm(QuantizationMixin):
    """Norm weights (gamma) get one signed symmetric 8-bit scale per tensor; bias off."""

    def _init_quantizers(self) -> None:
        super()._init_quantizers()
        if "weight" in self.param_quantizers:
            self.param_quantizers["weight"] = QuantizeDequantize(shape=(), bitwidth=8, symmetric=True)


class QuantizedLayerNorm(_QuantizedNorm, nn.LayerNorm):
    """Quantized :class:`torch.nn.LayerNorm`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(self._qinput(0, input), self.normalized_shape, self._qparam("weight"),
                         self._qparam("bias"), self.eps)
        return self._qoutput(y, owned=True)


class QuantizedGroupNorm(_QuantizedNorm, nn.GroupNorm):
    """Quantized :class:`torch.nn.GroupNorm`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        y = F.group_norm(self._qinput(0, input), self.num_groups, self._qparam("weight"),
                         self._qparam("bias"), self.eps)
        return self._qoutput(y, owned=True)


class QuantizedChannelsFirstLayerNorm(_QuantizedNorm, ChannelsFirstLayerNorm):
    """Quantized :class:`~quanta.nn.ChannelsFirstLayerNorm` (ConvNeXt's channels-first LayerNorm)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(_channels_last(self._qinput(0, input)), self.normalized_shape, self._qparam("weight"),
                         self._qparam("bias"), self.eps)
        return self._qoutput(_channels_first(y), owned=True)


class QuantizedRMSNorm(_QuantizedNorm, nn.RMSNorm):
    """Quantized :class:`torch.nn.RMSNorm` (hand-written RMSNorms of transformers models are captured as it).

    >>> import quanta.nn
    >>> norm = quanta.nn.QuantizedRMSNorm(4)
    >>> norm.param_quantizers["weight"], norm.output_quantizers[0] is not None
    (QuantizeDequantize(shape=(), qmin=-128, qmax=127, symmetric=True), True)
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        # written out as Hugging Face's RMSNorms compute it (in float32, then back to the input's dtype): the
        # same values as the modules captured as this one, and ops every ONNX opset has
        x = self._qinput(0, input)
        h = x.float()
        dims = tuple(range(-len(self.normalized_shape), 0))
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        y = (h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + eps)).to(x.dtype)
        w = self._qparam("weight")
        return self._qoutput(y if w is None else w * y, owned=True)


class QuantizedOffsetRMSNorm(QuantizedRMSNorm, OffsetRMSNorm):
    """Quantized :class:`~quanta.nn.OffsetRMSNorm` (Gemma's RMSNorm): the parameter ``weight`` is quantized
    (as every parameter, by its own name), and the norm scales by ``offset + QDQ(weight)``.

    >>> import quanta.nn
    >>> norm = quanta.nn.QuantizedOffsetRMSNorm(4)
    >>> norm.offset, norm.param_quantizers["weight"] is not None
    (1.0, True)
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        y = offset_rms_norm(self._qinput(0, input), self.normalized_shape, self._qparam("weight"), self.eps,
                            self.offset)
        return self._qoutput(y, owned=True)


class _QuantizedBatchNorm(QuantizationMixin):
    """Simulated BatchNorm: only the normalised output is quantized by default (params off, no folding)."""

    def _init_quantizers(self) -> None:
        super()._init_quantizers()
        for name in list(self.param_quantizers):
            self.param_quantizers[name] = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # mirrors torch's _BatchNorm.forward
        self._check_input_dim(input)  # type: ignore[attr-defined]
        eaf = 0.0 if self.momentum is None else self.momentum  # type: ignore[attr-defined]
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:  # type: ignore[attr-defined]
            self.num_batches_tracked.add_(1)  # type: ignore[attr-defined]
            eaf = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum  # type: ignore[attr-defined]
        bn_training = self.training or (self.running_mean is None and self.running_var is None)  # type: ignore[attr-defined]
        track = not self.training or self.track_running_stats  # type: ignore[attr-defined]
        y = F.batch_norm(
            self._qinput(0, input),
            self.running_mean if track else None,  # type: ignore[attr-defined]
            self.running_var if track else None,  # type: ignore[attr-defined]
            self._qparam("weight"), self._qparam("bias"), bn_training, eaf, self.eps,  # type: ignore[attr-defined]
        )
        return self._qoutput(y, owned=True)


class QuantizedBatchNorm1d(_QuantizedBatchNorm, nn.BatchNorm1d):
    """Quantized :class:`torch.nn.BatchNorm1d` (simulated, not folded)."""


class QuantizedBatchNorm2d(_QuantizedBatchNorm, nn.BatchNorm2d):
    """Quantized :class:`torch.nn.BatchNorm2d` (simulated, not folded)."""


# -- parameter-free modules -----------------------------------------------------------------
class _QuantizedElementwise(QuantizationMixin):
    """``QDQ_out(float_forward(*QDQ_in(inputs)))`` for modules without parameters."""

    def forward(self, *inputs: Any) -> torch.Tensor:
        slots = tuple(self._modules["input_quantizers"]._modules.values())  # the ModuleList's entries, in order
        if slots.count(None) != len(slots):  # some input quantized
            if len(inputs) != len(slots):
                raise ValueError(
                    f"{type(self).__name__} got {len(inputs)} inputs but has {len(slots)} "
                    "input_quantizers; resize input_quantizers to match or set them to None"
                )
            qin = tuple(self._qinput(i, x) for i, x in enumerate(inputs))
        else:
            qin = tuple(map(plain, inputs))
        # every wrapped op returns a new tensor, except activations constructed with inplace=True
        return self._qoutput(super().forward(*qin), owned=not self.__dict__.get("inplace", False))  # type: ignore[misc]


class QuantizedReLU(_QuantizedElementwise, nn.ReLU):
    """Quantized :class:`torch.nn.ReLU`.

    In training inside a QuantizationSimModel (``plain_outputs``), ReLU and a
    fixed-range output quantizer run as one autograd node that keeps one byte
    per element for backward (ReLU alone keeps its float output).
    """

    def forward(self, *inputs: Any) -> torch.Tensor:
        q = self.output_quantizers[0]
        if (len(inputs) == 1 and self.plain_outputs and not self.inplace and torch.is_grad_enabled()
                and q is not None and getattr(q, "_direct_call", None) is not None
                and not torch.compiler.is_compiling()):  # compiled: relu and the quantizer's op, same bits
            x = self._qinput(0, inputs[0])
            call = q._direct_call(x)
            if call is not None:
                return relu_quantize_dequantize(x, call)
            return self._qoutput(F.relu(x), owned=True)
        return super().forward(*inputs)


class QuantizedGELU(_QuantizedElementwise, nn.GELU):
    """Quantized :class:`torch.nn.GELU` (keeps ``approximate``)."""


class QuantizedSiLU(_QuantizedElementwise, nn.SiLU):
    """Quantized :class:`torch.nn.SiLU`."""


class QuantizedSoftmax(_QuantizedElementwise, nn.Softmax):
    """Quantized :class:`torch.nn.Softmax` (keeps ``dim``)."""


class QuantizedSigmoid(_QuantizedElementwise, nn.Sigmoid):
    """Quantized :class:`torch.nn.Sigmoid`."""


class QuantizedTanh(_QuantizedElementwise, nn.Tanh):
    """Quantized :class:`torch.nn.Tanh`."""


class QuantizedReLU6(_QuantizedElementwise, nn.ReLU6):
    """Quantized :class:`torch.nn.ReLU6`."""


class QuantizedHardtanh(_QuantizedElementwise, nn.Hardtanh):
    """Quantized :class:`torch.nn.Hardtanh`."""


class QuantizedLeakyReLU(_QuantizedElementwise, nn.LeakyReLU):
    """Quantized :class:`torch.nn.LeakyReLU`."""


class QuantizedHardswish(_QuantizedElementwise, nn.Hardswish):
    """Quantized :class:`torch.nn.Hardswish`."""


class QuantizedHardsigmoid(_QuantizedElementwise, nn.Hardsigmoid):
    """Quantized :class:`torch.nn.Hardsigmoid`."""


class QuantizedELU(_QuantizedElementwise, nn.ELU):
    """Quantized :class:`torch.nn.ELU`."""


class QuantizedMish(_QuantizedElementwise, nn.Mish):
    """Quantized :class:`torch.nn.Mish`."""


class QuantizedPReLU(QuantizationMixin, nn.PReLU):
    """Quantized :class:`torch.nn.PReLU`: the slopes (``weight``) quantized per tensor, the output quantized.

    >>> import quanta.nn
    >>> prelu = quanta.nn.QuantizedPReLU(3)
    >>> prelu.param_quantizers["weight"], prelu.output_quantizers[0] is not None
    (QuantizeDequantize(shape=(), qmin=-128, qmax=127, symmetric=True), True)
    """

    def _init_quantizers(self) -> None:
        super()._init_quantizers()
        self.param_quantizers["weight"] = QuantizeDequantize(shape=(), bitwidth=8, symmetric=True)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._qoutput(F.prelu(self._qinput(0, input), self._qparam("weight")), owned=True)


class QuantizedPointwise(_QuantizedElementwise, Pointwise):
    """Quantized :class:`~quanta.nn.Pointwise`: the wrapped function's output quantized."""


# Average pooling makes values that are off the input grid, so its output gets a quantizer (max pooling does not).
class QuantizedAvgPool1d(_QuantizedElementwise, nn.AvgPool1d):
    """Quantized :class:`torch.nn.AvgPool1d`."""


class QuantizedAvgPool2d(_QuantizedElementwise, nn.AvgPool2d):
    """Quantized :class:`torch.nn.AvgPool2d`."""


class QuantizedAvgPool3d(_QuantizedElementwise, nn.AvgPool3d):
    """Quantized :class:`torch.nn.AvgPool3d`."""


class QuantizedAdaptiveAvgPool1d(_QuantizedElementwise, nn.AdaptiveAvgPool1d):
    """Quantized :class:`torch.nn.AdaptiveAvgPool1d`."""


class QuantizedAdaptiveAvgPool2d(_QuantizedElementwise, nn.AdaptiveAvgPool2d):
    """Quantized :class:`torch.nn.AdaptiveAvgPool2d`.

    >>> pool = QuantizedAdaptiveAvgPool2d(1)
    >>> with pool.compute_encodings():
    ...     _ = pool(torch.rand(2, 3, 4, 4))
    >>> pool(torch.rand(2, 3, 4, 4)).shape
    torch.Size([2, 3, 1, 1])
    """


class QuantizedAdaptiveAvgPool3d(_QuantizedElementwise, nn.AdaptiveAvgPool3d):
    """Quantized :class:`torch.nn.AdaptiveAvgPool3d`."""


class QuantizedAdd(_QuantizedElementwise, Add):
    """Quantized :class:`~quanta.nn.Add`: two input slots (off by default), output on.

    >>> import quanta.nn
    >>> add = quanta.nn.QuantizedAdd()
    >>> add.output_quantizers[0].set_range(0.0, 2.55)
    >>> add(torch.tensor([0.5]), torch.tensor([0.123]))
    DequantizedTensor([0.6200], grad_fn=<AliasBackward0>)
    """

    num_inputs = 2


class QuantizedSubtract(_QuantizedElementwise, Subtract):
    """Quantized :class:`~quanta.nn.Subtract`: two input slots (off by default), output on."""

    num_inputs = 2


class QuantizedMultiply(_QuantizedElementwise, Multiply):
    """Quantized :class:`~quanta.nn.Multiply`: two input slots."""

    num_inputs = 2


class QuantizedDivide(_QuantizedElementwise, Divide):
    """Quantized :class:`~quanta.nn.Divide`: two input slots (off by default), output on.

    >>> import quanta.nn
    >>> div = quanta.nn.QuantizedDivide()
    >>> div.output_quantizers[0].set_range(0.0, 2.55)
    >>> div(torch.tensor([1.0]), torch.tensor([3.0]))
    DequantizedTensor([0.3300], grad_fn=<AliasBackward0>)
    """

    num_inputs = 2


class QuantizedEinsum(_QuantizedElementwise, Einsum):
    """Quantized :class:`~quanta.nn.Einsum`: output quantized (one input slot, off, by default; give one
    quantizer per operand to quantize them)."""


class QuantizedBaddbmm(_QuantizedElementwise, Baddbmm):
    """Quantized :class:`~quanta.nn.Baddbmm`: three input slots (off by default), output on."""

    num_inputs = 3


class QuantizedInterpolate(_QuantizedElementwise, Interpolate):
    """Quantized :class:`~quanta.nn.Interpolate` (bilinear and the other value-computing modes): output
    quantized."""


class QuantizedQuickGELU(_QuantizedElementwise, QuickGELU):
    """Quantized :class:`~quanta.nn.QuickGELU`: one quantizer on the activation's output (as for GELU)."""


class QuantizedMatMul(_QuantizedElementwise, MatMul):
    """Quantized :class:`~quanta.nn.MatMul`: two input slots."""

    num_inputs = 2


class QuantizedMean(_QuantizedElementwise, Mean):
    """Quantized :class:`~quanta.nn.Mean`: output quantized."""


class QuantizedConcat(_QuantizedElementwise, Concat):
    """Quantized :class:`~quanta.nn.Concat` (keeps ``dim``).

    One input slot by default; to quantize inputs, give one quantizer per input:
    ``qcat.input_quantizers = nn.ModuleList([q0, q1])``.
    """


#: Built-in float -> quantized classes (exact types). Users add theirs with :func:`quanta.nn.register`.
BUILTIN: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: QuantizedLinear,
    TransposedLinear: QuantizedTransposedLinear,
    nn.Conv1d: QuantizedConv1d,
    nn.Conv2d: QuantizedConv2d,
    nn.Conv3d: QuantizedConv3d,
    nn.ConvTranspose1d: QuantizedConvTranspose1d,
    nn.ConvTranspose2d: QuantizedConvTranspose2d,
    nn.Embedding: QuantizedEmbedding,
    nn.LayerNorm: QuantizedLayerNorm,
    nn.GroupNorm: QuantizedGroupNorm,
    nn.RMSNorm: QuantizedRMSNorm,
    nn.BatchNorm1d: QuantizedBatchNorm1d,
    nn.BatchNorm2d: QuantizedBatchNorm2d,
    nn.ReLU: QuantizedReLU,
    nn.GELU: QuantizedGELU,
    nn.SiLU: QuantizedSiLU,
    nn.Softmax: QuantizedSoftmax,
    nn.Sigmoid: QuantizedSigmoid,
    nn.Tanh: QuantizedTanh,
    nn.ReLU6: QuantizedReLU6,
    nn.Hardtanh: QuantizedHardtanh,
    nn.LeakyReLU: QuantizedLeakyReLU,
    nn.Hardswish: QuantizedHardswish,
    nn.Hardsigmoid: QuantizedHardsigmoid,
    nn.ELU: QuantizedELU,
    nn.Mish: QuantizedMish,
    nn.AvgPool1d: QuantizedAvgPool1d,
    nn.AvgPool2d: QuantizedAvgPool2d,
    nn.AvgPool3d: QuantizedAvgPool3d,
    nn.AdaptiveAvgPool1d: QuantizedAdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d: QuantizedAdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d: QuantizedAdaptiveAvgPool3d,
    Add: QuantizedAdd,
    Multiply: QuantizedMultiply,
    Subtract: QuantizedSubtract,
    Divide: QuantizedDivide,
    Interpolate: QuantizedInterpolate,
    QuickGELU: QuantizedQuickGELU,
    Pointwise: QuantizedPointwise,
    Einsum: QuantizedEinsum,
    Baddbmm: QuantizedBaddbmm,
    nn.PReLU: QuantizedPReLU,
    OffsetRMSNorm: QuantizedOffsetRMSNorm,
    MatMul: QuantizedMatMul,
    Concat: QuantizedConcat,
    Mean: QuantizedMean,
    ChannelsFirstLayerNorm: QuantizedChannelsFirstLayerNorm,
}
