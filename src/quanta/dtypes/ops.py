"""Operations on :class:`~quanta.dtypes.AffineQuantizedTensor` (its ``__torch_dispatch__`` table).

Handled on the codes, without a float copy of the whole tensor:

- matmuls: ``F.linear`` (reaches here as ``t`` + ``mm``/``addmm``), ``torch.mm``,
  ``torch.addmm``: quanta's fused CPU kernels (:mod:`quanta.kernels.int_linear`)
  for int8 per-row weights and :class:`~quanta.dtypes.Int4CPULayout`; any
  other layout is dequantized a tile of rows at a time (about 1 MiB), never
  whole;
- ``F.embedding`` (dequantizes only the rows looked up);
- views and copies: ``t``/``transpose``/``permute`` (2-D, a flag flip),
  ``view``/``reshape``, slicing/``narrow``, ``select``, integer-tensor indexing
  on dim 0, ``detach``, ``clone``, ``copy_``, ``_to_copy`` (``.to``). A view
  keeps the tensor quantized whenever the block structure survives it.

Everything else runs on the dequantized tensor after a one-time warning per
operation, so results are right but not fast. In-place operations that would
modify the codes are refused with ``TypeError``: silently updating a float copy
would lose the update.

>>> from quanta.dtypes import AffineQuantizedTensor
>>> from quanta.quantization.quant_primitives import MappingType
>>> w = AffineQuantizedTensor.from_hp_to_intx(torch.randn(8, 16), MappingType.SYMMETRIC, (1, 16), torch.int8)
>>> x = torch.randn(2, 16)
>>> torch.allclose(torch.nn.functional.linear(x, w), x @ w.dequantize().t(), atol=5e-2)
True
>>> type(w[2:4]).__name__, w[2:4].shape, type(w.t()).__name__
('AffineQuantizedTensor', torch.Size([2, 16]), 'AffineQuantizedTensor')
"""

from __future__ import annotations

import weakref
from typing import Optional

import torch

from quanta.dtypes.affine_quantized_tensor import (  # dispatch, implements: the table's public names here too
    AffineQuantizedTensor,
    dispatch,
    implements,
    implements_torch_function,
)
from quanta.dtypes.block_ops import num_blocks, reshape_block_size, slice_block
from quanta.dtypes.layouts import FloatxTensorCoreLayout, PlainLayout
from quanta.dtypes.tensor_impl import Int4CPUAQTTensorImpl, PlainAQTTensorImpl, impl_class_for
from quanta.encodings.torchao import ZeroPointDomain
from quanta.kernels import int_linear, int_linear_native, linear_ops

__all__ = ["dispatch", "implements", "linear", "matmul", "swaps_2d"]

aten = torch.ops.aten
AQT = AffineQuantizedTensor
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # activations the fused CPU kernels take
_TILE_ELEMENTS = 1 << 18  # float elements dequantized at once by the tiled matmul (1 MiB in fp32)


# --------------------------------------------------------------------------- helpers
def _rebuild(w: AQT, data: torch.Tensor, scale: torch.Tensor, zp: Optional[torch.Tensor],
             block_size: tuple[int, ...], shape: torch.Size):
    """A new tensor with ``w``'s layout when it can hold the codes; else PlainLayout for integer codes,
    or ``NotImplemented`` (the dequantized fallback) for float codes, which PlainLayout would misread."""
    layout = w._layout
    try:
        impl = impl_class_for(layout).from_plain(data, scale, zp, layout, block_size)
    except ValueError:
        if data.is_floating_point() or isinstance(layout, FloatxTensorCoreLayout):
            return NotImplemented
        impl = impl_class_for(PlainLayout()).from_plain(data, scale, zp, PlainLayout(), block_size)
    return AQT(impl, block_size, shape, w.quant_min, w.quant_max, w.zero_point_domain, dtype=w.dtype)


def _transpose(w: AQT) -> AQT:
    return w._with(w.tensor_impl.t(), block_size=tuple(reversed(w.block_size)),
                   shape=torch.Size(reversed(w.shape)))


