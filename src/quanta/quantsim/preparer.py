"""Make a model quantizable: functional ops inside ``forward`` become modules.

A quantizer lives in a module, so ``torch.matmul(q, k)`` or ``x + residual``
written inside ``forward`` has nowhere to keep one. :func:`prepare_model`
traces the model with :mod:`torch.fx` (modules that quanta can quantize, and
``torch.nn`` modules, stay leaves), runs ``dummy_input`` through the trace to
learn which values are floating-point tensors, and replaces each float-tensor
call of a known functional op by a call of a module (:class:`quanta.nn.Add`,
``Multiply``, ``MatMul``, ``Concat``, ``nn.Softmax``, ``nn.ReLU``, ``nn.GELU``,
``nn.SiLU``, ``nn.Sigmoid``, ``nn.Tanh``, ...); ``F.scaled_dot_product_attention``
is first expanded into the ops it stands for (:func:`_expand_sdpa`). The new
modules are registered under the module whose ``forward`` made the call
(``layers.0.attn.matmul_1``), so names stay readable. Code plain torch.fx cannot
trace because it asks a tensor for its dtype, device or rank
(``torch.finfo(x.dtype).min``) is traced a second time with those answered from
the dummy input's run (:class:`_ValueTracer`).

Ops that change values but have no quantized counterpart (``torch.exp``,
``x / y``, ...) are kept in float and listed in :attr:`PreparedModel.float_ops`;
ops that only move or select values (``view``, ``transpose``, ``getitem``,
``size``, ...) need no quantizer and are not listed.

>>> import torch
>>> class Attn(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.q = torch.nn.Linear(8, 8)
...     def forward(self, x):
...         s = torch.matmul(self.q(x), x.transpose(-1, -2))
...         return torch.softmax(s, dim=-1) @ x + x
>>> prepared = prepare_model(Attn(), (torch.randn(2, 4, 8),))
>>> [name for name, _ in prepared.inserted]
['matmul', 'softmax', 'matmul_1', 'add']
>>> prepared.traced
True
"""

from __future__ import annotations

import copy
import operator
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp

from quanta.nn import Add, Concat, MatMul, Multiply
from quanta.nn.base import eval_mode
from quanta.nn.registry import quantized_class_for

__all__ = ["PreparedModel", "prepare_model"]


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


def _cat(node: fx.Node):
    tensors = _arg(node, 0, "tensors")
    dim = _arg(node, 1, "dim", 0)
    if not isinstance(tensors, (list, tuple)) or not isinstance(dim, int):
        return None
    return Concat(dim=dim), tuple(tensors)


