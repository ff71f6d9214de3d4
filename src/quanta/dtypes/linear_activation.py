"""``LinearActivationQuantizedTensor``: an int8 weight whose linear layers also quantize their input.

At each ``F.linear(x, w)``, ``x`` is quantized to int8 per token (one scale per
row of ``x``, symmetric ``[-127, 127]`` or asymmetric with a zero point, as
torchao's ``Int8DynamicActivationInt8WeightConfig``), multiplied with the int8
weight by quanta's integer kernel (int32 accumulation) and rescaled:
``y = s_x * s_w * (q_x @ q_w.T - z_x * colsum(q_w))``. The weight's column sums
(for the asymmetric case) are computed once, when the tensor is built.

Any other use of the tensor (views, ``embedding``, arithmetic) acts on the
weight alone, as its :class:`~quanta.dtypes.AffineQuantizedTensor`.

>>> from quanta.dtypes import AffineQuantizedTensor
>>> from quanta.quantization.quant_primitives import MappingType
>>> _ = torch.manual_seed(0)
>>> w = AffineQuantizedTensor.from_hp_to_intx(torch.randn(16, 32), MappingType.SYMMETRIC, (1, 32), torch.int8)
>>> lw = LinearActivationQuantizedTensor(w, MappingType.SYMMETRIC)
>>> x = torch.randn(4, 32)
>>> y = torch.nn.functional.linear(x, lw)
>>> bool(((y - x @ w.dequantize().t()).norm() / y.norm()) < 0.02)
True
"""

from __future__ import annotations

from typing import Optional

import torch

from quanta.dtypes.affine_quantized_tensor import AffineQuantizedTensor
from quanta.dtypes.compile_cache import stable_hash_for_caching
from quanta.dtypes.layouts import PlainLayout
from quanta.dtypes.ops import dispatch, swaps_2d
from quanta.encodings.torchao import MappingType, ZeroPointDomain
from quanta.kernels import int_linear, int_linear_native, linear_ops
from quanta.kernels.int_linear import int8_weight_col_sums

__all__ = ["LinearActivationQuantizedTensor", "check_int8_dynamic_weight"]

aten = torch.ops.aten


def check_int8_dynamic_weight(w: AffineQuantizedTensor) -> None:
    """ValueError unless ``w`` is a 2-D plain int8 weight with one symmetric scale per row."""
    impl = w.tensor_impl
    ok = (isinstance(w, AffineQuantizedTensor) and w.dim() == 2 and isinstance(w._layout, PlainLayout)
          and not impl.transposed and impl.int_data.dtype == torch.int8 and w.block_size == (1, w.shape[1])
          and w.zero_point_domain is not ZeroPointDomain.FLOAT
          and (impl.zero_point is None or not bool(impl.zero_point.any())))
    if not ok:
        raise ValueError("dynamic int8 activation quantization needs a 2-D PlainLayout int8 weight with one "
                         f"symmetric scale per row (block_size (1, K), zero point 0), got {w!r}")


