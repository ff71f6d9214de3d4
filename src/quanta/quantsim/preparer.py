"""Make a captured model quantizable: functional ops inside ``forward`` become modules.

A quantizer lives in a module, so ``torch.matmul(q, k)`` or ``x + residual``
written inside ``forward`` has nowhere to keep one. Once a model is captured as
a graph (:mod:`quanta.quantsim.capture`: torch.export, or torch.fx tracing with
:func:`fx_trace`), :func:`convert_functional_ops` runs the example input through
it to learn which values are floating-point activations and replaces each call
of a known functional op on them by a call of a module (:class:`quanta.nn.Add`,
``Subtract``, ``Multiply``, ``Divide``, ``MatMul``, ``Concat``, ``Mean``,
``Interpolate`` (bilinear and the other value-computing modes), ``nn.Softmax``, ``nn.ReLU``, ``nn.GELU``,
``nn.SiLU``, ``nn.Sigmoid``, ``nn.Tanh``, ...); ``F.scaled_dot_product_attention``
is first expanded into the ops it stands for (:func:`_expand_sdpa`). The new
modules are registered under the module whose ``forward`` made the call
(``layers.0.attn.matmul_1``), so names stay readable. Code plain torch.fx cannot
trace because it asks a tensor for its dtype, device or rank
(``torch.finfo(x.dtype).min``) is traced a second time with those answered from
the example's run (:class:`_ValueTracer`).

Ops that change values but have no quantized counterpart (``torch.exp``,
``torch.pow``, ...) are kept in float and listed in :attr:`PreparedModel.float_ops`;
ops that only move, select or cast values (``view``, ``transpose``, ``getitem``,
``size``, ...) need no quantizer and are not listed; nor are values computed only
from integer inputs, buffers and constants (positions, masks, rotary tables),
which are not activations (:func:`_activation_nodes`).
"""

from __future__ import annotations

import copy
import enum
import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from quanta.nn import Add, Baddbmm, Concat, Divide, Einsum, Interpolate, MatMul, Mean, Multiply, Subtract
from quanta.nn.base import eval_mode
from quanta.nn.registry import quantized_class_for

__all__ = ["CaptureMethod", "PreparedModel", "convert_functional_ops", "fx_trace"]


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _binary(factory: Callable[[], nn.Module], extra_kwargs: tuple[str, ...] = ()) -> Callable[[fx.Node], Any]:
    def convert(node: fx.Node):
        if len(node.args) != 2 or any(k not in extra_kwargs for k in node.kwargs):
            return None  # alpha=..., out=... and other variants stay as they are
        return factory(), tuple(node.args)
    return convert


def _softmax(node: fx.Node):
    dim = _arg(node, 1, "dim")
    if not isinstance(dim, int) or _arg(node, 2, "dtype") is not None:
        return None  # (F.softmax's `_stacklevel` keyword, always recorded by fx, only affects warnings)
    return nn.Softmax(dim=dim), (node.args[0],)


def _unary(factory: Callable[..., nn.Module], *keys: str) -> Callable[[fx.Node], Any]:
    def convert(node: fx.Node):
        if len(node.args) != 1 or any(k not in keys for k in node.kwargs):
            return None
        if node.kwargs.get("inplace"):
            return None  # an in-place call may be relied on for its side effect
        return factory(**{k: v for k, v in node.kwargs.items() if k != "inplace"}), (node.args[0],)
    return convert


def _hardtanh(node: fx.Node):
    lo, hi = _arg(node, 1, "min_val", -1.0), _arg(node, 2, "max_val", 1.0)
    if not all(isinstance(v, (int, float)) for v in (lo, hi)) or _arg(node, 3, "inplace", False):
        return None
    return (nn.ReLU6() if (lo, hi) == (0, 6) else nn.Hardtanh(lo, hi)), (node.args[0],)


def _leaky_relu(node: fx.Node):
    slope = _arg(node, 1, "negative_slope", 0.01)
    if not isinstance(slope, (int, float)) or _arg(node, 2, "inplace", False):
        return None
    return nn.LeakyReLU(slope), (node.args[0],)