_FUNCTIONS: dict[Any, tuple[str, Callable[[fx.Node], Any]]] = {
    operator.add: ("add", _binary(Add)),
    torch.add: ("add", _binary(Add)),
    operator.mul: ("mul", _binary(Multiply)),
    torch.mul: ("mul", _binary(Multiply)),
    operator.matmul: ("matmul", _binary(MatMul)),
    torch.matmul: ("matmul", _binary(MatMul)),
    torch.bmm: ("matmul", _binary(MatMul)),
    torch.cat: ("cat", _cat),
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
    F.leaky_relu: ("leaky_relu", _unary(nn.LeakyReLU, "negative_slope", "inplace")),
    F.hardswish: ("hardswish", _unary(nn.Hardswish, "inplace")),
    F.hardsigmoid: ("hardsigmoid", _unary(nn.Hardsigmoid, "inplace")),
    F.mish: ("mish", _unary(nn.Mish, "inplace")),
}
_METHODS: dict[str, tuple[str, Callable[[fx.Node], Any]]] = {
    "add": ("add", _binary(Add)),
    "mul": ("mul", _binary(Multiply)),
    "matmul": ("matmul", _binary(MatMul)),
    "bmm": ("matmul", _binary(MatMul)),
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


@dataclass
class PreparedModel:
    """What :func:`prepare_model` made of a model.

    Attributes:
        model: the module to quantize (an ``fx.GraphModule`` when tracing worked).
        traced: whether torch.fx traced it (else functional ops are not quantized; see ``trace_error``).
        inserted: ``(name, module)`` for every functional op turned into a module, in graph order.
        float_ops: names of graph nodes that change values, have no quantized counterpart and stay in float.
        direct_params: parameters that ``forward`` code reads directly (not through a quantizable module):
            their owner module was traced through and they stay in float.
        trace_error: why tracing failed (None if it worked).
    """

    model: nn.Module
    traced: bool
    inserted: list[tuple[str, nn.Module]] = field(default_factory=list)
    float_ops: list[str] = field(default_factory=list)
    direct_params: list[str] = field(default_factory=list)
    trace_error: str | None = None

    @property
    def graph(self) -> fx.Graph | None:
        """The traced graph, or None."""
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
                scores = g.call_method("masked_fill", (scores, g.call_function(torch.logical_not, (keep,)),
                                                       float("-inf")))
            if mask is not None:
                if mask_meta.dtype == torch.bool:
                    scores = g.call_method("masked_fill", (scores, g.call_function(torch.logical_not, (mask,)),
                                                           float("-inf")))
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


def _as_tuple(dummy_input: Any) -> tuple[Any, ...]:
    return dummy_input if isinstance(dummy_input, tuple) else (dummy_input,)


def _is_float_tensor_node(node: fx.Node) -> bool:
    meta = node.meta.get("tensor_meta")
    return meta is not None and hasattr(meta, "dtype") and meta.dtype.is_floating_point


def _scope(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    qualname = list(stack.values())[-1][0]
    return qualname if isinstance(qualname, str) else ""


def _free_name(gm: fx.GraphModule, scope: str, kind: str, taken: set[str]) -> str:
    owner = gm.get_submodule(scope) if scope else gm
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
    return None if made is None else (kind, made)


def _changes_values(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target not in _PASSTHROUGH_FUNCTIONS
    if node.op == "call_method":
        return node.target not in _PASSTHROUGH_METHODS
    return False


def _attr(root: nn.Module, target: str) -> Any:
    obj: Any = root
    for part in target.split("."):
        obj = getattr(obj, part, None)
    return obj


def _trace(model: nn.Module, args: tuple | None = None) -> fx.GraphModule:
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


def prepare_model(model: nn.Module, dummy_input: Any, *, trace: bool = True) -> PreparedModel:
    """Trace ``model`` and turn functional ops on float tensors into modules (see the module docstring).

    ``model`` is not modified (the returned graph module shares its parameters).
    If tracing fails (data-dependent control flow, unsupported Python), the
    result holds ``model`` itself with ``traced=False`` and a UserWarning says
    why: its leaf modules can still be quantized, its functional ops cannot.
    ``trace=False`` skips tracing on purpose.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    args = _as_tuple(dummy_input)
    if not trace:
        return PreparedModel(model, traced=False, trace_error="tracing disabled (trace=False)")
    try:
        gm = _trace(model, args)  # in the model's own mode: code reading self.training is traced as it runs
        with eval_mode(gm), torch.no_grad():  # gm shares model's leaves: each gets its own flag back
            ShapeProp(gm).propagate(*args)
            if _expand_sdpa(gm):  # the new nodes need their tensor metadata too
                ShapeProp(gm).propagate(*args)
    except Exception as e:  # noqa: BLE001  (any tracing failure falls back to module replacement)
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        warnings.warn(
            f"torch.fx could not trace {type(model).__name__} ({msg}); its leaf modules are quantized, "
            "but functional ops inside forward() (torch.matmul, x + y, ...) stay in float",
            UserWarning,
            stacklevel=3,
        )
        return PreparedModel(model, traced=False, trace_error=msg)
    gm.training = model.training

    prepared = PreparedModel(gm, traced=True)
    for node in gm.graph.nodes:  # a parameter read directly in forward() has no quantizer: say so
        if node.op == "get_attr" and isinstance(_attr(gm, node.target), nn.Parameter):
            prepared.direct_params.append(node.target)
    taken: set[str] = set()
    for node in list(gm.graph.nodes):
        if node.op not in ("call_function", "call_method") or not _is_float_tensor_node(node):
            continue
        converted = _convert(node)
        if converted is None:
            if _changes_values(node):
                prepared.float_ops.append(node.name)
            continue
        kind, (module, new_args) = converted
        name = _free_name(gm, _scope(node), kind, taken)
        gm.add_submodule(name, module)
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(name, new_args)
        new.meta = copy.copy(node.meta)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        prepared.inserted.append((name, module))
    gm.graph.lint()
    gm.recompile()
    return prepared
