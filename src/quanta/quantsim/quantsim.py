"""QuantizationSimModel: a whole model with simulated quantization (AIMET's QuantSim).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
>>> x = torch.randn(32, 8)
>>> sim = QuantizationSimModel(model, x, quant_scheme="min_max", default_param_bw=8, default_output_bw=8)
>>> sim.compute_encodings(lambda m: m(x), progress=False)
>>> y = sim.model(x)                       # fake-quantized forward, same inputs as the model
>>> sorted(name for name, _ in sim.named_quantizers())[:3]
['0.param_quantizers.weight', '1.output_quantizers.0', '2.output_quantizers.0']
>>> sim.model.get_submodule("0").output_quantizers[0] is None   # Linear -> ReLU supergroup: one output quantizer
True
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import fx, nn

from quanta._text import shortlist as _shortlist
from quanta._files import atomic_write, read_json
from quanta.encodings.affine import AffineEncoding
from quanta.encodings.float import FloatEncoding
from quanta.kernels.qparams import offset_from_range
from quanta.nn import QuantizationMixin
from quanta.nn.base import _set_slots, eval_mode, quantizers_off
from quanta.nn.modules import QuantizedConcat, QuantizedEmbedding
from quanta.nn.registry import quantized_class_for
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantsim.config import DataType, QuantizerSpec, QuantSimConfig, op_types_of
from quanta.quantsim.capture import CaptureMethod, PreparedModel, flat_inputs, prepare_model
from quanta.quantsim.preparer import _PASSTHROUGH_MODULES, _changes_values
from quanta.quantsim.progress import progress_bar
from quanta.quantsim.scheme import QuantScheme

__all__ = ["QuantizationSimModel"]

_NO_ARGS = object()
ENCODINGS_FORMAT = "quanta.quantsim.encodings"
ENCODINGS_VERSION = 1


def _parse_data_type(value: Any) -> DataType:
    if value is int or value == "int":
        return DataType.INT
    if value is float or value == "float":
        return DataType.FLOAT
    if isinstance(value, DataType):
        return value
    name = getattr(value, "name", None)  # AIMET's QuantizationDataType.int / .float
    if name in ("int", "float"):
        return DataType(name)
    raise ValueError(f"default_data_type must be int, float, 'int', 'float' or a quanta.quantsim.DataType, got {value!r}")


def _check_bw(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 32:
        raise ValueError(f"{name} must be an integer in [1, 32], got {value!r}")
    return value


def _split_inputs(dummy_input: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a dummy input: a tensor, a tuple of positional inputs, or a dict of keyword inputs."""
    if isinstance(dummy_input, Mapping):
        if not dummy_input or not all(isinstance(k, str) for k in dummy_input):
            raise TypeError("dummy_input as a dict must map the forward's argument names (str) to inputs, got "
                            f"{list(dummy_input)[:4]!r}")
        if not any(isinstance(v, torch.Tensor) for v in dummy_input.values()):
            raise TypeError("dummy_input: the dict holds no tensor")
        return (), dict(dummy_input)
    args = dummy_input if isinstance(dummy_input, tuple) else (dummy_input,)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError(
            "dummy_input must be a tensor, a tuple of tensors (the positional inputs of model.forward) or a dict "
            f"of keyword inputs, got {type(dummy_input).__name__}"
        )
    return args, {}


def _call(model: nn.Module, batch: Any) -> Any:
    """``model(**batch)`` for a dict, ``model(*batch)`` for a tuple, else ``model(batch)``."""
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(*batch) if isinstance(batch, tuple) else model(batch)