def _elu(node: fx.Node):
    alpha = _arg(node, 1, "alpha", 1.0)
    extra = [_arg(node, i, k, 1) for i, k in ((2, "scale"), (3, "input_scale"))]
    if not isinstance(alpha, (int, float)) or extra != [1, 1] or _arg(node, 4, "inplace", False) is True:
        return None
    return nn.ELU(alpha), (node.args[0],)


def _mean(node: fx.Node):
    dim, keepdim = _arg(node, 1, "dim"), _arg(node, 2, "keepdim", False)
    if _arg(node, 3, "dtype") is not None or not isinstance(keepdim, bool):
        return None
    if isinstance(dim, (list, tuple)):
        dim = tuple(dim)
    if not (dim is None or isinstance(dim, int) or isinstance(dim, tuple) and all(isinstance(d, int) for d in dim)):
        return None
    return Mean(dim, keepdim), (node.args[0],)


def _cat(node: fx.Node):
    tensors = _arg(node, 0, "tensors")
    dim = _arg(node, 1, "dim", 0)
    if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int):
        return None
    return Concat(dim=dim), tuple(tensors)


def _einsum(node: fx.Node):
    """``torch.einsum(eq, *operands)``, ``torch.einsum(eq, [operands])`` or aten's ``einsum(eq, tensors, path)``."""
    if not node.args or not isinstance(node.args[0], str):
        return None
    rest, path = node.args[1:], node.kwargs.get("path")
    if rest and isinstance(rest[0], (list, tuple)):
        operands = tuple(rest[0])
        if len(rest) > 1:
            path = rest[1]
    else:
        operands = tuple(rest)
    if path is not None or set(node.kwargs) - {"path"} or not operands:
        return None  # an explicit contraction order: left in float
    return Einsum(node.args[0]), operands


def _baddbmm(node: fx.Node):
    if len(node.args) != 3 or any(k not in ("beta", "alpha") for k in node.kwargs):
        return None
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    if not all(isinstance(v, (int, float)) for v in (beta, alpha)):
        return None
    return Baddbmm(beta, alpha), tuple(node.args)


def _interpolate(node: fx.Node):
    mode, antialias = _arg(node, 3, "mode", "nearest"), _arg(node, 6, "antialias", False)
    size, scale = _arg(node, 1, "size"), _arg(node, 2, "scale_factor")
    if mode not in Interpolate.MODES or antialias or _arg(node, 5, "recompute_scale_factor") or not (
            _static(size) or size is None and _static(scale)):
        return None
    return Interpolate(size=size, scale_factor=scale if size is None else None, mode=mode,
                       align_corners=_arg(node, 4, "align_corners")), (node.args[0],)


def _upsample(mode: str) -> Callable[[fx.Node], Any]:
    """aten's ``upsample_<mode>.vec(input, output_size, align_corners, scale_factors)`` (what F.interpolate
    records): the output size, or else the scale factors, as F.interpolate takes them."""
    def convert(node: fx.Node):
        size, align, scale = _arg(node, 1, "output_size"), _arg(node, 2, "align_corners"), _arg(node, 3, "scale_factors")
        if size is not None:
            return (Interpolate(size=tuple(size), mode=mode, align_corners=align), (node.args[0],)) if _static(
                size) else None
        return (Interpolate(scale_factor=tuple(scale), mode=mode, align_corners=align), (node.args[0],)) if _static(
            scale) else None
    return convert


def _static(value: Any) -> bool:
    """Whether ``value`` is a number or a non-empty list of numbers (not values computed in the graph)."""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, (int, float)) for v in value)
    return isinstance(value, (int, float))


