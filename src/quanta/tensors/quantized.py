"""Tensors that remember how they were quantized (AIMET v2 style).

* :class:`QuantizedTensor` holds integer codes (as floats, so ordinary ops accept
  it) plus the encoding that maps them back to real values.
* :class:`DequantizedTensor` holds real values that lie on the grid of its
  encoding: the output of fake quantization.

Both convert into each other without loss (``x_q.dequantize().quantize()``
gives ``x_q`` back bit for bit) as long as the tensor's dtype can hold the
grid: float32 up to 21-bit grids, float16 up to 10 bits, bfloat16 up to 7 bits.

How the encoding travels with the data (rules are data, see ``_KEEP_ENCODING``):

* ops that keep every value and the shape (``clone``, ``detach``,
  ``contiguous``, float casts that can still hold the codes) keep the encoding;
* view-like ops (``view``, ``reshape``, ``transpose``, indexing, ...) keep a
  per-tensor encoding and drop any other (it would no longer line up);
* everything else, arithmetic included, returns plain ``torch.Tensor``;
* an in-place op that writes into the tensor drops its (now stale) encoding.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from quanta.encodings.affine import AffineEncoding
from quanta.encodings.float import FloatEncoding

__all__ = ["QuantizedTensorBase", "QuantizedTensor", "DequantizedTensor"]

_T = torch.Tensor

# Same values, same shape: the encoding stays valid at any granularity.
_KEEP_ENCODING: set[Callable] = {
    _T.clone, torch.clone, _T.detach, torch.detach, _T.contiguous, _T.requires_grad_,
    _T.cpu, _T.to, _T.float, _T.double, _T.half, _T.bfloat16, _T.type, _T.type_as,
    _T.pin_memory, _T.share_memory_, _T.detach_,
}
# Same values, new shape or a subset: valid only for a per-tensor encoding.
_KEEP_PER_TENSOR_ENCODING: set[Callable] = {
    _T.view, _T.view_as, _T.reshape, _T.reshape_as, torch.reshape, _T.flatten, torch.flatten,
    _T.unflatten, _T.squeeze, torch.squeeze, _T.unsqueeze, torch.unsqueeze, _T.transpose, torch.transpose,
    _T.permute, torch.permute, _T.t, torch.t, _T.T.__get__, _T.mT.__get__, _T.expand, _T.expand_as,
    _T.__getitem__, _T.narrow, torch.narrow, _T.select, torch.select, _T.split, torch.split,
    _T.chunk, torch.chunk, _T.unbind, torch.unbind, _T.movedim, torch.movedim, _T.flip, torch.flip,
    _T.roll, torch.roll, _T.repeat, _T.tile, torch.tile,
}
# Called for their side effects or Python protocol: results are passed back untouched.
_UNTOUCHED: set[Callable] = {
    _T.__reduce_ex__, _T.__repr__, _T.__format__, _T.__deepcopy__, _T.__setstate__,
    _T.__len__, _T.__iter__, _T.__bool__, _T.__float__, _T.__int__, _T.__index__, _T.tolist, _T.item,
    _T.numpy, _T.dim, _T.size, _T.numel, _T.shape.__get__, _T.dtype.__get__, _T.device.__get__,
    _T.grad.__get__, _T.requires_grad.__get__, _T.is_leaf.__get__, _T.grad_fn.__get__,
    _T.data_ptr, _T.untyped_storage, _T.stride, _T.is_contiguous, _T.element_size,
}
_CAST_FUNCS = {_T.to, _T.float, _T.double, _T.half, _T.bfloat16, _T.type, _T.type_as, _T.cpu}
_NO_WRITE_INPLACE = {_T.requires_grad_, _T.detach_, _T.share_memory_}
_EXACT_INTEGER_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def _is_inplace(func: Callable) -> bool:
    name = getattr(func, "__name__", "")
    if func in _NO_WRITE_INPLACE:
        return False
    return (name.endswith("_") and not name.endswith("__")) or name in {
        "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
        "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__setitem__",
    }


class QuantizedTensorBase(torch.Tensor):
    """Abstract base of tensors that carry an :class:`AffineEncoding` as ``.encoding``.

    Arithmetic on them returns plain tensors; see the module docstring for which
    ops keep the encoding.
    """

    encoding: AffineEncoding | FloatEncoding | None

    def quantize(self) -> "QuantizedTensor":
        raise NotImplementedError

    def dequantize(self) -> "DequantizedTensor":
        raise NotImplementedError

    def quantized_repr(self) -> torch.Tensor:
        """Codes in dtype ``self.encoding.dtype`` (no gradient): integers for affine encodings,
        the torch float8/16 dtype for float encodings.

        Raises ValueError if an affine code is NaN (an integer cannot hold it), or if
        torch has no dtype for a float encoding's format.
        """
        codes = self.quantize().as_subclass(torch.Tensor).detach()
        return self._require_encoding().quantized_repr(codes)

    def _require_encoding(self) -> AffineEncoding:
        enc = getattr(self, "encoding", None)
        if enc is None:
            raise RuntimeError(
                f"this {type(self).__name__} has no encoding: it was modified in place (or created without "
                "one), so its values are no longer known to be on a quantization grid"
            )
        return enc

    def __deepcopy__(self, memo: dict) -> "QuantizedTensorBase":
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol"
            )
        data = self.detach().as_subclass(torch.Tensor).clone()
        out = type(self)._wrap(data, copy.deepcopy(getattr(self, "encoding", None), memo))
        out.requires_grad_(self.requires_grad)
        memo[id(self)] = out
        return out

    @classmethod
    def _wrap(cls, t: torch.Tensor, encoding: AffineEncoding | None):
        out = t.as_subclass(cls)
        out.encoding = encoding
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in _UNTOUCHED:
            return out
        self = args[0] if args else None
        if isinstance(self, QuantizedTensorBase) and _is_inplace(func):
            self.encoding = None
            return out
        encoding = getattr(self, "encoding", None) if isinstance(self, QuantizedTensorBase) else None
        keep = encoding is not None and (
            func in _KEEP_ENCODING or (func in _KEEP_PER_TENSOR_ENCODING and encoding.scale.numel() == 1)
        )
        if keep and func in _CAST_FUNCS:
            keep = self._holds_after_cast(out)
        inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}

        def convert(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or id(t) in inputs:
                return t
            if keep:
                return type(self)._wrap(t, encoding)
            return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t

        return tree_map(convert, out)

    def _holds_after_cast(self, out: Any) -> bool:
        if not isinstance(out, torch.Tensor) or out.dtype not in _EXACT_INTEGER_DTYPES:
            return False
        return self._require_encoding().holds_in(out.dtype)


class QuantizedTensor(QuantizedTensorBase):
    """Integer codes stored in a floating-point tensor, with their encoding.

    >>> import quanta.quantization as Q
    >>> x = torch.tensor([[2.57, -2.312], [0.153, 0.205]])
    >>> quantizer = Q.affine.Quantize(shape=(), bitwidth=8, symmetric=True)
    >>> quantizer.set_range(-128 * 0.1, 127 * 0.1)
    >>> x_q = quantizer(x)
    >>> x_q
    QuantizedTensor([[ 26., -23.],
                     [  2.,   2.]], grad_fn=<AliasBackward0>)
    >>> x_dq = x_q.dequantize()
    >>> x_dq
    DequantizedTensor([[ 2.6000, -2.3000],
                       [ 0.2000,  0.2000]], grad_fn=<AliasBackward0>)
    >>> torch.equal(x_dq.encoding.scale, x_q.encoding.scale)
    True
    >>> x_q.quantized_repr()
    tensor([[ 26, -23],
            [  2,   2]], dtype=torch.int8)
    """

    def quantize(self) -> "QuantizedTensor":
        """Already quantized: returns ``self`` (an error if an in-place write dropped the encoding)."""
        self._require_encoding()
        return self

    def dequantize(self) -> "DequantizedTensor":
        """Real values ``(q + offset) * scale`` as a :class:`DequantizedTensor` with the same encoding."""
        enc = self._require_encoding()
        out = enc.dequantize(self.as_subclass(torch.Tensor))
        return DequantizedTensor._wrap(out, enc)


class DequantizedTensor(QuantizedTensorBase):
    """Real values on the grid of an encoding (the result of fake quantization).

    >>> import quanta.quantization as Q
    >>> x = torch.tensor([[0.39, 51.0], [3.521, 9.41]])
    >>> quant_dequant = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    >>> quant_dequant.set_range(-10, 41)
    >>> x_qdq = quant_dequant(x)
    >>> x_qdq
    DequantizedTensor([[ 0.4000, 41.0000],
                       [ 3.6000,  9.4000]], grad_fn=<AliasBackward0>)
    >>> x_qdq.quantize()
    QuantizedTensor([[ 52., 255.],
                     [ 68.,  97.]], grad_fn=<AliasBackward0>)
    >>> x_qdq.quantized_repr()
    tensor([[ 52, 255],
            [ 68,  97]], dtype=torch.uint8)
    """

    def quantize(self) -> QuantizedTensor:
        """Codes ``clamp(round(x/scale) - offset, qmin, qmax)`` as a :class:`QuantizedTensor`."""
        enc = self._require_encoding()
        out = enc.quantize(self.as_subclass(torch.Tensor))
        return QuantizedTensor._wrap(out, enc)

    def dequantize(self) -> "DequantizedTensor":
        """Already dequantized: returns ``self`` (an error if an in-place write dropped the encoding)."""
        self._require_encoding()
        return self
