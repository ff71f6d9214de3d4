"""Graph capture: a model as an ``fx.GraphModule`` whose quantizable work is visible.

:func:`prepare_model` tries, in order:

1. :func:`torch.export.export` (non-strict, batch and sequence dimensions of the
   inputs dynamic where the model allows it): captures today's architectures,
   Hugging Face transformers included. The graph keeps the model's call
   signature (the keyword arguments given in the example) and returns what the
   model returns (tuples, dicts, ``ModelOutput``), at any batch size and
   sequence length the model accepts. Calls of modules that quanta quantizes
   (``nn.Linear``, ``nn.LayerNorm``, ...) are put back as calls of the model's
   own module objects (:func:`lift_module_calls`), so parameters, names and
   train/eval behaviour (dropout, BatchNorm) are the original ones;
   hand-written RMSNorm modules become ``nn.RMSNorm`` calls when they compute
   exactly that (checked on the example).
2. :func:`torch.fx.symbolic_trace` (with dtype/device/rank answered from a run
   on the example where plain tracing cannot, see :mod:`quanta.quantsim.preparer`).
3. Nothing: the model itself, whose leaf modules can still be quantized.

Why each earlier method failed is kept in :attr:`PreparedModel.errors` (the
sim announces a fallback once, with that reason). The ops of the captured graph
are then rewritten by :func:`quanta.quantsim.preparer.convert_functional_ops`.

>>> import torch
>>> class Attn(torch.nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.q = torch.nn.Linear(8, 8)
...     def forward(self, x, *, scale=1.0):
...         return torch.softmax(self.q(x) @ x.transpose(-1, -2) * scale, dim=-1) @ x
>>> prepared = prepare_model(Attn(), (torch.randn(2, 4, 8),), {"scale": 0.5})
>>> prepared.method, [n.target for n in prepared.graph.nodes if n.op == "call_module"]
(<CaptureMethod.EXPORT: 'export'>, ['q', 'matmul', 'mul', 'softmax', 'matmul_1'])
>>> prepared.model(torch.randn(3, 5, 8), scale=0.5).shape   # other batch and sequence lengths
torch.Size([3, 5, 8])
"""

from __future__ import annotations

import copy
import inspect
import operator
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn

from quanta.nn.base import eval_mode
from quanta.nn.functional import ChannelsFirstLayerNorm, OffsetRMSNorm, Pointwise, QuickGELU, TransposedLinear
from quanta.nn.registry import quantized_class_for
from quanta.quantsim.rebuild import rebuild
from quanta.quantsim.preparer import (
    _ATEN_FUNCTIONS,
    _PASSTHROUGH_MODULES,
    CaptureMethod,
    PreparedModel,
    aten_to_torch,
    convert_functional_ops,
    fx_trace,
    is_aten_passthrough,
)

__all__ = ["CaptureMethod", "PreparedModel", "flat_inputs", "is_exported", "lift_exported", "lift_module_calls",
           "prepare_model"]

_aten = torch.ops.aten


def _dynamic_dims(rank: int) -> range:
    """The dimensions of an input of this rank that are exported as dynamic: the batch (dim 0) and, for
    token ids, masks, waveforms ``(batch, length)`` and sequences ``(batch, length, features)``, the length.
    Image sizes stay static: their symbolic form (window partitions, padding) makes capture slow."""
    return range(min(rank, 2 if rank in (2, 3) else 1))


def _dynamic_shapes(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any] | None:
    """``Dim.AUTO`` (dynamic unless the model pins it) for the batch and sequence dimensions of every tensor
    input (:func:`_dynamic_dims`), keyed by the forward's parameter names."""
    try:
        bound = inspect.signature(model.forward).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None  # let torch.export report the signature mismatch

    def dims(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return {i: torch.export.Dim.AUTO for i in _dynamic_dims(value.dim())} if value.dim() else None
        if isinstance(value, (list, tuple)):
            return type(value)(dims(v) for v in value)
        if isinstance(value, dict):
            return {k: dims(v) for k, v in value.items()}
        return None

    return {name: dims(value) for name, value in bound.arguments.items()}


def _register_transformers_pytrees(model: nn.Module) -> None:
    """Let torch.export flatten a transformers model's cache objects (``DynamicCache`` in its outputs), with
    transformers' own registration when the installed version has one."""
    if not type(model).__module__.startswith("transformers."):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:
        return
    register_cache_pytrees_for_model(model)


def _export(model: nn.Module, args: tuple, kwargs: dict) -> fx.GraphModule:
    """``torch.export`` (non-strict, dynamic shapes) in eval mode, as a plain trainable GraphModule whose
    submodules and parameters are ``model``'s own objects."""
    _register_transformers_pytrees(model)
    with eval_mode(model), torch.no_grad():
        try:
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=_dynamic_shapes(model, args, kwargs),
                                     strict=False)
        except Exception as first:  # noqa: BLE001  (dynamic shapes can be refused where static ones work)
            try:
                ep = torch.export.export(model, args, kwargs, strict=False)
            except Exception:  # noqa: BLE001
                raise first from None
    return _trainable(ep.module(), type(model).__name__, copy_graph=False)


