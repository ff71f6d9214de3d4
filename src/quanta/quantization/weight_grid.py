"""The grid a ``quantize_`` base config puts a weight on, with its qparams held fixed while the values move.

Calibration algorithms that change a weight while they quantize it (GPTQ
quantizes column after column and corrects the columns not yet quantized) need
three things from the base config, and nothing more:

* ``fit(columns)``: the qparams the config would choose for a group of columns
  (by calling the config itself on them, so HQQ, float zero points, bfloat16
  storage of the scales... all come along);
* ``fake_quantize(columns, first)``: those columns put on the grid of fixed
  qparams (quantize, then dequantize, with the kernel layer's functions);
* ``build(values)``: the config's own quantized tensor (layout, packing,
  dynamic-activation wrapper) of the values quantized with the fixed qparams.

Every rounding and clamping is :mod:`quanta.quantization.quant_primitives`'s;
quantizing a matrix element by element with fixed qparams gives the same codes
whether it is done a column at a time or all at once, so ``build`` reproduces
exactly what ``fake_quantize`` returned along the way.

>>> import torch
>>> from torch import nn
>>> from quanta.quantization import Int4WeightOnlyConfig
>>> lin = nn.Linear(64, 8)
>>> grid = WeightGrid(Int4WeightOnlyConfig(group_size=32), lin, lin.weight.detach())
>>> grid.group_columns, grid.num_groups
(32, 2)
>>> w = lin.weight.detach()
>>> grid.fit(0, w[:, :32]); grid.fit(1, w[:, 32:])
>>> t = grid.build(w)
>>> torch.equal(t.dequantize(), grid.fake_quantize(w, 0))
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from torch import nn

from quanta.dtypes import AffineQuantizedTensor, Float8Layout, FloatxTensorCoreLayout
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor
from quanta.dtypes.tensor_impl import impl_class_for
from quanta.encodings.torchao import FixedAffineGrid
from quanta.quantization import quant_primitives as P

if TYPE_CHECKING:
    from quanta.quantization.quant_api import AOBaseConfig

__all__ = ["WeightGrid"]


def _affine(t: torch.Tensor) -> AffineQuantizedTensor:
    if isinstance(t, LinearActivationQuantizedTensor):
        return t.original_weight_tensor
    if isinstance(t, AffineQuantizedTensor):
        return t
    raise TypeError(f"the base config returned {type(t).__name__}, not a quanta quantized tensor")


class WeightGrid:
    """The base config's grid for a 2-D weight ``[N, K]``, qparams fitted group by group and then fixed.

    Args:
        config: a ``quantize_`` base config (``Int4WeightOnlyConfig(...)``, ``Int8WeightOnlyConfig()``, ...).
        module: the module the weight belongs to (passed on to the config).
        weight: the original weight; the config quantizes it once here, which fixes the layout, block,
            code range and, for blocks that span whole rows (per row, per tensor), the qparams.

    Attributes:
        group_columns: columns sharing one qparam per row block (``K`` for per-row configs).
        num_groups: ``K // group_columns``.
        row_block: rows sharing one qparam (1 except per tensor / 2-D blocks).

    A per-row (or per-tensor) config's qparams come from the original weight;
    a grouped config's groups start empty and each is set by :meth:`fit` (the
    template's, from the original weight, are kept by :meth:`fit_all_from_template`).
    """

    def __init__(self, config: "AOBaseConfig", module: nn.Module, weight: torch.Tensor) -> None:
        if weight.dim() != 2:
            raise ValueError(f"WeightGrid needs a 2-D weight, got shape {tuple(weight.shape)}")
        self.config, self.module = config, module
        self.dtype = weight.dtype
        self.shape = tuple(weight.shape)
        self.template = config.quantize_weight(weight, module)
        t = _affine(self.template)
        if t.tensor_impl.transposed:
            raise ValueError("WeightGrid needs the base config to store the weight untransposed")
        self.layout = t._layout
        self.block = tuple(t.block_size)
        self.row_block, self.group_columns = self.block
        self.num_groups = self.shape[1] // self.group_columns
        scale, zp = t.tensor_impl.storage_qparams()
        rows = self.shape[0] // self.row_block
        self.scale = scale.reshape(rows, self.num_groups).clone()
        self.zero_point = None if zp is None else zp.reshape(rows, self.num_groups).clone()
        self._template_qparams = (self.scale.clone(), None if zp is None else self.zero_point.clone())
        self._code_dtype = None if self.is_float else t.tensor_impl.storage_plain()[0].dtype
        self._fitted = torch.zeros(self.num_groups, dtype=torch.bool)
        self._column_params: dict[int, tuple[torch.Tensor, Optional[torch.Tensor], Optional[FixedAffineGrid]]] = {}
        if self.num_groups == 1:
            self._fitted[:] = True

    @property
    def is_float(self) -> bool:
        return isinstance(self.layout, (Float8Layout, FloatxTensorCoreLayout))

    def fit_all_from_template(self) -> None:
        """The qparams the config chose on the original weight, for every group (GPTQ's static groups)."""
        self.scale.copy_(self._template_qparams[0])
        if self.zero_point is not None:
            self.zero_point.copy_(self._template_qparams[1])
        self._fitted[:] = True
        self._column_params.clear()

    def fit(self, group: int, columns: torch.Tensor) -> None:
        """Set group ``group``'s qparams to what the config chooses for ``columns`` ``[N, group_columns]``."""
        if self.num_groups == 1:
            raise ValueError("this grid's qparams span whole rows; they are fixed by the original weight")
        if tuple(columns.shape) != (self.shape[0], self.group_columns):
            raise ValueError(f"columns must have shape {(self.shape[0], self.group_columns)}, got "
                             f"{tuple(columns.shape)}")
        t = _affine(self.config.quantize_weight(columns.to(self.dtype), self.module))
        scale, zp = t.tensor_impl.storage_qparams()
        self.scale[:, group] = scale.reshape(-1)
        if self.zero_point is not None:
            self.zero_point[:, group] = zp.reshape(-1)
        self._fitted[group] = True
        self._column_params.pop(group, None)

    def _params(self, first: int, count: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Full-size qparams ``[N, count]`` of columns ``first .. first + count - 1``."""
        if count == 1:  # GPTQ's column by column: one expansion per group
            return self._column_params_of(first // self.group_columns)[:2]
        return self._params_of(first, count)

    def _column_params_of(self, group: int) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[FixedAffineGrid]]:
        """A column of group ``group``: its qparams ``[N, 1]`` and, on an integer grid, those checked once."""
        if group not in self._column_params:
            scale, zp = self._params_of(group * self.group_columns, 1)
            fixed = None
            if not self.is_float:
                t = _affine(self.template)
                fixed = FixedAffineGrid((self.shape[0], 1), (1, 1), scale, zp, self._code_dtype, t.quant_min,
                                        t.quant_max, zero_point_domain=t.zero_point_domain)
            self._column_params[group] = (scale, zp, fixed)
        return self._column_params[group]

    def _params_of(self, first: int, count: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        groups = torch.arange(first, first + count) // self.group_columns
        if not bool(self._fitted[groups].all()):
            raise RuntimeError(f"groups {sorted(set(groups[~self._fitted[groups]].tolist()))} have no qparams "
                               "yet: fit them first")

        def expand(p: torch.Tensor) -> torch.Tensor:
            return p[:, groups].repeat_interleave(self.row_block, dim=0)

        return expand(self.scale), None if self.zero_point is None else expand(self.zero_point)

    def _codes(self, values: torch.Tensor, scale: torch.Tensor, zp: Optional[torch.Tensor]) -> torch.Tensor:
        t = _affine(self.template)
        x = values.to(self.dtype)
        if isinstance(self.layout, Float8Layout):
            return P.quantize_affine_float8(x, scale, t.tensor_impl.float8_data.dtype)
        if isinstance(self.layout, FloatxTensorCoreLayout):
            return torch.cat([P.quantize_affine_fpx(x[:, j:j + 1], scale[:, j], self.layout.ebits,
                                                    self.layout.mbits) for j in range(x.shape[1])], dim=1)
        return P.quantize_affine(x, (1, 1), scale, zp, self._code_dtype, t.quant_min, t.quant_max,
                                 zero_point_domain=t.zero_point_domain)

    def fake_quantize(self, values: torch.Tensor, first: int) -> torch.Tensor:
        """``values`` (columns ``first ..`` of the weight, ``[N, c]``) on the grid, in float32."""
        if values.shape[1] == 1:
            fixed = self._column_params_of(first // self.group_columns)[2]
            if fixed is not None:  # the same kernels as below, without re-checking the qparams at every column
                return fixed.dequantize(fixed.quantize(values.to(self.dtype)), self.dtype).float()
        scale, zp = self._params(first, values.shape[1])
        codes = self._codes(values, scale, zp)
        t = _affine(self.template)
        if isinstance(self.layout, FloatxTensorCoreLayout):
            return torch.cat([P.dequantize_affine_fpx(codes[:, j:j + 1], scale[:, j], self.layout.ebits,
                                                      self.layout.mbits, output_dtype=self.dtype)
                              for j in range(codes.shape[1])], dim=1).float()
        return t._dequantize_codes(codes, scale, zp, (1, 1), self.dtype).float()

    def build(self, values: torch.Tensor) -> torch.Tensor:
        """The config's quantized tensor of ``values`` ``[N, K]`` (the values each column had when quantized)."""
        if tuple(values.shape) != self.shape:
            raise ValueError(f"values must have shape {self.shape}, got {tuple(values.shape)}")
        t = _affine(self.template)
        scale, zp = self._params(0, self.shape[1])
        codes = self._codes(values, scale, zp)
        block_scale = self.scale.to(t.tensor_impl.storage_qparams()[0].dtype)
        block_zp = None if self.zero_point is None else self.zero_point.to(t.tensor_impl.storage_qparams()[1].dtype)
        if self.is_float:
            if isinstance(self.layout, FloatxTensorCoreLayout):
                block_scale = block_scale.reshape(-1)
            impl = impl_class_for(self.layout).from_plain(codes, block_scale, None, self.layout, self.block)
            out = AffineQuantizedTensor(impl, self.block, torch.Size(self.shape), dtype=self.dtype)
        else:
            out = AffineQuantizedTensor._from_codes(codes, block_scale, block_zp, self.block,
                                                    torch.Size(self.shape), codes.dtype, t.quant_min, t.quant_max,
                                                    t.zero_point_domain, self.layout, self.dtype)
        if isinstance(self.template, LinearActivationQuantizedTensor):
            return LinearActivationQuantizedTensor(out, self.template.act_mapping_type)
        return out