def _dequantize_rows(w: AQT, rows: slice | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dequantized storage rows of ``w`` (dim 0 of the stored codes), one scale row per code row."""
    impl = w.tensor_impl
    codes = impl.storage_rows(rows)
    scale, zp = impl.storage_qparams()
    sb = w.storage_block_size
    n = codes.shape[0]
    idx = torch.arange(rows.start, rows.start + n, device=codes.device) if isinstance(rows, slice) else rows
    scale = scale.index_select(0, idx // sb[0])
    zp = None if zp is None else zp.index_select(0, idx // sb[0])
    return w._dequantize_codes(codes, scale, zp, (1, *sb[1:]), dtype)


def _int8_rows(w: AQT) -> bool:
    """W stored as plain contiguous int8 [N, K], one scale per row: the int8 weight-only kernel's case."""
    impl = w.tensor_impl
    if not isinstance(impl, PlainAQTTensorImpl) or len(w.shape) != 2:
        return False
    data = impl.int_data
    k = data.shape[1]
    if data.dtype != torch.int8 or not data.is_contiguous() or k == 0:
        return False
    return w.storage_block_size == (1, k) and w.zero_point_domain is not ZeroPointDomain.FLOAT


# per int8 weight, by id of its scale tensor (dropped with it): (the scale, versions of scale and zero point,
# bf16 scale or None when the zero point is not zero); a scale or zero point changed in place is looked at again
_INT8_PREPARED: dict[int, tuple] = {}


def _int8_kernel_scale(w: AQT) -> Optional[torch.Tensor]:
    """The kernel's bf16 scale [N] (N values, no weight-sized work), or None if the zero point is not zero.

    The int8 kernel has no zero point; subtracting ``x.sum() * zp * s`` afterwards would cancel large
    terms, so weights with a nonzero zero point take the tiled path instead.
    """
    impl = w.tensor_impl
    zp = impl.zero_point if w.zero_point_domain is ZeroPointDomain.INT else None
    if torch.compiler.is_compiling():  # traced: no data-dependent test; the flag set when the codes were stored
        return impl.scale.reshape(-1).to(torch.bfloat16) if zp is None or impl.zero_point_is_zero else None
    key = (impl.scale._version, None if zp is None else (id(zp), zp._version))
    hit = _INT8_PREPARED.get(id(impl.scale))
    if hit is None or hit[0]() is not impl.scale or hit[1] != key:
        usable = zp is None or not bool(zp.any())
        if hit is None:
            weakref.finalize(impl.scale, _INT8_PREPARED.pop, id(impl.scale), None)
        hit = (weakref.ref(impl.scale), key,
               impl.scale.reshape(-1).to(torch.bfloat16).contiguous() if usable else None)
        _INT8_PREPARED[id(impl.scale)] = hit
    return hit[2]


def _int8_kernel_call(x: torch.Tensor, w: AQT, bias: Optional[torch.Tensor], n: int) -> Optional[torch.Tensor]:
    """The int8 weight-only kernel on ``x`` (a float CPU tensor with ``w``'s K features), or None if the zero
    point has become nonzero since (the tiled path then)."""
    scale16 = _int8_kernel_scale(w)
    if scale16 is None:
        return None
    return int_linear.int8_weight_only_linear_prepared(x, w.tensor_impl.int_data, scale16, bias)


def _int4_kernel_call(x: torch.Tensor, w: AQT, bias: Optional[torch.Tensor], n: int) -> Optional[torch.Tensor]:
    """The int4 kernel on ``x`` (a float CPU tensor with ``w``'s K features), ``n`` output features."""
    impl = w.tensor_impl
    return int_linear.int4_cpu_linear_prepared(x, impl.packed_weight, impl.scale_and_zero, impl.group_size, n,
                                               bias)


def _remember_kernel(w: AQT, call) -> None:
    """Record which kernel call serves ``F.linear`` on ``w`` (found by :func:`_matmul`), for
    :func:`linear_function`'s fast path: eager decode calls each weight's kernel once per token, and the checks
    that chose it cost several times the kernel's own dispatch. Keyed by the storage object, so that a new
    storage is looked at again; the call reads everything from the weight it is given, so a copied record (a
    deep copy copies ``__dict__``) still serves its own weight. The shape is kept too: reading ``w.shape``
    goes through ``__torch_function__``."""
    n, k = w.shape
    w.__dict__["_kernel_call"] = (w.tensor_impl, call, n, k)


# a bias as nn.Linear holds it (a Parameter) or a plain tensor: no subclass of its own to dispatch to
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


@implements_torch_function(torch.nn.functional.linear)
def linear_function(input, weight, bias=None):
    """``F.linear`` with a quantized weight (and a plain input and bias), else ``NotImplemented``."""
    # (traced by torch.compile: not looked at, dynamo does not follow a tensor's __dict__)
    known = (weight.__dict__.get("_kernel_call") if not torch.compiler.is_compiling() and type(weight) is AQT
             else None)
    if (known is not None and known[0] is weight.tensor_impl and type(input) is torch.Tensor
            and (bias is None or type(bias) in _PLAIN_TENSORS) and input.dtype in _KERNEL_DTYPES
            and input.device.type == "cpu" and input.dim() > 0 and input.shape[-1] == known[3]
            and not (torch.is_grad_enabled() and (input.requires_grad or (bias is not None and bias.requires_grad)))):
        out = known[1](input, weight, bias, known[2])  # what _matmul would call, without choosing it again
        if out is not None:
            return out
    if (type(weight) is not AQT or isinstance(input, AQT) or isinstance(bias, AQT) or len(weight.shape) != 2
            or not isinstance(input, torch.Tensor) or len(input.shape) == 0):
        return NotImplemented
    if torch.is_grad_enabled() and (input.requires_grad or (bias is not None and bias.requires_grad)):
        return NotImplemented  # the dispatch path (t + mm) records the autograd graph
    with torch._C.DisableTorchFunctionSubclass():
        return linear(input, weight, bias)


def linear(x: torch.Tensor, w: AQT, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ dequantize(w).T + bias`` for a weight ``w`` [N, K], on the codes.

    int8 per-row weights and Int4CPULayout weights run through quanta's CPU
    kernels (:mod:`quanta.kernels.int_linear`: float32 accumulation, one rounding
    to ``x``'s dtype). Other cases dequantize tiles of the stored rows in ``x``'s dtype.
    """
    if len(w.shape) != 2:
        raise ValueError(f"linear: the weight must be 2-D, got shape {tuple(w.shape)}")
    return _matmul(x, w, True, bias)


def matmul(x: torch.Tensor, b: AQT, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ dequantize(b) + bias`` in ``x``'s dtype for a 2-D ``b`` [K, N] (``b = W.T`` takes the kernels)."""
    return _matmul(x, b, False, bias)


def _matmul(x: torch.Tensor, q: AQT, flip: bool, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``x @ B + bias`` with ``B = dequantize(q).T`` if ``flip`` else ``dequantize(q)``, without building
    a transposed wrapper. The stored codes are the weight W [N, K] (B = W.T) when
    ``q.tensor_impl.transposed != flip``."""
    if not x.is_floating_point():
        raise TypeError(f"matmul: input must be a float tensor, got {x.dtype}")
    k, n_out = (q.shape[1], q.shape[0]) if flip else (q.shape[0], q.shape[1])
    if len(x.shape) == 0 or x.shape[-1] != k:
        raise ValueError(f"matmul: input has shape {tuple(x.shape)}, the quantized operand needs {k} features")
    impl = q.tensor_impl
    storage_is_weight = impl.transposed != flip
    if storage_is_weight and x.device.type == "cpu" and x.dtype in _KERNEL_DTYPES:
        # Traced (torch.compile, torch.export) without the native kernels: the Python custom ops (opaque in the
        # graph). Otherwise the native op itself, unchecked (it has a shape-only fake implementation): eager and
        # compiled calls alike skip the Python argument checks of the decode hot path.
        compiling = torch.compiler.is_compiling()
        native = int_linear_native.ready(load=compiling)
        traced = compiling and not native
        remember = native and not compiling and flip  # eager F.linear: linear_function's next call goes direct
        scale16 = _int8_kernel_scale(q) if _int8_rows(q) else None
        if scale16 is not None:
            if traced:
                return linear_ops.int8_weight_only_linear(x, impl.int_data, scale16, bias)
            if remember:
                _remember_kernel(q, _int8_kernel_call)
            return int_linear.int8_weight_only_linear_prepared(x, impl.int_data, scale16, bias)
        if isinstance(impl, Int4CPUAQTTensorImpl):
            if traced:
                return linear_ops.int4_cpu_linear(x, impl.packed_weight, impl.scale_and_zero, impl.group_size,
                                                  n_out, bias)
            if remember:
                _remember_kernel(q, _int4_kernel_call)
            return _int4_kernel_call(x, q, bias, n_out)
    x2 = x.reshape(-1, k)
    sb = q.storage_block_size
    if storage_is_weight:
        # storage is W [N, K]: each tile of output features is x @ rows.T
        step = _tile_rows(n_out, k, sb[0])
        out = x2.new_empty(x2.shape[0], n_out)
        for r0 in range(0, n_out, step):
            tile = _dequantize_rows(q, slice(r0, min(r0 + step, n_out)), x.dtype)
            torch.mm(x2, tile.t(), out=out[:, r0:r0 + tile.shape[0]])
    else:
        # storage is B [K, N]: accumulate x[:, tile] @ rows over tiles of K, in float32
        step = _tile_rows(k, n_out, sb[0])
        acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        acc = x2.new_zeros(x2.shape[0], n_out, dtype=acc_dtype)
        for r0 in range(0, k, step):
            tile = _dequantize_rows(q, slice(r0, min(r0 + step, k)), x.dtype)
            acc += (x2[:, r0:r0 + tile.shape[0]] @ tile).to(acc_dtype)
        out = acc.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], n_out)


def _tile_rows(rows: int, cols: int, block_rows: int) -> int:
    """Rows per tile: about ``_TILE_ELEMENTS`` elements, a multiple of the row block (or all rows)."""
    if block_rows >= rows:
        return max(rows, 1)
    step = max(_TILE_ELEMENTS // max(cols, 1), 1)
    return max(step - step % block_rows, block_rows)


# --------------------------------------------------------------------------- matmuls
@implements(aten.mm.default)
def _mm(func, args, kwargs):
    a, b = args
    if isinstance(b, AQT) and not isinstance(a, AQT):
        return matmul(a, b)
    if isinstance(a, AQT) and not isinstance(b, AQT):
        return _matmul(b.t(), a, True, None).t()  # a @ b = (b.T @ a.T).T
    return NotImplemented


@implements(aten.addmm.default)
def _addmm(func, args, kwargs):
    bias, a, b = args
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if isinstance(bias, AQT) or (isinstance(a, AQT) == isinstance(b, AQT)):
        return NotImplemented
    if isinstance(b, AQT) and beta == 1 and alpha == 1 and bias.dim() == 1:
        return matmul(a, b, bias)
    out = _mm(func, (a, b), {})
    if alpha != 1:
        out = out * alpha
    return out + bias * beta if beta != 0 else out


@implements(aten.embedding.default)
def _embedding(func, args, kwargs):
    w, indices = args[0], args[1]
    if not isinstance(w, AQT) or w.dim() != 2 or w.tensor_impl.transposed:
        return NotImplemented
    flat = indices.reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= w.shape[0]):
        raise IndexError(f"embedding: indices must lie in [0, {w.shape[0] - 1}], got "
                         f"[{int(flat.min())}, {int(flat.max())}]")
    return _dequantize_rows(w, flat, w.dtype).reshape(*indices.shape, w.shape[1])


# --------------------------------------------------------------------------- copies and moves
@implements(aten.detach.default, aten.alias.default)
def _detach(func, args, kwargs):
    return args[0]._with(args[0].tensor_impl._apply(func))


@implements(aten.clone.default)
def _clone(func, args, kwargs):
    return args[0]._with(args[0].tensor_impl._apply(torch.clone))


@implements(aten._to_copy.default)
def _to_copy(func, args, kwargs):
    w = args[0]
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        return NotImplemented
    impl = w.tensor_impl._apply(lambda t: t.to(device=device, copy=True))
    return w._with(impl, dtype=dtype)


@implements(aten.copy_.default)
def _copy(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, AQT):
        dst.copy_(src.dequantize())
        return dst
    if not isinstance(src, AQT):
        raise TypeError("copy_ into an AffineQuantizedTensor needs an AffineQuantizedTensor source with the same "
                        f"layout and block size, got a {type(src).__name__}; quantize it first")
    a, b = dst.tensor_impl, src.tensor_impl
    derived = ("zero_point_is_zero",)  # follows the values copied
    meta_a = {k: v for k, v in vars(a).items() if k not in a.tensor_names + derived}
    meta_b = {k: v for k, v in vars(b).items() if k not in b.tensor_names + derived}
    same = (type(a) is type(b) and meta_a == meta_b and dst.shape == src.shape and dst.block_size == src.block_size
            and (dst.quant_min, dst.quant_max, dst.zero_point_domain) == (src.quant_min, src.quant_max,
                                                                           src.zero_point_domain))
    ta, tb = a.tensors(), b.tensors()
    if not same or any((ta[k] is None) != (tb[k] is None) or (ta[k] is not None and ta[k].shape != tb[k].shape)
                       for k in ta):
        raise ValueError("copy_ between AffineQuantizedTensors needs the same layout, shape, block size, code "
                         f"range and storage shapes; got {src!r} into {dst!r}")
    for k, t in ta.items():
        if t is not None:
            t.copy_(tb[k])
    if isinstance(a, PlainAQTTensorImpl):  # inside dispatch, copies do not bump tensor versions
        _INT8_PREPARED.pop(id(a.scale), None)
        a.zero_point_is_zero = b.zero_point_is_zero
    return dst


@implements(aten.is_same_size.default)
def _is_same_size(func, args, kwargs):
    return args[0].shape == args[1].shape


# --------------------------------------------------------------------------- views
def swaps_2d(func, args) -> bool:
    """Whether a ``t``/``transpose``/``permute`` call on a 2-D tensor swaps its dimensions."""
    if func is aten.t.default:
        return True
    if func is aten.transpose.int:
        return args[1] % 2 != args[2] % 2
    return [d % 2 for d in args[1]] == [1, 0]


@implements(aten.t.default, aten.transpose.int, aten.permute.default)
def _t(func, args, kwargs):
    w = args[0]
    if w.dim() < 2:
        return w._with()
    if w.dim() > 2:
        return NotImplemented
    return _transpose(w) if swaps_2d(func, args) else w._with()


@implements(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, args, kwargs):
    w, size = args
    new_shape = torch.empty(w.shape, device="meta").view(size).shape
    block = reshape_block_size(tuple(w.shape), w.block_size, tuple(new_shape))
    if block is None:
        return NotImplemented
    data, scale, zp = w.tensor_impl.plain()
    nb = num_blocks(tuple(new_shape), block)
    return _rebuild(w, data.reshape(new_shape), scale.reshape(nb), None if zp is None else zp.reshape(nb), block,
                    new_shape)


@implements(aten.slice.Tensor)
def _slice(func, args, kwargs):
    w = args[0]
    params = dict(zip(("dim", "start", "end", "step"), args[1:]), **kwargs)
    dim = params.get("dim", 0) % w.dim()
    start, end, step = params.get("start"), params.get("end"), params.get("step", 1)
    start, end, step = slice(start, end, step).indices(w.shape[dim])
    block = slice_block(w.shape[dim], w.block_size[dim], start, end, step)
    if block is None:
        return NotImplemented
    new_block, s0, s1 = block
    data, scale, zp = w.tensor_impl.plain()
    sstep = step if w.block_size[dim] == 1 else 1

    def cut(t):
        return None if t is None else t[(slice(None),) * dim + (slice(s0, s1, sstep),)]

    data = data[(slice(None),) * dim + (slice(start, end, step),)]
    blocks = list(w.block_size)
    blocks[dim] = new_block
    return _rebuild(w, data, cut(scale), cut(zp), tuple(blocks), data.shape)


@implements(aten.select.int)
def _select(func, args, kwargs):
    w, dim, index = args
    dim %= w.dim()
    index = index + w.shape[dim] if index < 0 else index
    if not 0 <= index < w.shape[dim]:
        raise IndexError(f"select: index {index} is out of range for dim {dim} of size {w.shape[dim]}")
    data, scale, zp = w.tensor_impl.plain()
    b = w.block_size[dim]
    blocks = w.block_size[:dim] + w.block_size[dim + 1:]
    data = data.select(dim, index)
    return _rebuild(w, data, scale.select(dim, index // b), None if zp is None else zp.select(dim, index // b),
                    blocks, data.shape)


@implements(aten.index.Tensor)
def _index(func, args, kwargs):
    w, indices = args
    if not indices or indices[0] is None or any(i is not None for i in indices[1:]):
        return NotImplemented
    idx = indices[0]
    if idx.dtype not in (torch.int64, torch.int32) or w.dim() == 0:
        return NotImplemented
    idx = torch.where(idx < 0, idx + w.shape[0], idx).long()
    data, scale, zp = w.tensor_impl.plain()
    data = data[idx]
    b = w.block_size[0]
    blocks = (1,) * idx.dim() + w.block_size[1:]
    return _rebuild(w, data, scale[idx // b], None if zp is None else zp[idx // b], blocks, data.shape)