def is_exported(model: nn.Module) -> bool:
    """Whether ``model`` is a torch.export graph already (``ExportedProgram.module()``, e.g. of a loaded
    ``.pt2`` file): capture then takes its graph as it is."""
    return isinstance(model, fx.GraphModule) and isinstance(model.graph._codegen, fx.graph._PyTreeCodeGen)


def _trainable(unlifted: fx.GraphModule, name: str, *, copy_graph: bool = True) -> fx.GraphModule:
    """A plain GraphModule with ``unlifted``'s graph (a copy unless ``copy_graph=False``), submodules and pytree
    input/output handling: ``ExportedProgram.module()`` refuses train()/eval() and checks input shapes in a
    hook of its own."""
    graph = unlifted.graph
    if copy_graph:
        graph = fx.Graph(owning_module=None, tracer_cls=unlifted.graph._tracer_cls)
        graph._codegen = unlifted.graph._codegen  # input/output specs: read, never changed
        graph.output(graph.graph_copy(unlifted.graph, {}))
    for node in list(graph.nodes):  # input guards: checked by the model's own code at run time
        if node.op == "call_module" and str(node.target).startswith("_guards_fn"):
            graph.erase_node(node)
    gm = fx.GraphModule(unlifted, graph, name)
    gm._in_spec = unlifted._in_spec  # read by the pytree code that flattens inputs / rebuilds outputs
    gm._out_spec = unlifted._out_spec
    for child in list(getattr(gm, "_modules", {})):
        if child.startswith("_guards_fn"):
            delattr(gm, child)
    return gm