_FUNCTIONS: dict[Any, tuple[str, Callable[[fx.Node], Any]]] = {
    operator.add: ("add", _binary(Add)),
    torch.add: ("add", _binary(Add)),
    operator.sub: ("sub", _binary(Subtract)),
    torch.sub: ("sub", _binary(Subtract)),
    operator.truediv: ("div", _binary(Divide)),
    torch.div: ("div", _binary(Divide)),  # rounding_mode=... (a keyword) is left alone
    F.interpolate: ("interpolate", _interpolate),
    torch.einsum: ("einsum", _einsum),
    torch.baddbmm: ("baddbmm", _baddbmm),
    torch.ops.aten.einsum.default: ("einsum", _einsum),
    torch.ops.aten.baddbmm.default: ("baddbmm", _baddbmm),
    operator.mul: ("mul", _binary(Multiply)),
    torch.mul: ("mul", _binary(Multiply)),
    operator.matmul: ("matmul", _binary(MatMul)),
    torch.matmul: ("matmul", _binary(MatMul)),
    torch.bmm: ("matmul", _binary(MatMul)),
    torch.cat: ("cat", _cat),
    torch.mean: ("mean", _mean),
    torch.concat: ("cat", _cat),
    torch.softmax: ("softmax", _softmax),
    F.softmax: ("softmax", _softmax),
    torch.relu: ("relu", _unary(nn.ReLU)),
    F.relu: ("relu", _unary(nn.ReLU, "inplace")),
    F.gelu: ("gelu", _unary(nn.GELU, "approximate")),
    F.silu: ("silu", _unary(nn.SiLU, "inplace")),
    torch.sigmoid: ("sigmoid", _unary(nn.Sigmoid)),
    F.sigmoid: ("sigmoid", _unary(nn.Sigmoid)),
    torch.tanh: ("tanh", _unary(nn.Tanh)),
    F.tanh: ("tanh", _unary(nn.Tanh)),
    F.relu6: ("relu6", _unary(nn.ReLU6, "inplace")),
    F.leaky_relu: ("leaky_relu", _leaky_relu),
    F.hardtanh: ("hardtanh", _hardtanh),
    F.elu: ("elu", _elu),
    F.hardswish: ("hardswish", _unary(nn.Hardswish, "inplace")),
    F.hardsigmoid: ("hardsigmoid", _unary(nn.Hardsigmoid, "inplace")),
    F.mish: ("mish", _unary(nn.Mish, "inplace")),
    torch.ops.aten.upsample_linear1d.vec: ("interpolate", _upsample("linear")),
    torch.ops.aten.upsample_bilinear2d.vec: ("interpolate", _upsample("bilinear")),
    torch.ops.aten.upsample_bicubic2d.vec: ("interpolate", _upsample("bicubic")),
    torch.ops.aten.upsample_trilinear3d.vec: ("interpolate", _upsample("trilinear")),
}
_METHODS: dict[str, tuple[str, Callable[[fx.Node], Any]]] = {
    "mean": ("mean", _mean),
    "add": ("add", _binary(Add)),
    "mul": ("mul", _binary(Multiply)),
    "sub": ("sub", _binary(Subtract)),
    "div": ("div", _binary(Divide)),
    "matmul": ("matmul", _binary(MatMul)),
    "bmm": ("matmul", _binary(MatMul)),
    "baddbmm": ("baddbmm", _baddbmm),
    "softmax": ("softmax", _softmax),
    "relu": ("relu", _unary(nn.ReLU)),
    "sigmoid": ("sigmoid", _unary(nn.Sigmoid)),
    "tanh": ("tanh", _unary(nn.Tanh)),
}

# Ops that only move, select or describe values: the output holds input values (or no tensor), no quantizer needed.
_PASSTHROUGH_FUNCTIONS = {
    operator.getitem, getattr, torch.flatten, torch.reshape, torch.transpose, torch.permute, torch.squeeze,
    torch.unsqueeze, torch.split, torch.chunk, torch.narrow, torch.stack, torch.max_pool1d, torch.max_pool2d,
    F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.dropout,
    torch.zeros_like, torch.ones_like, torch.full_like, torch.zeros, torch.ones, torch.arange, torch.tril, torch.triu,
    torch.where, F.pad, torch.roll, torch.flip, torch.tile, torch.repeat_interleave, torch.clone,
}
_PASSTHROUGH_METHODS = {
    "view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten", "squeeze", "unsqueeze",
    "size", "dim", "split", "chunk", "narrow", "expand", "expand_as", "repeat", "view_as", "t", "clone",
    "detach", "to", "type_as", "float", "masked_fill", "flip", "roll", "tril", "triu", "__getitem__",
    "unbind", "numel", "new_zeros", "new_ones", "new_empty", "new_full", "bool", "int", "long",
}
# Leaf modules that only move or select values.
_PASSTHROUGH_MODULES: tuple[type[nn.Module], ...] = (
    nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Flatten, nn.Unflatten,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d,
    nn.ZeroPad1d, nn.ZeroPad2d, nn.ZeroPad3d, nn.PixelShuffle, nn.PixelUnshuffle, nn.ChannelShuffle,
)