class QuantizationSimModel:
    """Simulate quantization of ``model``: calibrate, evaluate, train (QAT) and save its encodings.

    Args:
        model: the float model. Not modified unless ``in_place=True``.
        dummy_input: a tensor or tuple of tensors ``model`` accepts; used to
            trace it and to tell float tensors from others.
        quant_scheme: a :class:`QuantScheme` or its name (``"min_max"``,
            ``"percentile"``, ``"sqnr"``, ``"range_learning_min_max"``,
            ``"range_learning_sqnr"``, or AIMET's ``"post_training_tf"``, ...). It calibrates
            activations; weights use ``param_quant_scheme`` (default: min_max,
            or range_learning_min_max when ``quant_scheme`` learns ranges, as in
            AIMET — a weight's range is known exactly, clipping it rarely helps).
        rounding_mode: AIMET's deprecated argument; only None or ``"nearest"``.
        default_output_bw / default_param_bw: bitwidths of activation / parameter
            quantizers where the config does not set one.
        in_place: if True, no copy of the model is made: ``sim.model`` shares its
            parameters with ``model`` (QAT and ``fold_param_quantizers`` change
            them); if ``model`` could not be traced its leaf modules are replaced
            in place.
        config_file: a quantsim config (path to JSON/YAML, a dict, or a
            :class:`~quanta.quantsim.QuantSimConfig`); None gives the default:
            weights signed symmetric per output channel, activations asymmetric
            per tensor except the outputs of elementwise adds (the residual
            stream stays in float; :data:`~quanta.quantsim.INTEGER_ONLY` quantizes
            them too), bias and BatchNorm parameters off, supergroups
            Conv/Linear/Add + ReLU and Conv + BatchNorm (see docs/quantsim_config.md).
        default_data_type: ``int`` (integer grids) or ``float`` (16 bits: float16;
            8 bits: float8 e4m3fn).
        param_quant_scheme: scheme for parameter quantizers (keyword only; see ``quant_scheme``).
        trace: set False to skip torch.fx tracing (functional ops then stay in float).

    After construction, :attr:`model` is the quantized model. Leaf modules with
    no quantized counterpart (``quanta.nn.register`` adds one) are kept in float
    and listed in :attr:`unquantized_modules`, functional ops without one in
    :attr:`float_ops`; a UserWarning names them.
    """

    def __init__(
        self,
        model: nn.Module,
        dummy_input: torch.Tensor | tuple[torch.Tensor, ...],
        quant_scheme: QuantScheme | str = QuantScheme.MIN_MAX,
        rounding_mode: str | None = None,
        default_output_bw: int = 8,
        default_param_bw: int = 8,
        in_place: bool = False,
        config_file: str | os.PathLike | Mapping | QuantSimConfig | None = None,
        default_data_type: Any = int,
        *,
        param_quant_scheme: QuantScheme | str | None = None,
        trace: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if any(isinstance(m, (QuantizerBase, QuantizationMixin)) for m in model.modules()):
            raise ValueError("model already holds quantizers; pass the float model")
        self._dummy_args, self._dummy_kwargs = _split_inputs(dummy_input)
        self.quant_scheme = QuantScheme.parse(quant_scheme)
        if param_quant_scheme is None:  # as AIMET: range learning trains the weight ranges too (min/max init)
            param_quant_scheme = (QuantScheme.RANGE_LEARNING_MIN_MAX if self.quant_scheme.learns_ranges
                                  else QuantScheme.MIN_MAX)
        self.param_quant_scheme = QuantScheme.parse(param_quant_scheme)
        if rounding_mode not in (None, "nearest"):
            raise ValueError(f"rounding_mode must be None or 'nearest' (the only mode), got {rounding_mode!r}")
        self.default_output_bw = _check_bw("default_output_bw", default_output_bw)
        self.default_param_bw = _check_bw("default_param_bw", default_param_bw)
        self.default_data_type = _parse_data_type(default_data_type)
        if not isinstance(in_place, bool):
            raise TypeError(f"in_place must be a bool, got {in_place!r}")
        self.config = QuantSimConfig.load(config_file)
        self._percentile = 99.99

        base = model if in_place else _deepcopy(model)
        self._prepared: PreparedModel = prepare_model(base, self._dummy_args, self._dummy_kwargs, trace=trace)
        self.model: nn.Module = self._prepared.model
        #: how the model was captured: "export" (torch.export), "fx" (torch.fx) or "leaves" (not captured)
        self.capture_method: str = self._prepared.method.value
        #: why each capture method tried before :attr:`capture_method` failed
        self.capture_errors: dict[str, str] = {m.value: e for m, e in self._prepared.errors.items()}
        if trace and self._prepared.errors:
            self._warn_fallback()
        #: names of leaf modules kept in float (no quantized counterpart registered)
        self.unquantized_modules: list[str] = []
        #: graph nodes of functional ops that change values and stay in float
        self.float_ops: list[str] = list(self._prepared.float_ops)
        self._replace_modules(self.model, "")
        for target in self._prepared.direct_params:  # a module whose forward uses its parameters directly
            owner = target.rpartition(".")[0] or target
            if owner not in self.unquantized_modules:
                self.unquantized_modules.append(owner)
        self._configure()
        self._warn_unquantized()

    # ------------------------------------------------------------------ construction
    def _replace_modules(self, parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            full = f"{prefix}{name}"
            if isinstance(child, QuantizationMixin):
                continue
            if quantized_class_for(child) is not None:
                setattr(parent, name, quantized_class_for(child).from_module(child))  # type: ignore[union-attr]
            elif isinstance(child, _PASSTHROUGH_MODULES):
                continue
            elif type(child) is nn.Module and self._prepared.method is CaptureMethod.EXPORT:
                self._replace_modules(child, full + ".")  # a container torch.export made (parameters read by
                # graph ops are listed through direct_params)
            elif next(child.children(), None) is None:
                self.unquantized_modules.append(full)
            else:
                self._replace_modules(child, full + ".")

    def _warn_fallback(self) -> None:
        reasons = "; ".join(f"{m} failed ({e})" for m, e in self.capture_errors.items())
        if self._prepared.traced:
            msg = f"{type(self.model).__name__} captured with {self.capture_method} because {reasons}"
        else:
            msg = (f"{reasons}: only the leaf modules of the model are quantized; functional ops inside forward() "
                   "(torch.matmul, x + y, ...) stay in float")
        warnings.warn(f"QuantizationSimModel: {msg}", UserWarning, stacklevel=3)

    def _warn_unquantized(self) -> None:
        parts = []
        if self.unquantized_modules:
            parts.append(f"modules without a quantized counterpart: {_shortlist(self.unquantized_modules)}")
        if self.float_ops:
            parts.append(f"functional ops without one: {_shortlist(self.float_ops)}")
        if parts:
            warnings.warn(
                "QuantizationSimModel keeps these in float (" + "; ".join(parts) + "); "
                "register a quantized class with quanta.nn.register to quantize a module type",
                UserWarning,
                stacklevel=3,
            )

    def quantized_modules(self) -> Iterator[tuple[str, QuantizationMixin]]:
        """``(name, module)`` for every quantized module of :attr:`model` (not those inside another one, such as
        ``QuantizedMultiheadAttention.out_proj``, which their parent configures)."""
        def walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, QuantizationMixin]]:
            for name, child in module.named_children():
                if isinstance(child, QuantizationMixin):
                    yield prefix + name, child
                else:
                    yield from walk(child, f"{prefix}{name}.")
        yield from walk(self.model, "")

    def _concat_arity(self) -> dict[str, int]:
        graph = self._prepared.graph
        if graph is None:
            return {}
        modules = dict(self.model.named_modules())
        return {n.target: len(n.args) for n in graph.nodes  # type: ignore[misc]
                if n.op == "call_module" and isinstance(modules.get(n.target), QuantizedConcat)}  # type: ignore[arg-type]

    def _graph_io(self) -> tuple[set[str], set[str]]:
        """Names of modules fed by a model input, and of modules whose output is a model output."""
        graph = self._prepared.graph
        if graph is None:
            return set(), set()
        fed, out = set(), set()
        for node in graph.nodes:
            if node.op == "call_module" and any(a.op == "placeholder" for a in node.all_input_nodes):
                fed.add(node.target)
            if node.op == "output":
                out.update(a.target for a in node.all_input_nodes if a.op == "call_module")
        return fed, out  # type: ignore[return-value]

    def _configure(self) -> None:
        fed, out = self._graph_io()
        arity = self._concat_arity()
        for name, module in self.quantized_modules():
            module.plain_outputs = True  # values only between modules: no subclass dispatch on every downstream op
            if name in arity:  # one input slot per concatenated tensor
                module.input_quantizers = nn.ModuleList([None] * arity[name])
            op_types = op_types_of(module)
            for pname in list(module.param_quantizers):
                spec = self.config.param_spec(name, op_types, pname)
                param = getattr(module, pname)
                module.param_quantizers[pname] = self._param_quantizer(spec, param, module, f"{name}.{pname}")
            for i in range(len(module.input_quantizers)):
                spec = self.config.input_spec(name, op_types, i, is_model_input=name in fed)
                integer_input = isinstance(module, QuantizedEmbedding)
                module.input_quantizers[i] = None if integer_input else self._activation_quantizer(spec)
            for i, param_name in self._prepared.param_inputs.get(name, {}).items():
                if i < len(module.input_quantizers):  # a parameter read in forward(): quantized as one
                    module.input_quantizers[i] = self._parameter_read_quantizer(param_name)
            for i in range(len(module.output_quantizers)):
                spec = self.config.output_spec(name, op_types, i, is_model_output=name in out)
                module.output_quantizers[i] = self._activation_quantizer(spec)
            fixed = self.config.encoding_constraints(name, op_types)
            if fixed is not None:  # a fixed output range (AIMET HTP configs: Softmax, Sigmoid): never recalibrated
                for q in module.output_quantizers:
                    if q is not None:
                        q.set_range(*fixed) if isinstance(q, QuantizeDequantize) else q.set_range(max(map(abs, fixed)))
                        q.allow_overwrite(False)
        self._apply_supergroups(out)
        device = next((p.device for p in self.model.parameters()), None)
        if device is not None:
            for _, q in self.named_quantizers():
                q.to(device)

    def _data_type(self, spec: QuantizerSpec) -> DataType:
        return spec.dtype if spec.dtype is not None else self.default_data_type

    def _make(self, spec: QuantizerSpec, bw: int, shape: tuple[int, ...], block_size: tuple[int, ...] | None,
              scheme: QuantScheme) -> QuantizerBase:
        if spec.unsigned_symmetric and spec.symmetric:
            _warn_once("unsigned_symmetric is not applied by quanta: symmetric quantizers keep a signed grid")
        if self._data_type(spec) is DataType.FLOAT:
            if bw not in (8, 16):
                raise ValueError(f"float quantizers need bitwidth 8 (float8 e4m3fn) or 16 (float16), got {bw}")
            fmt = torch.float16 if bw == 16 else torch.float8_e4m3fn
            analyzer = None if bw == 16 else scheme.encoding_analyzer(shape, block_size, percentile=self._percentile)
            q: QuantizerBase = FloatQuantizeDequantize(dtype=fmt, shape=shape, block_size=block_size,
                                                       encoding_analyzer=analyzer)
            if scheme.learns_ranges and bw < 16:
                q.maxval = nn.Parameter(q.maxval.clone())  # type: ignore[assignment]
            return q
        analyzer = scheme.encoding_analyzer(shape, block_size, percentile=self._percentile)
        if spec.symmetric and spec.strict_symmetric:
            half = 2 ** (bw - 1) - 1
            q = QuantizeDequantize(shape, symmetric=True, encoding_analyzer=analyzer, block_size=block_size,
                                   qmin=-half, qmax=half)
        else:
            q = QuantizeDequantize(shape, bw, spec.symmetric, encoding_analyzer=analyzer, block_size=block_size)
        q.min.requires_grad_(scheme.learns_ranges)
        q.max.requires_grad_(scheme.learns_ranges)
        return q

    def _activation_quantizer(self, spec: QuantizerSpec) -> QuantizerBase | None:
        if not spec.enabled:
            return None
        return self._make(spec, spec.bitwidth or self.default_output_bw, (), None, self.quant_scheme)

    def _parameter_read_quantizer(self, target: str) -> QuantizerBase | None:
        """A per-tensor quantizer for parameter ``target`` (``owner.name``) read directly in forward(), as the
        config says for a parameter ``name`` of module ``owner``."""
        owner, _, pname = target.rpartition(".")
        module = self.model.get_submodule(owner) if owner else self.model
        spec = self.config.param_spec(owner or type(self.model).__name__, op_types_of(module), pname)
        if not spec.enabled:
            return None
        spec = dataclasses.replace(spec, per_channel=False, block_size=None)  # the op sees a moved/indexed copy
        return self._make(spec, spec.bitwidth or self.default_param_bw, (), None, self.param_quant_scheme)

    def _param_quantizer(self, spec: QuantizerSpec, param: torch.Tensor | None, module: QuantizationMixin,
                         where: str) -> QuantizerBase | None:
        if not spec.enabled or param is None:
            return None
        shape: tuple[int, ...] = ()
        block: tuple[int, ...] | None = None
        if (spec.per_channel or spec.block_size) and param.dim() >= 1:
            axis = module._weight_axis() if param.dim() > 1 else 0
            dims = [1] * param.dim()
            dims[axis] = param.shape[axis]
            if spec.block_size and param.dim() >= 2:
                in_axis = 1 - axis if axis in (0, 1) else 1
                if param.shape[in_axis] % spec.block_size:
                    raise ValueError(
                        f"{where}: block_size {spec.block_size} does not divide input-channel dimension "
                        f"{param.shape[in_axis]} of shape {tuple(param.shape)}"
                    )
                dims[in_axis] = param.shape[in_axis] // spec.block_size
                block = tuple(spec.block_size if d == in_axis else -1 if d != axis else 1 for d in range(param.dim()))
            shape = tuple(dims)
        return self._make(spec, spec.bitwidth or self.default_param_bw, shape, block, self.param_quant_scheme)

    def _apply_supergroups(self, model_outputs: set[str]) -> None:
        """Inside a supergroup (e.g. Conv -> ReLU) only the last op's output is quantized."""
        graph = self._prepared.graph
        if graph is None or not self.config.supergroups:
            return
        modules = dict(self.model.named_modules())

        def types(node: fx.Node) -> tuple[str, ...]:
            if node.op != "call_module" or not isinstance(modules.get(node.target), QuantizationMixin):
                return ()
            return op_types_of(modules[node.target])  # type: ignore[index]

        for group in self.config.supergroups:
            for node in graph.nodes:
                chain = [node]
                for op in group:
                    cur = chain[-1]
                    if op not in types(cur):
                        break
                    if len(chain) == len(group):
                        chain.append(None)  # type: ignore[arg-type]  # matched
                        break
                    users = list(cur.users)
                    if len(users) != 1 or cur.target in model_outputs:
                        break
                    nxt = users[0]
                    while _moves_values(nxt, modules) and len(nxt.users) == 1:  # dropout, view, ... in between
                        nxt = next(iter(nxt.users))
                    chain.append(nxt)
                if chain[-1] is not None:
                    continue
                for n in chain[:-2]:
                    m = modules[n.target]
                    for i in range(len(m.output_quantizers)):  # type: ignore[union-attr]
                        m.output_quantizers[i] = None  # type: ignore[union-attr,index]

    # ------------------------------------------------------------------ quantizers
    def named_quantizers(self) -> Iterator[tuple[str, QuantizerBase]]:
        """``(name, quantizer)`` for every quantizer, e.g. ``("conv1.output_quantizers.0", q)``."""
        for name, m in self.model.named_modules():
            if isinstance(m, QuantizerBase):
                yield name, m

    def quantizers(self) -> Iterator[QuantizerBase]:
        """Every quantizer (AIMET's name; see :meth:`named_quantizers`)."""
        for _, q in self.named_quantizers():
            yield q

    def named_qmodules(self) -> Iterator[tuple[str, QuantizationMixin]]:
        """``(name, module)`` for every quantized module, nested ones included (AIMET's name)."""
        for name, m in self.model.named_modules():
            if isinstance(m, QuantizationMixin):
                yield name, m

    def qmodules(self) -> Iterator[QuantizationMixin]:
        """Every quantized module (AIMET's name; see :meth:`named_qmodules`)."""
        for _, m in self.named_qmodules():
            yield m

    def named_quantizer_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` for the quantizers' own parameters (ranges), each once: what a QAT
        optimizer with its own learning rate for ranges takes, e.g. ``("fc.output_quantizers.0.max", p)``."""
        seen: set[int] = set()
        for qname, q in self.named_quantizers():
            for pname, p in q.named_parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    yield f"{qname}.{pname}", p

    def quantizer_parameters(self) -> Iterator[nn.Parameter]:
        """The quantizers' own parameters (see :meth:`named_quantizer_parameters`)."""
        for _, p in self.named_quantizer_parameters():
            yield p

    def exclude_layers_from_quantization(self, layers_to_exclude: Iterable[nn.Module]) -> None:
        """Run these modules of :attr:`model` (and the quantized modules inside them) in float:
        all their quantizers are removed (AIMET's method).

        Raises TypeError for something that is not a module, ValueError for a module that is not
        part of :attr:`model` (e.g. one of the original model, which the sim copied).
        """
        if isinstance(layers_to_exclude, nn.Module):
            layers_to_exclude = [layers_to_exclude]
        ours = {id(m) for m in self.model.modules()}
        layers = list(layers_to_exclude)
        for layer in layers:
            if not isinstance(layer, nn.Module):
                raise TypeError(f"layers_to_exclude must hold nn.Module objects, got {type(layer).__name__}")
            if id(layer) not in ours:
                raise ValueError(f"layers_to_exclude: {type(layer).__name__} is not a module of sim.model (pass "
                                 "modules of sim.model, e.g. sim.model.get_submodule(name))")
        for layer in layers:
            for m in layer.modules():
                if isinstance(m, QuantizationMixin):
                    _set_slots(m, [None] * len(m.input_quantizers), [None] * len(m.output_quantizers),
                               dict.fromkeys(m.param_quantizers))

    def exclude_param_from_quantization(self, param_name_to_exclude: str) -> None:
        """Remove the quantizer of every parameter called ``param_name_to_exclude`` (``"bias"``, ``"weight"``)
        from all quantized modules (AIMET's method)."""
        if not isinstance(param_name_to_exclude, str):
            raise TypeError(f"param_name_to_exclude must be a str, got {type(param_name_to_exclude).__name__}")
        for m in self.qmodules():
            if param_name_to_exclude in m.param_quantizers:
                m.param_quantizers[param_name_to_exclude] = None

    @classmethod
    def get_original_model(cls, model: nn.Module, qdq_weights: bool = False) -> nn.Module:
        """A copy of ``model`` (e.g. ``sim.model``) with every quantized module turned back into its float
        module (AIMET's method); ``qdq_weights`` bakes the parameter quantizers' fake-quantized values into
        the copy's parameters first. ``model`` is not modified."""
        original = _deepcopy(model)
        if qdq_weights:
            _fold_params(((n, m) for n, m in original.named_modules() if isinstance(m, QuantizationMixin)),
                         "run compute_encodings() first (or qdq_weights=False)")
        if isinstance(original, QuantizationMixin):
            return original.to_float_module()

        def restore(module: nn.Module) -> None:
            for name, child in list(module.named_children()):
                if isinstance(child, QuantizationMixin):
                    setattr(module, name, child.to_float_module())
                else:
                    restore(child)

        restore(original)
        return original

    def quantizer_state_dict(self) -> OrderedDict[str, torch.Tensor]:
        """The entries of ``sim.model.state_dict()`` that belong to quantizers (ranges, flags).

        Load it back with ``sim.model.load_state_dict(sd, strict=False)`` or :meth:`load_quantizer_state_dict`.
        """
        prefixes = tuple(f"{name}." for name, _ in self.named_quantizers())
        return OrderedDict((k, v) for k, v in self.model.state_dict().items() if k.startswith(prefixes))

    def load_quantizer_state_dict(self, state_dict: Mapping[str, torch.Tensor], strict: bool = True) -> None:
        """Load :meth:`quantizer_state_dict` output. ``strict``: keys must match the quantizers exactly."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        own = self.quantizer_state_dict()
        unexpected = [k for k in state_dict if k not in own]
        missing = [k for k in own if k not in state_dict]
        if strict and (unexpected or missing):
            raise ValueError(f"quantizer state dict mismatch: missing {_shortlist(missing)}, "
                             f"unexpected {_shortlist(unexpected)}")
        # validate every quantizer's whole new state first, so a bad entry changes nothing
        for name, q in self.named_quantizers():
            prefix = f"{name}."
            local = {k[len(prefix):]: v for k, v in state_dict.items()
                     if isinstance(k, str) and k.startswith(prefix) and "." not in k[len(prefix):]}
            try:
                q.check_state(local)
            except (ValueError, TypeError) as e:
                raise type(e)(f"state_dict: quantizer {name}: {e}") from None
        self.model.load_state_dict({k: v for k, v in state_dict.items() if k in own}, strict=False)

    def set_percentile_value(self, percentile: float) -> None:
        """Percentile used by the PERCENTILE scheme (in [50, 100]); applies to existing quantizers."""
        from quanta.quantization.encoding_analyzer import PercentileEncodingAnalyzer

        if isinstance(percentile, bool) or not isinstance(percentile, (int, float)) or not 50 <= percentile <= 100:
            raise ValueError(f"percentile must be a number in [50, 100], got {percentile!r}")
        self._percentile = float(percentile)
        for _, q in self.named_quantizers():
            analyzer = getattr(q, "encoding_analyzer", None)
            if isinstance(analyzer, PercentileEncodingAnalyzer):
                analyzer.set_percentile(self._percentile)

    @contextlib.contextmanager
    def quantizers_disabled(self) -> Iterator[None]:
        """Inside the block every quantizer slot is None (the model runs in float); restored on exit."""
        with quantizers_off(m for m in self.model.modules() if isinstance(m, QuantizationMixin)):  # nested too
            yield

    # ------------------------------------------------------------------ calibration
    def compute_encodings(
        self,
        forward_pass_callback: Callable[..., Any] | Iterable[Any],
        forward_pass_callback_args: Any = _NO_ARGS,
        *,
        progress: bool = True,
        total: int | None = None,
    ) -> None:
        """Calibrate every quantizer on the forward passes that ``forward_pass_callback`` makes.

        Three forms:

        * ``sim.compute_encodings(fn)`` calls ``fn(sim.model)``;
        * ``sim.compute_encodings(fn, args)`` calls ``fn(sim.model, args)`` (AIMET);
        * ``sim.compute_encodings(batches)`` with an iterable of inputs runs
          ``sim.model(batch)`` (or ``sim.model(*batch)`` for a tuple) for each.

        The model runs in eval mode under ``torch.no_grad()`` (its mode is restored).
        ``progress`` shows a bar (tqdm, else rich, when installed) advancing once per
        forward call of :attr:`model`; ``total`` is its length (default: ``len(batches)``
        when known). Quantizers that saw no input keep their encoding and are named
        in one RuntimeWarning. Under ``torch.distributed``, statistics are reduced
        across ranks, so every rank gets the same encodings.
        """
        run = self._forward_runner(forward_pass_callback, forward_pass_callback_args)
        if total is None and not callable(forward_pass_callback):
            total = len(forward_pass_callback) if hasattr(forward_pass_callback, "__len__") else None  # type: ignore[arg-type]
        quantizers = list(self.named_quantizers())
        seen: set[int] = set()
        hooks = [q.register_forward_pre_hook(lambda m, args: seen.add(id(m))) for _, q in quantizers]
        try:
            # catch_warnings outermost: the quantizers' own "no input was seen" warnings fire on exit of the stack
            with warnings.catch_warnings(record=True) as caught, contextlib.ExitStack() as stack:
                warnings.simplefilter("always")
                stack.enter_context(_eval_no_grad(self.model))
                stack.enter_context(progress_bar(self.model, total, enabled=progress, desc="compute_encodings"))
                for _, q in quantizers:
                    stack.enter_context(q.compute_encodings())
                run(self.model)
        finally:
            for h in hooks:
                h.remove()
        for w in caught:
            if "no input was seen" not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        unseen = [name for name, q in quantizers if id(q) not in seen and q._allow_overwrite]
        if unseen:
            missing = [name for name, q in quantizers if name in unseen and not q.is_initialized()]
            warnings.warn(
                f"compute_encodings: {len(unseen)} quantizers saw no input and kept their encoding: "
                f"{_shortlist(unseen)}" + (f"; still uninitialised: {_shortlist(missing)}" if missing else ""),
                RuntimeWarning,
                stacklevel=2,
            )

    @staticmethod
    def _forward_runner(fn: Any, args: Any) -> Callable[[nn.Module], None]:
        if callable(fn) and not isinstance(fn, nn.Module):
            if args is _NO_ARGS:
                return lambda model: fn(model)
            return lambda model: fn(model, args)
        if args is not _NO_ARGS:
            raise TypeError("forward_pass_callback_args needs a callable forward_pass_callback")
        if isinstance(fn, (torch.Tensor, nn.Module, str, bytes)) or not isinstance(fn, Iterable):
            raise TypeError(
                "forward_pass_callback must be a callable fn(model) / fn(model, args), or an iterable of inputs; "
                f"got {type(fn).__name__}"
            )

        def run(model: nn.Module) -> None:
            for batch in fn:
                _call(model, batch)
        return run

    def compute_encodings_sequential(self, batches: Iterable[Any], *, progress: bool = True) -> None:
        """Calibrate layer by layer: each op is calibrated on the outputs of the already-quantized ops before it.

        ``batches`` holds the calibration inputs (tensors, or tuples of the
        model's positional inputs). The traced graph is run one node at a time
        over all batches: a quantized module first observes its inputs for every
        batch, computes its encodings, then produces its quantized outputs, and a
        value is dropped as soon as its last user has run. So besides the inputs,
        memory holds only the live activations (for a chain of layers: one
        layer's), never a whole forward pass per batch. Needs a traced model.
        """
        graph = self._prepared.graph
        if graph is None:
            raise RuntimeError(
                f"sequential calibration needs a traced model; tracing failed: {self._prepared.trace_error}"
            )
        inputs = []
        for b, batch in enumerate(batches):
            args, kwargs = ((), dict(batch)) if isinstance(batch, Mapping) else (
                batch if isinstance(batch, tuple) else (batch,), {})
            try:
                inputs.append(flat_inputs(self.model, args, kwargs))  # type: ignore[arg-type]
            except TypeError as e:
                raise TypeError(f"batch {b} does not fit the model's inputs: {e}") from None
        if not inputs:
            raise ValueError("batches is empty")
        modules = dict(self.model.named_modules())
        nodes = list(graph.nodes)
        last_use = {}
        for i, node in enumerate(nodes):
            for a in node.all_input_nodes:
                last_use[a] = i
        envs: list[dict[fx.Node, Any]] = [{} for _ in inputs]
        placeholders = [n for n in nodes if n.op == "placeholder"]
        with _eval_no_grad(self.model), _bar(len(nodes), progress) as advance:
            for b, flat in enumerate(inputs):
                for ph, value in zip(placeholders, flat):
                    envs[b][ph] = value
            # A module called from several places (a shared ReLU) is calibrated on all of them: its statistics
            # stay open from its first call site to its last; earlier sites use each batch's own range.
            sites = Counter(n.target for n in nodes
                            if n.op == "call_module" and isinstance(modules.get(n.target), QuantizationMixin))
            visits: Counter = Counter()
            with contextlib.ExitStack() as open_calibrations:
                calibrating: dict[Any, contextlib.ExitStack] = {}
                for i, node in enumerate(nodes):
                    if node.op == "placeholder":
                        advance()
                        continue
                    if node.op == "output":
                        break
                    module = modules.get(node.target) if node.op == "call_module" else None
                    if isinstance(module, QuantizationMixin):
                        visits[node.target] += 1
                        if node.target not in calibrating:
                            stack = calibrating[node.target] = open_calibrations.enter_context(contextlib.ExitStack())
                            stack.enter_context(module.compute_encodings())
                        if visits[node.target] == sites[node.target]:  # last site: finish, then run calibrated
                            for env in envs:
                                _run_node(self.model, node, env)
                            calibrating.pop(node.target).close()
                    for env in envs:
                        env[node] = _run_node(self.model, node, env)
                    for a in node.all_input_nodes:
                        if last_use.get(a) == i:
                            for env in envs:
                                env.pop(a, None)
                    advance()

    # ------------------------------------------------------------------ encodings
    def get_encodings(self) -> dict[str, AffineEncoding | FloatEncoding]:
        """The current encoding of every initialised quantizer, by quantizer name."""
        return {name: q.get_encodings() for name, q in self.named_quantizers() if q.is_initialized()}

    def save_encodings(self, path: str | os.PathLike, version: str | None = None) -> None:
        """Write every initialised quantizer's encoding to a JSON file (atomically) that :meth:`load_encodings` reads.

        ``version=None`` writes quanta's lossless format (any grid, block and
        float format); ``"0.6.1"``, ``"1.0.0"`` or ``"2.0.0"`` write AIMET's
        encodings formats (see :mod:`quanta.export.encodings`), with activations
        named ``"<module>.output.<i>"`` / ``"<module>.input.<i>"`` and parameters
        ``"<module>.<param>"``. Encodings a version cannot hold raise ValueError.
        """
        if version is not None:
            from quanta.export.encodings import EncodingsVersion
            from quanta.export.sim_encodings import export_encodings

            export_encodings(self, path, EncodingsVersion.parse(version))
            return
        entries = {}
        for name, enc in self.get_encodings().items():
            entries[name] = {"type": "float" if isinstance(enc, FloatEncoding) else "affine", **enc.to_dict()}
        doc = {"format": ENCODINGS_FORMAT, "version": ENCODINGS_VERSION, "quantizers": entries}
        text = json.dumps(doc, indent=1)
        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)

        atomic_write(path, write)

    def load_and_freeze_encodings(self, encoding_path: str | os.PathLike | Mapping[str, Any],
                                  ignore_when_quantizer_disabled: bool = False) -> None:
        """:meth:`load_encodings` (partial), then freeze what it set: ranges no longer train and a later
        :meth:`compute_encodings` keeps them (AIMET's method). ``ignore_when_quantizer_disabled``: an
        encoding for a quantizer the sim does not have is skipped instead of raising."""
        self.load_encodings(encoding_path, strict=not ignore_when_quantizer_disabled, partial=True,
                            requires_grad=False, allow_overwrite=False)

    def load_encodings(
        self,
        encodings: str | os.PathLike | Mapping[str, Any],
        strict: bool = True,
        partial: bool = True,
        requires_grad: bool | None = None,
        allow_overwrite: bool | None = None,
    ) -> None:
        """Set quantizer encodings from a file written by :meth:`save_encodings` (or its dict), in quanta's
        format or in AIMET's 0.6.1 / 1.0.0 / 2.0.0 formats (names as :meth:`save_encodings` writes them).

        Args:
            strict: every entry must name an existing, enabled quantizer of the same grid and shape.
            partial: if False, every quantizer of the model must have an entry.
            requires_grad: if given, set ``requires_grad`` of the loaded ranges (QAT from loaded encodings).
            allow_overwrite: if given, whether a later ``compute_encodings`` may overwrite them.

        Nothing is changed unless the whole file is valid. Raises ValueError
        naming the entry for malformed content; loading never executes code.
        """
        where = ""
        if isinstance(encodings, (str, os.PathLike)):  # parse once (json only), then tell the formats apart
            where = f"{os.fspath(encodings)}: "
            encodings = read_json(encodings, "encodings")
            if not isinstance(encodings, Mapping):
                raise ValueError(f"{where}encodings: expected a JSON object, got {type(encodings).__name__}")
        if not _is_quanta_format(encodings):
            from quanta.export.sim_encodings import apply_encodings

            try:
                apply_encodings(self, encodings, strict=strict, partial=partial, requires_grad=requires_grad,
                                allow_overwrite=allow_overwrite)
            except ValueError as e:
                raise ValueError(f"{where}{e}") from None
            return
        doc = _read_encodings(encodings)
        entries = doc["quantizers"]
        own = dict(self.named_quantizers())
        unknown = [k for k in entries if k not in own]
        if strict and unknown:
            raise ValueError(f"encodings for quantizers the model does not have (or that are disabled): "
                             f"{_shortlist(unknown)}")
        if not partial:
            absent = [k for k in own if k not in entries]
            if absent:
                raise ValueError(f"partial=False but the encodings miss quantizers {_shortlist(absent)}")
        parsed: list[tuple[QuantizerBase, AffineEncoding | FloatEncoding]] = []
        for name, entry in entries.items():
            if name not in own:
                continue
            enc = _parse_entry(name, entry)
            _check_entry(name, enc, own[name])
            parsed.append((own[name], enc))
        for q, enc in parsed:
            if isinstance(enc, AffineEncoding):
                q.set_encodings(enc)  # type: ignore[union-attr]
            else:
                q.set_range(enc.maxval)  # type: ignore[union-attr]
            if requires_grad is not None:
                for p in q.parameters():
                    p.requires_grad_(requires_grad)
            if allow_overwrite is not None:
                q.allow_overwrite(allow_overwrite)

    def fold_param_quantizers(self) -> None:
        """Replace each quantized parameter by its fake-quantized value and remove its quantizer.

        The model then computes the same outputs with less work per forward
        (weights are on the grid already). Uninitialised parameter quantizers raise RuntimeError.
        """
        _fold_params(self.quantized_modules(), "run compute_encodings()")

    # ------------------------------------------------------------------ export
    def export(
        self,
        path: str | os.PathLike,
        filename_prefix: str,
        dummy_input: torch.Tensor | tuple[torch.Tensor, ...],
        *,
        encoding_version: str = "1.0.0",
        qdq: bool = True,
        prequantize_weights: bool = False,
        opset: int | None = None,
    ) -> dict[str, str]:
        """Write ``<path>/<filename_prefix>.onnx`` and ``<path>/<filename_prefix>.encodings`` (AIMET's export).

        The ONNX graph has standard QuantizeLinear/DequantizeLinear nodes for every
        quantizer (``qdq=False``: the float graph, for toolchains that read the
        encodings file instead); weights can be stored pre-quantized. The opset is
        the lowest the dtypes need (13 for 8-bit, 21 for int4/int16/blocks) unless
        ``opset`` is given. The encodings file is AIMET's ``encoding_version``
        format (``"0.6.1"``, ``"1.0.0"``, ``"2.0.0"``), keyed by the ONNX tensor
        names; :meth:`load_encodings` reads it back. Both files are written
        atomically. Needs the ``onnx`` extra (``pip install 'quanta[onnx]'``).

        Returns ``{quantizer name: ONNX tensor name}``.
        """
        from quanta.export.encodings import EncodingsVersion
        from quanta.export.onnx import export_onnx
        from quanta.export.sim_encodings import export_encodings

        if not isinstance(filename_prefix, str) or not filename_prefix or os.sep in filename_prefix:
            raise ValueError(f"filename_prefix must be a non-empty file name without '{os.sep}', "
                             f"got {filename_prefix!r}")
        directory = os.fspath(path)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"export directory does not exist: {directory}")
        version = EncodingsVersion.parse(encoding_version)
        # both files are written under temporary names first and renamed together at the end, so a failure
        # in either leaves the previous pair as it was (never a new graph beside old encodings)
        finals = [os.path.join(directory, f"{filename_prefix}.{ext}") for ext in ("onnx", "encodings")]
        temps = [os.path.join(directory, f".{filename_prefix}.{ext}.quanta-partial") for ext in ("onnx", "encodings")]
        try:
            names = export_onnx(self, temps[0], dummy_input, qdq=qdq, prequantize_weights=prequantize_weights,
                                opset=opset)
            export_encodings(self, temps[1], version, tensors=set(names.values()))
            for tmp, final in zip(temps, finals):
                os.replace(tmp, final)
        finally:
            for tmp in temps:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return names

    # ------------------------------------------------------------------ analysis
    def layer_sqnr(self, batches: Iterable[Any]) -> "LayerSQNRReport":
        """Per-layer SQNR of the quantized model against float, on ``batches``; see :mod:`quanta.quantsim.report`."""
        from quanta.quantsim.report import layer_sqnr

        return layer_sqnr(self, batches)

    def __repr__(self) -> str:
        n = sum(1 for _ in self.named_quantizers())
        return (f"QuantizationSimModel(quant_scheme={self.quant_scheme.value}, quantizers={n}, "
                f"capture={self.capture_method}, unquantized_modules={len(self.unquantized_modules)}, "
                f"float_ops={len(self.float_ops)})")


# ---------------------------------------------------------------------- helpers
def _moves_values(node: fx.Node, modules: Mapping[str, nn.Module]) -> bool:
    """Whether ``node`` only moves or selects values (a dropout module, a view, a transpose, ...)."""
    if node.op == "call_module":
        return isinstance(modules.get(node.target), _PASSTHROUGH_MODULES)  # type: ignore[arg-type]
    return node.op in ("call_function", "call_method") and not _changes_values(node)


def _deepcopy(model: nn.Module) -> nn.Module:
    """``copy.deepcopy`` without torch's own deprecation notice from copying a torch.export graph module's
    pytree specs (``isinstance(treespec, LeafSpec)``), which the user can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        return copy.deepcopy(model)



_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, UserWarning, stacklevel=4)


@contextlib.contextmanager
def _eval_no_grad(model: nn.Module) -> Iterator[None]:
    with eval_mode(model), torch.no_grad():
        yield


@contextlib.contextmanager
def _bar(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    from quanta.quantsim.progress import make_bar

    bar = make_bar(total, enabled=enabled, desc="sequential calibration")
    try:
        yield bar.advance
    finally:
        bar.close()


def _run_node(root: nn.Module, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    args = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
    if node.op == "call_module":
        return root.get_submodule(node.target)(*args, **kwargs)  # type: ignore[arg-type]
    if node.op == "call_function":
        return node.target(*args, **kwargs)  # type: ignore[operator]
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)  # type: ignore[arg-type]
    if node.op == "get_attr":
        obj: Any = root
        for part in node.target.split("."):  # type: ignore[union-attr]
            obj = getattr(obj, part)
        return obj
    raise RuntimeError(f"unexpected graph node {node.op} {node.target}")  # pragma: no cover


def _is_quanta_format(doc: Any) -> bool:
    """Whether a parsed encodings document is quanta's own format; AIMET's carry a ``version`` and no ``format``.
    Anything that is not a mapping goes to quanta's reader, which names what is wrong with it."""
    return not isinstance(doc, Mapping) or "format" in doc or "version" not in doc


def _read_encodings(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, (str, os.PathLike)):
        doc = read_json(source, "encodings")
    elif isinstance(source, Mapping):
        doc = source
    else:
        raise TypeError(f"encodings must be a path or a mapping, got {type(source).__name__}")
    if not isinstance(doc, Mapping) or doc.get("format") != ENCODINGS_FORMAT:
        raise ValueError(f"encodings: expected a mapping with format={ENCODINGS_FORMAT!r} (written by save_encodings)")
    if doc.get("version") != ENCODINGS_VERSION:
        raise ValueError(f"encodings: unsupported version {doc.get('version')!r} (this quanta reads {ENCODINGS_VERSION})")
    if not isinstance(doc.get("quantizers"), Mapping):
        raise ValueError("encodings['quantizers'] must be a mapping of quantizer names to encodings")
    bad = [k for k in doc["quantizers"] if not isinstance(k, str)]
    if bad:
        raise TypeError(f"encodings['quantizers']: quantizer names must be strings, got {bad[0]!r}")
    return dict(doc)


def _check_entry(name: str, enc: AffineEncoding | FloatEncoding, q: QuantizerBase) -> None:
    """Everything ``set_encodings``/``set_range`` would reject, checked before anything is changed."""
    where = f"encodings[{name!r}]"
    if isinstance(enc, AffineEncoding) != isinstance(q, QuantizeDequantize):
        raise ValueError(f"{where}: a {'affine' if isinstance(enc, AffineEncoding) else 'float'} encoding for a "
                         f"{type(q).__name__}")
    if tuple(enc.scale.shape) != tuple(q.shape):  # type: ignore[attr-defined]
        raise ValueError(f"{where}: shape {tuple(enc.scale.shape)} differs from the quantizer's {q.shape}")  # type: ignore[attr-defined]
    if enc.block_size != q.block_size:  # type: ignore[attr-defined]
        raise ValueError(f"{where}: block_size {enc.block_size} differs from the quantizer's {q.block_size}")  # type: ignore[attr-defined]
    if isinstance(enc, FloatEncoding):
        if enc.format != q.format:  # type: ignore[attr-defined]
            raise ValueError(f"{where}: float format {enc.format} differs from the quantizer's {q.format}")  # type: ignore[attr-defined]
        return
    if enc.grid != q.grid:  # type: ignore[attr-defined]
        raise ValueError(f"{where}: grid {enc.grid} differs from the quantizer's {q.grid}")  # type: ignore[attr-defined]
    offset = torch.broadcast_to(enc.offset, enc.scale.shape)
    if not bool(torch.isfinite(offset).all()) or not torch.equal(offset, offset.round()):
        raise ValueError(f"{where}: offsets must be finite integers")
    if q.symmetric:  # type: ignore[attr-defined]
        want = offset_from_range(enc.scale, enc.scale, q.grid, True)  # type: ignore[attr-defined]
        if not torch.equal(offset.float(), torch.broadcast_to(want, offset.shape).float()):
            raise ValueError(f"{where}: a symmetric quantizer needs the symmetric offset {want.flatten()[0].item()}")


def _parse_entry(name: str, entry: Any) -> AffineEncoding | FloatEncoding:
    if not isinstance(entry, Mapping):
        raise ValueError(f"encodings[{name!r}] must be a mapping, got {type(entry).__name__}")
    kind = entry.get("type")
    body = {k: v for k, v in entry.items() if k != "type"}
    try:
        if kind == "affine":
            enc: AffineEncoding | FloatEncoding = AffineEncoding.from_dict(body)
        elif kind == "float":
            enc = FloatEncoding.from_dict(body)
        else:
            raise ValueError(f"'type' must be 'affine' or 'float', got {kind!r}")
        scale = enc.scale
        if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
            raise ValueError("scales must be finite and positive")
    except (TypeError, ValueError, KeyError, OverflowError) as e:  # OverflowError: int(inf) in a shape
        raise ValueError(f"encodings[{name!r}]: {e}") from None
    return enc


def _fold_params(modules: Iterable[tuple[str, QuantizationMixin]], hint: str) -> None:
    """Replace each quantized parameter of ``modules`` (``(name, module)`` pairs) by its fake-quantized value
    and remove its quantizer; RuntimeError (``hint`` says what to do) for an uninitialised quantizer."""
    for name, module in modules:
        for pname, q in list(module.param_quantizers.items()):
            if q is None:
                continue
            if not q.is_initialized():
                raise RuntimeError(f"{name}.param_quantizers.{pname} is not initialised; {hint}")
            p = getattr(module, pname)
            with torch.no_grad():
                p.copy_(q(p).as_subclass(torch.Tensor))
            module.param_quantizers[pname] = None


from quanta.quantsim.report import LayerSQNRReport  # noqa: E402  (type used in an annotation above)