def flat_inputs(gm: fx.GraphModule, args: tuple, kwargs: Mapping[str, Any]) -> list[Any]:
    """The values of ``gm``'s placeholders for a call ``gm(*args, **kwargs)`` (pytree-flattened for an
    exported graph, positional for a traced one)."""
    codegen = gm.graph._codegen
    if isinstance(codegen, fx.graph._PyTreeCodeGen):
        names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
        sig = inspect.Signature([inspect.Parameter(str(n).lstrip("*"), inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                 for n in names])
        bound = sig.bind(*args, **kwargs)
        return list(codegen.process_inputs(*bound.arguments.values()))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = list(args)
    for ph in placeholders[len(values):]:
        if ph.target in kwargs:
            values.append(kwargs[ph.target])
        elif ph.args:
            values.append(ph.args[0])
        else:
            raise TypeError(f"missing input {ph.target!r}")
    return values


# ---------------------------------------------------------------------- lifting module calls
def _stack_key(node: fx.Node) -> tuple[str, str] | None:
    """``(key, module path)`` of the innermost module whose forward made this node."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    # a parametrization (weight norm's) computes a tensor of the module that owns it: the owner made the op
    entries = [(k, p) for k, (p, _) in stack.items() if not (isinstance(p, str) and ".parametrizations." in p)]
    if not entries:
        return None
    key, path = entries[-1]
    if not isinstance(path, str) or not path or key.startswith("_empty_nn_module_stack"):
        return None
    return key, path


def _is_tensor(node: Any) -> bool:
    if not isinstance(node, fx.Node):
        return False
    if node.op == "get_attr":
        return isinstance(_attr(node.graph.owning_module, str(node.target)), torch.Tensor)
    return isinstance(node.meta.get("val"), torch.Tensor)


def _attr(root: Any, target: str) -> Any:
    for part in target.split("."):
        root = getattr(root, part, None)
    return root


def _submodule(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


def _equivalents(module: nn.Module) -> list[nn.Module]:
    """Modules quanta quantizes that may compute what ``module`` (a leaf of a type quanta does not know)
    computes, sharing its parameters; the caller checks which, if any, gives the same values:

    * a hand-written RMSNorm (one 1-D ``weight``, an ``eps``/``variance_epsilon`` attribute): ``nn.RMSNorm``,
      or :class:`quanta.nn.OffsetRMSNorm` for Gemma's (scaled by ``1 + weight``);
    * GPT-2's ``Conv1D`` (``weight`` ``(in, out)``, ``bias`` ``(out,)``): :class:`quanta.nn.TransposedLinear`;
    * a LayerNorm subclass with a forward of its own (ConvNeXt's): ``nn.LayerNorm`` or
      :class:`quanta.nn.ChannelsFirstLayerNorm`;
    * a parameter-free activation written out in ops (``NewGELUActivation``): GELU (tanh or exact),
      :class:`quanta.nn.QuickGELU` (CLIP's), SiLU, ...
    """
    base = next((cls for cls in type(module).__mro__[1:] if quantized_class_for(cls) is not None), None)
    if base is not None:  # a subclass with a forward of its own (Falcon's FalconLinear): the base class's
        plain = base.__new__(base)  # forward on the same parameters and settings, if it computes the same
        plain.__dict__.update({k: (v.copy() if isinstance(v, (dict, set)) else v) for k, v in module.__dict__.items()})
        return [plain, *_equivalents_by_state(module)]
    return _equivalents_by_state(module)


def _equivalents_by_state(module: nn.Module) -> list[nn.Module]:
    if next(module.children(), None) is not None or list(module.buffers(recurse=False)):
        return []
    params = dict(module.named_parameters(recurse=False))
    if not params:
        return [nn.GELU(approximate="tanh"), nn.GELU(), QuickGELU(), nn.SiLU(), nn.Sigmoid(), nn.Tanh(), nn.ReLU(),
                nn.Hardswish(), nn.Mish()]
    weight = params.get("weight")
    if set(params) == {"weight"} and weight.dim() == 1:
        eps = next((getattr(module, a) for a in ("eps", "variance_epsilon", "epsilon")
                    if isinstance(getattr(module, a, None), float)), None)
        if eps is None:
            return []
        options = [nn.RMSNorm(weight.shape[0], eps=eps, device="meta"),
                   OffsetRMSNorm(weight.shape[0], eps=eps, device="meta")]  # Gemma's: scaled by 1 + weight
        for norm in options:
            norm.weight = weight
        return options
    bias = params.get("bias")
    if set(params) == {"weight", "bias"} and weight.dim() == 2 and tuple(bias.shape) == (weight.shape[1],):
        return [TransposedLinear(weight, bias)]
    eps = getattr(module, "eps", None)
    if set(params) == {"weight", "bias"} and weight.dim() == 1 and bias.shape == weight.shape and isinstance(
            eps, float):  # a LayerNorm subclass with its own forward (ConvNeXt's, channels last or first)
        options = [nn.LayerNorm(weight.shape[0], eps=eps, device="meta"),
                   ChannelsFirstLayerNorm(weight.shape[0], eps=eps, device="meta")]
        for norm in options:
            norm.weight, norm.bias = weight, bias
        return options
    return []


def lift_module_calls(gm: fx.GraphModule, model: nn.Module, example: list[Any]) -> dict[str, str]:
    """Replace the aten ops each call of a module produced by one ``call_module`` of ``model``'s module
    object (installed in ``gm`` at its own path), for:

    * modules quanta quantizes (``nn.Linear``, ``nn.LayerNorm``, ...) and ones that only move values
      (dropout: its train/eval behaviour comes back);
    * other leaf modules: as a module quanta quantizes when one computes the same (:func:`_equivalents`:
      hand-written RMSNorms, GPT-2's ``Conv1D``, activations written out in ops), else kept whole and in
      float (listed by the sim); if all such a module computes is one op the functional-op rewrite
      quantizes (transformers' ``GELUActivation``), that op is left to it.

    A call is lifted when its ops take one tensor from outside (the module's input) and give one tensor to
    the outside (its output); ``nn.MultiheadAttention`` is lifted as self-attention ``mha(x, x, x)`` (with
    its default ``need_weights=True``: the ONNX exporter has no opset-13 form of the fused path).
    Every lift but that of a quantizable single-input module is checked on ``example`` (the flat inputs):
    the module must give the values the ops gave. Returns ``{path: module type}`` of what was lifted."""
    regions: OrderedDict[str, tuple[str, list[fx.Node]]] = OrderedDict()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            found = _stack_key(node)
            if found is not None:
                regions.setdefault(found[0], (found[1], []))[1].append(node)
    candidates: list[tuple[str, Any, list[fx.Node], fx.Node, list[fx.Node], bool]] = []  # replacement: module(s)
    for path, nodes in regions.values():
        module = _submodule(model, path)
        if module is None:
            continue
        replacement, check = module, isinstance(module, nn.MultiheadAttention)
        if quantized_class_for(module) is None and not isinstance(module, _PASSTHROUGH_MODULES):
            if next(module.children(), None) is not None:
                continue  # a container: its children are lifted one by one
            check = True
            if _single_quantizable_op(nodes):
                continue  # the functional-op rewrite quantizes it under this module's name
            if all(is_aten_passthrough(n.target) or n.target is operator.getitem for n in nodes):
                continue  # it only moves values (wav2vec2's same-padding slice): nothing to quantize
            if type(module) is nn.Module:  # a container torch.export made: rebuild the module its op stands for
                ops = [n for n in nodes if not is_aten_passthrough(n.target) and n.target is not operator.getitem]
                rebuilt = rebuild(ops[0], module) if len(ops) == 1 else None
                if rebuilt is None:
                    continue
                replacement = rebuilt
            else:
                wrap = [Pointwise(module)] if _pointwise_function(module, nodes) else []
                replacement = [*_equivalents(module), *wrap, module]  # type: ignore[assignment]  # itself, last
        inside = set(nodes)
        own = {id(t) for t in (*module.parameters(), *module.buffers())}  # its own state, tied weights included
        inputs = list(OrderedDict.fromkeys(
            a for n in nodes for a in n.all_input_nodes if a not in inside and _is_tensor(a)
            and not (a.op == "get_attr" and id(_attr(gm, str(a.target))) in own)))
        outputs = [n for n in nodes if any(u not in inside for u in n.users)]
        mha = isinstance(replacement, nn.MultiheadAttention)
        if len(inputs) != 1 or not 1 <= len(outputs) <= (2 if mha else 1) or not all(map(_is_tensor, outputs)):
            continue
        candidates.append((path, replacement, nodes, inputs[0], outputs, check))
    if not candidates:
        return {}
    values = _values(gm, example, {n for c in candidates if c[5] for n in (c[3], *c[4])})
    lifted: dict[str, str] = {}
    installed: dict[str, nn.Module] = {}
    moved: dict[fx.Node, fx.Node] = {}  # an output already replaced by a module call -> that call
    for path, replacement, nodes, data, outputs, check in candidates:
        mha = isinstance(replacement, nn.MultiheadAttention)
        # the index of each region output in the module's result (MultiheadAttention: (output, weights))
        picks: list[int | None] = [0, 1] if mha else [None]
        if check:
            x = values.get(data)
            if not isinstance(x, torch.Tensor):
                continue
            options = replacement if isinstance(replacement, list) else [replacement]
            if path in installed:  # another call of a module lifted already (ALBERT's shared layers): the same
                options = [installed[path]]
            for option in options:
                try:
                    with torch.no_grad(), eval_mode(option):
                        got = option(x, x, x) if mha else (option(x),)
                except (RuntimeError, TypeError, ValueError, IndexError):
                    continue  # e.g. the other LayerNorm layout
                picks = [_matching(got, values.get(o)) for o in outputs]
                if all(i is not None for i in picks) and (
                        mha or _same_on_wide_range(_submodule(model, path), option, x)):
                    replacement = option
                    break
            else:
                continue
            if not mha:
                picks = [None]
        if installed.get(path, replacement) is not replacement:
            continue  # pragma: no cover - one path, two different lifts
        if path not in installed:
            _install(gm, path, replacement)
            installed[path] = replacement
        while data in moved:
            data = moved[data]
        last = outputs[-1]
        with gm.graph.inserting_before(last):
            call = gm.graph.call_module(path, (data, data, data) if mha else (data,))
            call.meta = {k: v for k, v in last.meta.items() if k != "val"} if mha else dict(last.meta)
            for out, pick in zip(outputs, picks):
                new = call if pick is None else gm.graph.call_function(operator.getitem, (call, pick))
                new.meta = dict(out.meta)
                moved[out] = new
                out.replace_all_uses_with(new)
        for n in reversed(nodes):
            if not n.users:
                gm.graph.erase_node(n)
        lifted[path] = type(replacement).__name__
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return lifted


def _pointwise_function(module: nn.Module, nodes: list[fx.Node]) -> bool:
    """Whether ``module`` is a parameter-free leaf whose ops (those that change values) are all pointwise: an
    activation function written as a module of its own, quantized as one op (:class:`quanta.nn.Pointwise`)."""
    if next(module.children(), None) is not None or next(module.parameters(), None) is not None or next(
            module.buffers(), None) is not None:
        return False
    changing = [n for n in nodes if not is_aten_passthrough(n.target) and n.target is not operator.getitem]
    return bool(changing) and all(torch.Tag.pointwise in getattr(n.target, "tags", ()) for n in changing)


def _same_on_wide_range(module: nn.Module, option: nn.Module, x: torch.Tensor) -> bool:
    """For a parameter-free module, whether ``option`` also computes what it computes on values far outside the
    example's (``ClippedGELUActivation`` equals GELU on small inputs only); other modules pass."""
    if option is module or isinstance(option, Pointwise) or next(module.parameters(), None) is not None or (
            not x.is_floating_point()):
        return True
    probe = torch.linspace(-60.0, 60.0, x.numel(), dtype=x.dtype).reshape(x.shape)
    try:
        with torch.no_grad(), eval_mode(module), eval_mode(option):
            return _matching((option(probe),), module(probe)) is not None
    except (RuntimeError, TypeError, ValueError, IndexError):
        return False


def _matching(results: Any, want: Any) -> int | None:
    """The index of the tensor in ``results`` equal to ``want`` (within float reordering), or None."""
    if not isinstance(want, torch.Tensor):
        return None
    for i, got in enumerate(results):
        if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                got, want, rtol=1e-5, atol=1e-6, equal_nan=True):
            return i
    return None


def _single_quantizable_op(nodes: list[fx.Node]) -> bool:
    """Whether the only value-changing op among ``nodes`` is one the functional-op rewrite quantizes."""
    changing = [n for n in nodes if not is_aten_passthrough(n.target)]
    return len(changing) == 1 and changing[0].target in _ATEN_FUNCTIONS


def _drop_no_ops(gm: fx.GraphModule) -> None:
    """Remove run-time metadata assertions, casts to the dtype and device a tensor already has (torch.export
    records ``x.to(torch.float32)`` of a float32 tensor, and its users then look like users of a new value) and
    the copy-and-detach of constants made inside ``forward`` (which the ONNX exporter cannot translate)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        packet = getattr(node.target, "overloadpacket", None)
        if packet is _aten._assert_tensor_metadata and not node.users:
            gm.graph.erase_node(node)
        elif packet in (_aten.detach, _aten.detach_) and isinstance(node.args[0], fx.Node) and (
                node.args[0].op == "get_attr" or getattr(node.args[0].target, "overloadpacket", None)
                is _aten.lift_fresh_copy):  # detaching a constant (torch.tensor(...) inside forward)
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
        elif packet in (_aten.to, _aten._to_copy, _aten.alias) and node.args and _is_tensor(node.args[0]):
            before, after = node.args[0].meta["val"], node.meta.get("val")
            if isinstance(after, torch.Tensor) and (before.dtype, before.device) == (after.dtype, after.device):
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
    for node in list(gm.graph.nodes):  # after the detaches above are gone
        if getattr(node.target, "overloadpacket", None) is _aten.lift_fresh_copy and not any(
                u.target._schema.is_mutable for u in node.users if hasattr(u.target, "_schema")):
            node.replace_all_uses_with(node.args[0])  # a fresh copy of a constant nobody changes: the constant
            gm.graph.erase_node(node)
    gm.graph.lint()
    gm.recompile()


def _install(gm: fx.GraphModule, path: str, module: nn.Module) -> None:
    parent_path, _, leaf = path.rpartition(".")
    parent: nn.Module = gm
    for part in parent_path.split(".") if parent_path else []:
        if not hasattr(parent, part):
            parent.add_module(part, nn.Module())
        parent = getattr(parent, part)
    if leaf in parent._modules:
        del parent._modules[leaf]
    parent.add_module(leaf, module)


def _values(gm: fx.GraphModule, flat: list[Any], wanted: set[fx.Node]) -> dict[fx.Node, Any]:
    """The values of the ``wanted`` nodes in a run of ``gm`` on its flat inputs (others dropped as they go)."""
    if not wanted:
        return {}
    kept: dict[fx.Node, Any] = {}

    class _Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            result = super().run_node(n)
            if n in wanted:
                # a copy: a later in-place op (Falcon's `mlp_output += attention_output`) changes the tensor
                kept[n] = result.detach().clone() if isinstance(result, torch.Tensor) else result
            return result

    with eval_mode(gm), torch.no_grad():
        _Recorder(gm, garbage_collect_values=True).run(*flat)
    return kept


def lift_exported(model: fx.GraphModule, args: tuple = (), kwargs: Mapping[str, Any] | None = None
                  ) -> fx.GraphModule:
    """A torch.export graph module (``torch.export.load(path).module()``) with its module calls put back as
    modules (:func:`lift_module_calls`; rebuilt from the aten calls where the original modules are gone),
    checked on ``model(*args, **kwargs)``. ``model`` is not modified; the result shares its tensors.

    >>> import torch
    >>> from torch import nn
    >>> ep = torch.export.export(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), (torch.randn(1, 1, 5, 5),))
    >>> gm = lift_exported(ep.module(), (torch.randn(1, 1, 5, 5),))
    >>> [(n.target, type(gm.get_submodule(n.target)).__name__) for n in gm.graph.nodes if n.op == "call_module"]
    [('0', 'Conv2d')]
    """
    if not is_exported(model):
        raise TypeError(f"model must be a torch.export graph module (ExportedProgram.module()), got "
                        f"{type(model).__name__}")
    gm = _trainable(model, type(model).__name__)
    _drop_no_ops(gm)
    lift_module_calls(gm, gm, flat_inputs(gm, tuple(args), dict(kwargs or {})))
    return gm


# ---------------------------------------------------------------------- entry point
def _capture(model: nn.Module, method: CaptureMethod, args: tuple, kwargs: dict[str, Any]) -> PreparedModel:
    if method is CaptureMethod.EXPORT:
        exported = is_exported(model)
        gm = _trainable(model, type(model).__name__) if exported else _export(model, args, kwargs)  # type: ignore[arg-type]
        _drop_no_ops(gm)
        lift_module_calls(gm, gm if exported else model, flat_inputs(gm, args, kwargs))
        aten_to_torch(gm)
    elif method is CaptureMethod.FX:
        if kwargs:
            raise TypeError("torch.fx tracing takes positional inputs only")
        gm = fx_trace(model, args)
    else:  # pragma: no cover
        raise ValueError(f"not a capture method: {method}")
    gm.training = model.training
    return convert_functional_ops(gm, flat_inputs(gm, args, kwargs), method)


def prepare_model(model: nn.Module, args: Any = (), kwargs: Mapping[str, Any] | None = None, *,
                  trace: bool = True,
                  methods: tuple[CaptureMethod | str, ...] = (CaptureMethod.EXPORT, CaptureMethod.FX)
                  ) -> PreparedModel:
    """Capture ``model`` (called as ``model(*args, **kwargs)``) and turn functional ops on activations into
    modules (:func:`~quanta.quantsim.preparer.convert_functional_ops`).

    ``args`` is a tuple of positional inputs (a single tensor is taken as one). ``model`` is not modified
    (the graph module shares its submodules and parameters). If no capture works, or ``trace=False``, the
    result holds ``model`` itself (method ``LEAVES``): its leaf modules can still be quantized, its functional
    ops cannot; :attr:`PreparedModel.errors` says why each method failed. ``methods`` are the capture
    methods to try, in order (``"export"``, ``"fx"``).

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
    >>> prepared.method
    <CaptureMethod.EXPORT: 'export'>
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    args = args if isinstance(args, tuple) else (args,)
    kwargs = dict(kwargs or {})
    if not trace:
        return PreparedModel(model, CaptureMethod.LEAVES,
                             errors={CaptureMethod.EXPORT: "capture disabled (trace=False)"})
    try:
        order = [CaptureMethod(m) for m in methods]
    except ValueError:
        raise ValueError(f"methods must hold 'export' and/or 'fx', got {methods!r}") from None
    if CaptureMethod.LEAVES in order:
        raise ValueError("methods: 'leaves' is the fallback, not a capture method")
    errors: dict[CaptureMethod, str] = {}
    for method in order:
        try:
            prepared = _capture(model, method, args, kwargs)
        except Exception as e:  # noqa: BLE001  (any capture failure falls back to the next method)
            errors[method] = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
            continue
        prepared.errors = errors
        return prepared
    return PreparedModel(model, CaptureMethod.LEAVES, errors=errors)