_aten = torch.ops.aten
# aten op -> the torch function with the same signature, which the functional-op rewrite knows
_ATEN_FUNCTIONS: dict[Any, Any] = {
    _aten.add.Tensor: torch.add, _aten.sub.Tensor: torch.sub, _aten.mul.Tensor: torch.mul,
    _aten.div.Tensor: torch.div, _aten.matmul.default: torch.matmul,
    _aten.bmm.default: torch.bmm, _aten.mean.dim: torch.mean, _aten.cat.default: torch.cat, _aten.concat.default: torch.cat,
    _aten.concatenate.default: torch.cat, _aten.softmax.int: torch.softmax,
    _aten.relu.default: torch.relu, _aten.sigmoid.default: torch.sigmoid, _aten.tanh.default: torch.tanh,
    _aten.gelu.default: F.gelu, _aten.silu.default: F.silu, _aten.hardswish.default: F.hardswish,
    _aten.hardsigmoid.default: F.hardsigmoid, _aten.mish.default: F.mish, _aten.leaky_relu.default: F.leaky_relu,
    _aten.hardtanh.default: F.hardtanh, _aten.relu6.default: F.relu6, _aten.elu.default: F.elu,
    _aten.scaled_dot_product_attention.default: F.scaled_dot_product_attention,
    _aten.dropout.default: F.dropout,
}
# aten ops that only move, select, cast or describe values (no quantizer needed)
_ATEN_PASSTHROUGH: frozenset[Any] = frozenset(
    getattr(_aten, name) for name in (
        "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "unsqueeze", "squeeze", "slice", "select",
        "expand", "expand_as", "clone", "contiguous", "alias", "detach", "flatten", "unflatten", "split",
        "split_with_sizes", "chunk", "unbind", "narrow", "index", "index_select", "gather", "embedding", "to",
        "_to_copy", "type_as", "_assert_tensor_metadata", "sym_size", "sym_numel", "sym_stride", "arange",
        "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones", "new_full",
        "new_empty", "empty", "empty_like", "masked_fill", "where", "tril", "triu", "repeat", "repeat_interleave",
        "roll", "flip", "stack", "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices",
        "adaptive_max_pool1d", "adaptive_max_pool2d", "pad", "constant_pad_nd", "pixel_shuffle", "pixel_unshuffle",
        "channel_shuffle", "lift_fresh_copy", "_check_is_size", "sym_constrain_range_for_size", "dropout",
        "feature_dropout", "alpha_dropout", "movedim", "view_as", "squeeze_", "unsqueeze_", "copy", "neg",
        "lt", "le", "gt", "ge", "eq", "ne", "logical_not", "logical_and", "logical_or", "__and__", "__or__",
        "bitwise_not", "bitwise_and", "bitwise_or", "scalar_tensor", "item", "_local_scalar_dense", "as_strided",
        "diagonal", "unfold", "im2col", "tile", "broadcast_to", "meshgrid", "index_put", "scatter",
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d", "_upsample_nearest_exact3d",
    ) if hasattr(_aten, name))


# in-place ops written ``x += y`` (ResNet's residual add): converted when nothing reads ``x`` afterwards
_ATEN_INPLACE: dict[Any, Any] = {_aten.add_.Tensor: torch.add, _aten.mul_.Tensor: torch.mul}