class LinearActivationQuantizedTensor(torch.Tensor):
    """An int8 :class:`AffineQuantizedTensor` weight plus per-token int8 quantization of linear inputs.

    Args:
        original_weight_tensor: 2-D int8 weight, symmetric, one scale per row.
        act_mapping_type: ``MappingType.SYMMETRIC`` (codes [-127, 127], eps 1e-5,
            torchao's default) or ``MappingType.ASYMMETRIC`` (codes [-128, 127] with a
            zero point per token).
    """

    @staticmethod
    def __new__(cls, original_weight_tensor: AffineQuantizedTensor, act_mapping_type: MappingType,
                weight_col_sums: Optional[torch.Tensor] = None, *, transposed: bool = False):
        if not isinstance(original_weight_tensor, AffineQuantizedTensor):
            raise TypeError(f"original_weight_tensor must be an AffineQuantizedTensor, got "
                            f"{type(original_weight_tensor).__name__}")
        shape = original_weight_tensor.shape
        return torch.Tensor._make_wrapper_subclass(cls, shape[::-1] if transposed else shape,
                                                   dtype=original_weight_tensor.dtype,
                                                   device=original_weight_tensor.device, requires_grad=False)

    def __init__(self, original_weight_tensor: AffineQuantizedTensor, act_mapping_type: MappingType,
                 weight_col_sums: Optional[torch.Tensor] = None, *, transposed: bool = False) -> None:
        if act_mapping_type not in (MappingType.SYMMETRIC, MappingType.ASYMMETRIC):
            raise ValueError(f"act_mapping_type must be MappingType.SYMMETRIC or ASYMMETRIC, got {act_mapping_type!r}")
        check_int8_dynamic_weight(original_weight_tensor)
        self.original_weight_tensor = original_weight_tensor
        self.act_mapping_type = act_mapping_type
        # the native kernel needs them for either mapping. Computed here, once: the kernel's own cache cannot keep
        # them, since below autograd int_data.t() is a fresh tensor on every call, not a view it recognises.
        if weight_col_sums is None:
            weight_col_sums = int8_weight_col_sums(original_weight_tensor.tensor_impl.int_data)
        self.weight_col_sums = weight_col_sums
        self.transposed = transposed  # set by t(): F.linear reaches mm(x, w.t())

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(original_weight_tensor={self.original_weight_tensor!r}, "
                f"act_mapping_type={self.act_mapping_type})")

    def dequantize(self, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The weight's high-precision values."""
        return self._weight().dequantize(output_dtype)

    def _weight(self) -> AffineQuantizedTensor:
        """The weight as an AffineQuantizedTensor in this tensor's orientation."""
        w = self.original_weight_tensor
        return w.t() if self.transposed else w

    @property
    def storage_nbytes(self) -> int:
        extra = 0 if self.weight_col_sums is None else self.weight_col_sums.numel() * 4
        return self.original_weight_tensor.storage_nbytes + extra

    def _stable_hash_for_caching(self) -> str:
        """The key of this tensor in torch.compile's caches (:mod:`quanta.dtypes.compile_cache`)."""
        return stable_hash_for_caching(self)

    def __tensor_flatten__(self):
        names = ["original_weight_tensor"] + (["weight_col_sums"] if self.weight_col_sums is not None else [])
        return names, (self.act_mapping_type, self.transposed)

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, outer_size, outer_stride):
        return cls._make(inner["original_weight_tensor"], meta[0], inner.get("weight_col_sums"), meta[1])

    @classmethod
    def _make(cls, weight: AffineQuantizedTensor, act_mapping_type: MappingType,
              weight_col_sums: Optional[torch.Tensor], transposed: bool) -> "LinearActivationQuantizedTensor":
        """Rebuild from parts of a checked tensor, without re-validating (traced values cannot be read)."""
        out = cls.__new__(cls, weight, act_mapping_type, transposed=transposed)
        out.original_weight_tensor, out.act_mapping_type = weight, act_mapping_type
        out.weight_col_sums, out.transposed = weight_col_sums, transposed
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten.linear.default:  # reaches dispatch whole under inference_mode
            x, w, bias = (*args, None)[:3] if len(args) < 3 else args[:3]
            bias = kwargs.get("bias", bias)
            if (isinstance(w, cls) and not w.transposed and not isinstance(x, cls)
                    and (bias is None or (bias.dim() == 1 and not isinstance(bias, cls)))):
                return w.linear(x, bias)
        if func in (aten.mm.default, aten.addmm.default):
            bias, a, b = (None, *args) if func is aten.mm.default else args
            plain_bias = bias is None or (bias.dim() == 1 and not isinstance(bias, cls))
            if (isinstance(b, cls) and b.transposed and not isinstance(a, cls) and plain_bias
                    and kwargs.get("beta", 1) == 1 and kwargs.get("alpha", 1) == 1):
                return b.linear(a, bias)
        w = args[0] if args else None
        if func is aten.copy_.default and isinstance(w, cls):
            return cls._copy(w, args[1])
        if isinstance(w, cls):
            if func in (aten.t.default, aten.permute.default, aten.transpose.int) and w.dim() == 2:
                return cls._make(w.original_weight_tensor, w.act_mapping_type, w.weight_col_sums,
                                 w.transposed != swaps_2d(func, args))
            if func in (aten.detach.default, aten.clone.default, aten._to_copy.default, aten.alias.default):
                inner = func(w.original_weight_tensor, *args[1:], **kwargs)
                device = kwargs.get("device")
                sums = w.weight_col_sums
                if sums is not None:
                    sums = sums.detach() if func is not aten._to_copy.default else sums.to(device=device, copy=True)
                return cls._make(inner, w.act_mapping_type, sums, w.transposed)
        def unwrap(a):
            return a._weight() if isinstance(a, cls) else a

        return dispatch(func, tuple(unwrap(a) for a in args), {k: unwrap(v) for k, v in kwargs.items()})

    @classmethod
    def _copy(cls, dst: "LinearActivationQuantizedTensor", src: object) -> "LinearActivationQuantizedTensor":
        if not isinstance(src, cls) or (src.act_mapping_type, src.transposed) != (dst.act_mapping_type,
                                                                                 dst.transposed):
            raise ValueError("copy_ into a LinearActivationQuantizedTensor needs one with the same act_mapping_type "
                             f"and orientation, got {src!r}")
        dst.original_weight_tensor.copy_(src.original_weight_tensor)
        if dst.weight_col_sums is not None:  # derived from the codes just copied
            dst.weight_col_sums.copy_(int8_weight_col_sums(dst.original_weight_tensor.tensor_impl.int_data))
        return dst

    def linear(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``F.linear(x, w, bias)`` for the weight ``w`` of shape (N, K), via int8 activations and an integer matmul."""
        impl = self.original_weight_tensor.tensor_impl
        if x.dtype == torch.float64:  # activations become int8 anyway: run in float32, return float64
            return self.linear(x.to(torch.float32), None if bias is None else bias.to(torch.float32)).to(x.dtype)
        scale = impl.scale.reshape(-1).to(torch.float32)
        symmetric = self.act_mapping_type is MappingType.SYMMETRIC
        compiling = torch.compiler.is_compiling()
        native = int_linear_native.ready(load=compiling)
        if compiling and not native:  # the Python kernels as opaque ops in traced graphs
            return linear_ops.int8_dynamic_activation_linear(x, impl.int_data.t(), scale, self.weight_col_sums,
                                                             bias, act_symmetric=symmetric)
        if native and self.weight_col_sums is not None and x.device.type == "cpu" and impl.int_data.is_contiguous():
            # the native op directly (it has a fake implementation): no Python checks per call, eager or traced
            return int_linear.int8_dynamic_activation_linear_prepared(x, impl.int_data, scale, self.weight_col_sums,
                                                                      bias, act_symmetric=symmetric)
        return int_linear.int8_dynamic_activation_linear(x, impl.int_data.t(), scale, self.weight_col_sums, bias,
                                                         act_symmetric=symmetric)