def aten_to_torch(gm: fx.GraphModule) -> None:
    """Rewrite the aten ops of :data:`_ATEN_FUNCTIONS` as calls of their torch functions, in place; likewise
    an in-place add/mul whose mutated input no later op reads (so the mutation is not observable)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in _ATEN_FUNCTIONS:
            node.target = _ATEN_FUNCTIONS[node.target]
        elif node.target in _ATEN_INPLACE and isinstance(node.args[0], fx.Node) and all(
                order[u] < order[node] for u in node.args[0].users if u is not node):
            node.target = _ATEN_INPLACE[node.target]
    gm.recompile()


def is_aten_passthrough(target: Any) -> bool:
    packet = getattr(target, "overloadpacket", None)
    return packet is not None and packet in _ATEN_PASSTHROUGH



class CaptureMethod(enum.Enum):
    """How a model was captured (see :mod:`quanta.quantsim.capture`)."""

    EXPORT = "export"  # torch.export
    FX = "fx"  # torch.fx symbolic tracing
    LEAVES = "leaves"  # not captured: only leaf modules are quantized


@dataclass
class PreparedModel:
    """What :func:`~quanta.quantsim.capture.prepare_model` made of a model.

    Attributes:
        model: the module to quantize (an ``fx.GraphModule`` when capture worked).
        method: how it was captured (:class:`CaptureMethod`).
        inserted: ``(name, module)`` for every functional op turned into a module, in graph order.
        float_ops: names of graph nodes that change activations, have no quantized counterpart and stay in float.
        direct_params: parameters that ``forward`` code reads directly (not through a quantizable module) and
            that reach an op other than a converted one: their owner module was traced through and they stay
            in float.
        param_inputs: ``{module name: {input index: parameter name}}`` for converted ops fed by a parameter
            read in ``forward`` (a layer scale, a class token, a position-embedding table), directly or through
            ops that only move values: the sim quantizes that input as a parameter.
        errors: why each capture method tried before ``method`` failed (first line of its error).
    """

    model: nn.Module
    method: CaptureMethod
    inserted: list[tuple[str, nn.Module]] = field(default_factory=list)
    float_ops: list[str] = field(default_factory=list)
    direct_params: list[str] = field(default_factory=list)
    param_inputs: dict[str, dict[int, str]] = field(default_factory=dict)
    errors: dict[CaptureMethod, str] = field(default_factory=dict)

    @property
    def traced(self) -> bool:
        """Whether the model was captured as a graph (functional ops quantizable)."""
        return self.method is not CaptureMethod.LEAVES

    @property
    def trace_error(self) -> str | None:
        """Why capture fell back, one line per method tried (None if the first method worked)."""
        return "; ".join(f"{m.value}: {e}" for m, e in self.errors.items()) or None

    @property
    def graph(self) -> fx.Graph | None:
        """The captured graph, or None."""
        return self.model.graph if isinstance(self.model, fx.GraphModule) else None


class _Tracer(fx.Tracer):
    """Keeps every module quanta can quantize (built-in or registered) a leaf, as well as torch.nn modules."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if quantized_class_for(m) is not None or isinstance(m, _PASSTHROUGH_MODULES):
            return True
        return super().is_leaf_module(m, module_qualified_name)


_NO_VALUE = object()
# nn.Module's own __call__/__getattr__, taken at import: torch.fx patches both while it traces, and a module
# run for its value must not be traced (nor its parameters turned into graph nodes)
_MODULE_CALL, _MODULE_GETATTR = nn.Module.__call__, nn.Module.__getattr__


class _ValueProxy(fx.Proxy):
    """A proxy that knows its tensor's dtype, device and rank from the dummy input's run.

    Code such as ``torch.finfo(x.dtype).min`` (Hugging Face attention masks),
    ``torch.arange(n, device=x.device)`` or ``if x.dim() == 4`` cannot be traced
    symbolically; with these answered from the real value it traces, and the
    answers become constants of the graph (the dummy input's dtype and device).
    Shapes stay symbolic.
    """

    def _value(self) -> Any:
        return self.node.meta.get("quanta_value", _NO_VALUE)

    @property
    def dtype(self) -> Any:  # type: ignore[override]
        v = self._value()
        return v.dtype if isinstance(v, torch.Tensor) else self.__getattr__("dtype")

    @property
    def device(self) -> Any:  # type: ignore[override]
        v = self._value()
        return v.device if isinstance(v, torch.Tensor) else self.__getattr__("device")

    @property
    def ndim(self) -> Any:  # type: ignore[override]
        v = self._value()
        return v.dim() if isinstance(v, torch.Tensor) else self.__getattr__("ndim")

    def dim(self) -> Any:
        v = self._value()
        return v.dim() if isinstance(v, torch.Tensor) else self.__getattr__("dim")()

    def is_floating_point(self) -> Any:
        v = self._value()
        return v.is_floating_point() if isinstance(v, torch.Tensor) else self.__getattr__("is_floating_point")()


class _ValueTracer(_Tracer):
    """:class:`_Tracer` that also runs every traced op on the dummy input (no grad, leaf modules in eval
    mode, buffers and inputs copied), so that proxies answer dtype/device/rank questions concretely."""

    def __init__(self, args: tuple) -> None:
        super().__init__()
        self._inputs = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ValueProxy(node, self)

    def create_proxy(self, kind, target, args, kwargs, name=None, type_expr=None,  # type: ignore[override]
                     proxy_factory_fn=None):
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        try:
            with torch.no_grad():
                proxy.node.meta["quanta_value"] = self._evaluate(kind, target, args, kwargs)
        except Exception:  # noqa: BLE001  (a value it cannot compute: that proxy stays purely symbolic)
            proxy.node.meta["quanta_value"] = _NO_VALUE
        return proxy

    def _evaluate(self, kind: str, target: Any, args: Any, kwargs: Any) -> Any:
        if kind == "placeholder":
            return self._inputs.pop(0) if self._inputs else _NO_VALUE
        unknown = False

        def value(a: Any) -> Any:
            nonlocal unknown
            if isinstance(a, fx.Proxy):
                v = a.node.meta.get("quanta_value", _NO_VALUE)
                unknown = unknown or v is _NO_VALUE
                return v
            return a

        args = torch.utils._pytree.tree_map(value, args)
        kwargs = torch.utils._pytree.tree_map(value, kwargs)
        if unknown:
            return _NO_VALUE
        if kind == "get_attr":
            v = _attr(self.root, target)
            return v.detach().clone() if isinstance(v, torch.Tensor) else v
        if kind == "call_function":
            return target(*args, **kwargs)
        if kind == "call_method":
            return getattr(args[0], target)(*args[1:], **kwargs)
        if kind == "call_module":
            module = self.root.get_submodule(target)
            patched = nn.Module.__call__, nn.Module.__getattr__
            nn.Module.__call__, nn.Module.__getattr__ = _MODULE_CALL, _MODULE_GETATTR  # type: ignore[method-assign]
            try:
                with eval_mode(module):  # a BatchNorm in training mode would update its statistics
                    return module(*args, **kwargs)
            finally:
                nn.Module.__call__, nn.Module.__getattr__ = patched  # type: ignore[method-assign]
        return _NO_VALUE


def _expand_sdpa(gm: fx.GraphModule) -> int:
    """Rewrite each ``F.scaled_dot_product_attention`` call as the ops it stands for, in place.

    ``softmax(q @ kᵀ · scale + mask) @ v`` with ``scale = 1/sqrt(q.size(-1))``
    unless given, a float ``attn_mask`` added, a bool one (or ``is_causal``)
    applied as ``-inf`` where False, and ``dropout_p > 0`` as dropout on the
    weights: the conversion pass then turns the matmuls, the scaling and the
    softmax into quantizable modules, as an integer backend runs attention.
    Calls with ``enable_gqa=True`` are left alone (kept in float, listed).
    Returns how many calls were rewritten.
    """
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        given = dict(zip(names, node.args)) | dict(node.kwargs)
        if set(given) - set(names) or given.get("enable_gqa", False) or len(node.args) < 3 and "value" not in given:
            continue
        q, k, v = given["query"], given["key"], given["value"]
        mask, p = given.get("attn_mask"), given.get("dropout_p", 0.0)
        causal, scale = given.get("is_causal", False), given.get("scale")
        if not isinstance(p, (int, float)) or not isinstance(causal, bool) or not (
                scale is None or isinstance(scale, (int, float))):
            continue  # values only known at run time: keep the call
        mask_meta = mask.meta.get("tensor_meta") if isinstance(mask, fx.Node) else None
        if mask is not None and (mask_meta is None or not hasattr(mask_meta, "dtype")):
            continue
        g = gm.graph
        before = set(g.nodes)
        with g.inserting_before(node):
            scores = g.call_function(torch.matmul, (q, g.call_method("transpose", (k, -2, -1))))
            if scale is None:
                scale = g.call_function(operator.pow, (g.call_method("size", (q, -1)), -0.5))
            scores = g.call_function(torch.mul, (scores, scale))
            if causal:
                ones = g.call_function(torch.ones, (g.call_method("size", (q, -2)), g.call_method("size", (k, -2))),
                                       {"dtype": torch.bool, "device": g.call_function(getattr, (q, "device"))})
                keep = g.call_method("tril", (ones,))
                scores = g.call_function(torch.where, (keep, scores, float("-inf")))
            if mask is not None:
                if mask_meta.dtype == torch.bool:  # one pass (masked_fill of the negation: a copy and two more)
                    scores = g.call_function(torch.where, (mask, scores, float("-inf")))
                else:
                    scores = g.call_function(torch.add, (scores, mask))
            weights = g.call_function(torch.softmax, (scores,), {"dim": -1})
            if p:
                weights = g.call_function(F.dropout, (weights,), {"p": float(p), "training": True})
            out = g.call_function(torch.matmul, (weights, v))
        scope = {k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")}
        for new_node in set(g.nodes) - before:  # named under the module that called SDPA
            new_node.meta.update(scope)
        out.meta = dict(node.meta)
        node.replace_all_uses_with(out)
        g.erase_node(node)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _is_float_tensor_node(node: fx.Node) -> bool:
    meta = node.meta.get("tensor_meta")
    return meta is not None and hasattr(meta, "dtype") and meta.dtype.is_floating_point


def _scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    qualname = list(stack.values())[-1][0]
    return qualname if isinstance(qualname, str) else ""


def _owner(gm: fx.GraphModule, scope: str) -> nn.Module:
    """The module at ``scope``, made (as an empty container, with its missing parents) if the capture
    left none there: torch.export keeps only modules that hold parameters or buffers."""
    owner: nn.Module = gm
    for part in scope.split(".") if scope else []:
        if part not in owner._modules:
            owner.add_module(part, nn.Module())
        owner = owner._modules[part]  # type: ignore[assignment]
    return owner


def _free_name(gm: fx.GraphModule, scope: str, kind: str, taken: set[str], *, whole: bool = False) -> str:
    """A new module name for a ``kind`` op called in ``scope``: ``scope.kind``, ``scope.kind_1``, ... or, when
    the op is all the scope's module computes (``whole``: an activation module such as transformers'
    ``GELUActivation``) and nothing is there, ``scope`` itself."""
    if whole and scope and scope not in taken:
        parent, _, leaf = scope.rpartition(".")
        if not hasattr(_owner(gm, parent), leaf):
            taken.add(scope)
            return scope
    owner = _owner(gm, scope)
    base = f"{scope}.{kind}" if scope else kind
    name, k = base, 0
    while name in taken or hasattr(owner, name.rsplit(".", 1)[-1]):
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _convert(node: fx.Node) -> tuple[str, Any] | None:
    if node.op == "call_function":
        entry = _FUNCTIONS.get(node.target)
    elif node.op == "call_method":
        entry = _METHODS.get(node.target)  # type: ignore[arg-type]
    else:
        return None
    if entry is None:
        return None
    kind, convert = entry
    made = convert(node)
    if made is not None and isinstance(made[0], nn.ReLU6):
        kind = "relu6"  # F.relu6 is hardtanh(0, 6)
    return None if made is None else (kind, made)


def _changes_values(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target not in _PASSTHROUGH_FUNCTIONS and not is_aten_passthrough(node.target)
    if node.op == "call_method":
        return node.target not in _PASSTHROUGH_METHODS
    return False


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def fx_trace(model: nn.Module, args: tuple | None = None) -> fx.GraphModule:
    """Symbolic trace; if that fails and ``args`` are given, a second trace that knows values' dtypes and
    devices from a run on ``args`` (:class:`_ValueTracer`). The first error is raised if both fail."""
    try:
        tracer: fx.Tracer = _Tracer()
        graph = tracer.trace(model)
    except Exception as first:
        if args is None:
            raise
        try:
            tracer = _ValueTracer(args)
            graph = tracer.trace(model)
        except Exception:  # noqa: BLE001  (report the plain tracer's error: it names what fx cannot do)
            raise first from None
        for node in graph.nodes:  # real tensors must not stay in the graph (they would pin memory)
            node.meta.pop("quanta_value", None)
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def _activation_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes whose value depends on a floating-point model input or on a parameter: the activations.

    Values computed only from integer inputs, buffers and constants (positions, attention masks, rotary
    tables) are not activations: quantizing them would only add error (a rotary angle on an 8-bit grid)."""
    params = {name for name, _ in gm.named_parameters(remove_duplicate=False)}
    active: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if _is_float_tensor_node(node):
                active.add(node)
        elif node.op == "get_attr":
            if node.target in params:
                active.add(node)
        elif node.op == "call_module":
            module = gm.get_submodule(node.target)  # type: ignore[arg-type]
            if any(a in active for a in node.all_input_nodes) or next(module.parameters(), None) is not None:
                active.add(node)
        elif any(a in active for a in node.all_input_nodes):
            active.add(node)
    return active


def convert_functional_ops(gm: fx.GraphModule, flat_args: list[Any], method: CaptureMethod) -> PreparedModel:
    """Give ``gm``'s value-changing functional ops on activations a module each (see the module docstring),
    in place; ``flat_args`` (the values of its placeholders) tell float tensors from others."""
    with eval_mode(gm), torch.no_grad():  # gm shares model's leaves: each gets its own flag back
        ShapeProp(gm).propagate(*flat_args)
        if _expand_sdpa(gm):  # the new nodes need their tensor metadata too
            ShapeProp(gm).propagate(*flat_args)
    prepared = PreparedModel(gm, method)
    active = _activation_nodes(gm)
    work = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method") and n in active
            and _is_float_tensor_node(n) and _changes_values(n)]
    per_scope = Counter(_scope(n) for n in work)
    taken: set[str] = set()
    for node in work:
        converted = _convert(node)
        if converted is None:
            prepared.float_ops.append(node.name)
            continue
        kind, (module, new_args) = converted
        scope = _scope(node)
        name = _free_name(gm, scope, kind, taken, whole=per_scope[scope] == 1)
        gm.add_submodule(name, module)
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(name, new_args)
        new.meta = copy.copy(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        prepared.inserted.append((name, module))
    _find_parameter_reads(gm, prepared)
    gm.graph.lint()
    gm.recompile()
    return prepared


def _find_parameter_reads(gm: fx.GraphModule, prepared: PreparedModel) -> None:
    """Fill ``prepared.param_inputs`` and ``prepared.direct_params`` (see :class:`PreparedModel`): follow each
    parameter read in ``forward`` through the ops that only move values to the ops that use it."""
    inserted = {name for name, _ in prepared.inserted}
    for node in gm.graph.nodes:
        if node.op != "get_attr" or not isinstance(_attr(gm, node.target), nn.Parameter):
            continue
        uses: list[tuple[fx.Node, fx.Node]] = []  # (consumer, the arg it reads)
        todo, covered = [node], True
        while todo:
            cur = todo.pop()
            for user in cur.users:
                moves = user.op in ("call_function", "call_method") and not _changes_values(user)
                if moves and not any(_is_float_tensor_node(a) for a in user.all_input_nodes if a is not cur):
                    todo.append(user)
                elif user.op == "call_module" and user.target in inserted:
                    uses.append((user, cur))
                else:
                    covered = False
        if not covered:
            prepared.direct_params.append(node.target)
            continue
        for user, arg in uses:
            for i, a in enumerate(user.args):
                if a is arg:
                    prepared.param_inputs.setdefault(str(user.target), {})[i] = str(node.target)
