"""QuantizationSimModel: a whole model with simulated quantization (AIMET's QuantSim).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
>>> x = torch.randn(32, 8)
>>> sim = QuantizationSimModel(model, x, quant_scheme="min_max", default_param_bw=8, default_output_bw=8)
>>> sim.compute_encodings(lambda m: m(x), progress=False)
>>> y = sim.model(x)                       # fake-quantized forward, same inputs as the model
>>> sorted(name for name, _ in sim.named_quantizers())[:3]   # the model input is quantized, as in AIMET
['0.input_quantizers.0', '0.param_quantizers.weight', '1.output_quantizers.0']
>>> sim.model.get_submodule("0").output_quantizers[0] is None   # Linear -> ReLU supergroup: one output quantizer
True
"""

from __future__ import annotations

import contextlib
import copy
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from quanta._inputs import split_dummy_input
from quanta._text import shortlist as _shortlist
from quanta.encodings.affine import AffineEncoding
from quanta.encodings.float import FloatEncoding
from quanta.nn import QuantizationMixin
from quanta.nn.base import _set_slots, quantizers_off
from quanta.quantization.base import QuantizerBase
from quanta.quantsim import calibrate, construction, encodings_io
from quanta.quantsim.capture import PreparedModel, prepare_model
from quanta.quantsim.config import DataType, QuantSimConfig
from quanta.quantsim.encodings_io import ENCODINGS_FORMAT, ENCODINGS_VERSION  # noqa: F401  (importable here too)
from quanta.quantsim.placement import place
from quanta.quantsim.scheme import QuantScheme

__all__ = ["QuantizationSimModel"]



def _parse_data_type(value: Any) -> DataType:
    return DataType.parse(value, "default_data_type")


def _check_bw(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 32:
        raise ValueError(f"{name} must be an integer in [1, 32], got {value!r}")
    return value


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
        default_output_bw: bitwidth of activation quantizers where the config does not set one.
        default_param_bw: bitwidth of parameter quantizers where the config does not set one.
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
            Conv/Linear/Add + ReLU and Conv + BatchNorm (see docs/guides/quantsim-config.md).
        default_data_type: ``int`` (integer grids) or ``float`` (16 bits: float16;
            8 bits: float8 e4m3fn).
        param_quant_scheme: scheme for parameter quantizers (keyword only; see ``quant_scheme``).
        trace: set False to skip torch.fx tracing (functional ops then stay in float).

    After construction, ``model`` is the quantized model. Leaf modules with
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
        self._dummy_args, self._dummy_kwargs = split_dummy_input(dummy_input)
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
        self.unquantized_modules: list[str] = construction.quantize_modules(self.model, self._prepared.method)
        #: graph nodes of functional ops that change values and stay in float
        self.float_ops: list[str] = list(self._prepared.float_ops)
        for target in self._prepared.direct_params:  # a module whose forward uses its parameters directly
            owner = target.rpartition(".")[0] or target
            if owner not in self.unquantized_modules:
                self.unquantized_modules.append(owner)
        modules = list(self.quantized_modules())
        placements = place(self.config, self.model, modules, self._prepared.graph, self._prepared.param_inputs,
                           output_bw=self.default_output_bw, param_bw=self.default_param_bw)
        construction.install(self.model, modules, placements, construction.QuantizerDefaults(
            self.default_output_bw, self.default_param_bw, self.default_data_type, self.quant_scheme,
            self.param_quant_scheme, self._percentile))
        self._warn_unquantized()

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
        """``(name, module)`` for every quantized module of ``model`` (not those inside another one, such as
        ``QuantizedMultiheadAttention.out_proj``, which their parent configures)."""
        return construction.quantized_modules(self.model)

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
        """Run these modules of ``model`` (and the quantized modules inside them) in float:
        all their quantizers are removed (AIMET's method).

        Raises TypeError for something that is not a module, ValueError for a module that is not
        part of ``model`` (e.g. one of the original model, which the sim copied).
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
            construction.fold_params(((n, m) for n, m in original.named_modules() if isinstance(m, QuantizationMixin)),
                                     "run compute_encodings() first (or qdq_weights=False)")
        return construction.restore_float_modules(original)

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
        state = {k: v for k, v in state_dict.items() if k in own}
        # A shared quantizer (AIMET's encoding propagation) sits under several module paths and torch loads it
        # once per path: give every path its entries, or a path without them resets what another one set.
        paths: dict[int, list[str]] = {}
        for path, module in self.model.named_modules(remove_duplicate=False):
            paths.setdefault(id(module), []).append(path)
        for name, q in self.named_quantizers():
            local = {k[len(name) + 1:]: v for k, v in state.items() if k.startswith(f"{name}.")}
            for alias in paths.get(id(q), ()):
                if alias != name:
                    state.update({f"{alias}.{k}": v for k, v in local.items()})
        self.model.load_state_dict(state, strict=False)

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
        forward_pass_callback_args: Any = calibrate.NO_ARGS,
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
        forward call of ``model``; ``total`` is its length (default: ``len(batches)``
        when known). Quantizers that saw no input keep their encoding and are named
        in one RuntimeWarning. Under ``torch.distributed``, statistics are reduced
        across ranks, so every rank gets the same encodings.

        As in AIMET 2.42, activation quantizers observe but do not quantize during these passes (each op
        sees float inputs, computed with quantized parameters), so each activation's range is that of the
        float activation; one whose range is fixed (``encoding_constraints``) quantizes with it.
        :meth:`compute_encodings_sequential` calibrates on quantized inputs instead.
        """
        activations = [q for m in self.model.modules() if isinstance(m, QuantizationMixin)  # a fixed range
                       for q in (*m.input_quantizers, *m.output_quantizers) if q is not None and q._allow_overwrite]
        calibrate.compute_encodings(self.model, self.named_quantizers(), forward_pass_callback,
                                    forward_pass_callback_args, progress=progress, total=total,
                                    passthrough=activations)

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
        calibrate.compute_encodings_sequential(self.model, graph, batches, progress=progress)

    # ------------------------------------------------------------------ encodings
    def get_encodings(self) -> dict[str, AffineEncoding | FloatEncoding]:
        """The current encoding of every initialised quantizer, by quantizer name."""
        return {name: q.get_encodings() for name, q in self.named_quantizers() if q.is_initialized()}

    def save_encodings(self, path: str | os.PathLike, version: str | None = None) -> None:
        """Write every initialised quantizer's encoding to a JSON file (atomically) that :meth:`load_encodings` reads.

        ``version=None`` writes quanta's lossless format (any grid, block and
        float format); ``"0.6.1"`` or ``"1.0.0"`` AIMET's module-keyed file (as its
        ``save_encodings_to_json`` and the ``_torch.encodings`` of its export: what AIMET's
        ``load_encodings`` reads); ``"2.0.0"`` or ``"2.1.0"`` AIMET's ``encodings`` list with
        activations named ``"<module>.output.<i>"`` / ``"<module>.input.<i>"`` and parameters
        ``"<module>.<param>"`` (see :mod:`quanta.export.encodings`). Encodings a version cannot
        hold raise ValueError.
        """
        encodings_io.save_encodings(self, path, version)

    def load_and_freeze_encodings(self, encoding_path: str | os.PathLike | Mapping[str, Any],
                                  ignore_when_quantizer_disabled: bool = False) -> None:
        """:meth:`load_encodings` (partial), then freeze what it set: ranges no longer train and a later
        :meth:`compute_encodings` keeps them (AIMET's method). ``ignore_when_quantizer_disabled``: an
        encoding for a quantizer the sim does not have is skipped instead of raising."""
        self.load_encodings(encoding_path, strict=not ignore_when_quantizer_disabled, partial=True,
                            requires_grad=False, allow_overwrite=False)

    def set_and_freeze_param_encodings(self, encoding_path: str | os.PathLike | Mapping[str, Any]) -> None:
        """Load the parameter encodings of a file (activation entries are ignored) and freeze them: AIMET's
        method, used to load what :meth:`quanta.adaround.Adaround.apply_adaround` writes before
        :meth:`compute_encodings`. Every entry must name a parameter quantizer of this sim."""
        encodings_io.load_param_encodings(self, encoding_path)

    def load_encodings(
        self,
        encodings: str | os.PathLike | Mapping[str, Any],
        strict: bool = True,
        partial: bool = True,
        requires_grad: bool | None = None,
        allow_overwrite: bool | None = None,
    ) -> None:
        """Set quantizer encodings from a file (or its dict): quanta's format, or any file AIMET 2.x or quanta
        writes: ``<prefix>.encodings`` of version 0.6.1 / 1.0.0 / 2.0.0 / 2.1.0 keyed by ONNX tensor names
        (matched by exporting this sim to ONNX with its dummy input; graph inputs and outputs by position
        in the ``<prefix>.onnx`` beside the file), the module-keyed ``<prefix>_torch.encodings``, or the
        files :meth:`save_encodings` writes. AIMET's derived int32 bias encodings, and encodings it repeats
        after data-movement ops (a Flatten) where this sim has no quantizer, are skipped.

        Args:
            strict: every entry must name an existing, enabled quantizer of the same grid and shape.
            partial: if False, every quantizer of the model must have an entry.
            requires_grad: if given, set ``requires_grad`` of the loaded ranges (QAT from loaded encodings).
            allow_overwrite: if given, whether a later ``compute_encodings`` may overwrite them.

        Nothing is changed unless the whole file is valid. Raises ValueError
        naming the entry for malformed content; loading never executes code.
        """
        encodings_io.load_encodings(self, encodings, strict=strict, partial=partial, requires_grad=requires_grad,
                                    allow_overwrite=allow_overwrite)

    def fold_param_quantizers(self) -> None:
        """Replace each quantized parameter by its fake-quantized value and remove its quantizer.

        The model then computes the same outputs with less work per forward
        (weights are on the grid already). Uninitialised parameter quantizers raise RuntimeError.
        """
        construction.fold_params(self.quantized_modules(), "run compute_encodings()")

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
        """Write the files AIMET's ``sim.export`` writes, in ``path`` (which must exist):

        * ``<prefix>.onnx``: the graph, with standard QuantizeLinear/DequantizeLinear nodes for every
          quantizer (``qdq=False``: the float graph, as AIMET writes it, for toolchains that read the
          encodings file instead); weights can be stored pre-quantized. Opset: torch's default (20, as
          AIMET's export) or higher where a quantizer needs it (21 for int4/int16/blocks), or ``opset``.
        * ``<prefix>.encodings``: AIMET's ``encoding_version`` format (``"0.6.1"``, ``"1.0.0"``,
          ``"2.0.0"``, ``"2.1.0"``) keyed by the graph's tensor names, which are the names ``torch.onnx``
          gives them (``"/relu1/Relu_output_0"``; weights by ``state_dict`` name), as in AIMET's file.
        * ``<prefix>_torch.encodings``: keyed by module name → input/output index (and parameter name),
          what AIMET's ``QuantizationSimModel.load_encodings`` reads (0.6.1 entries under version
          ``encoding_version``; ``"1.0.0"`` for a 2.x export, which AIMET writes no such file for).

        :meth:`load_encodings` reads either encodings file back. The three files are written atomically
        together. Needs the ``onnx`` extra (``pip install 'quanta[onnx]'``).

        Returns ``{quantizer name: ONNX tensor name}`` (the first, for a quantizer called twice).
        """
        from quanta.export.encodings import EncodingsVersion
        from quanta.export.onnx import TORCH_DEFAULT_OPSET, export_onnx_model
        from quanta.export.sim_encodings import export_encodings, export_torch_encodings, tensor_names

        if not isinstance(filename_prefix, str) or not filename_prefix or os.sep in filename_prefix:
            raise ValueError(f"filename_prefix must be a non-empty file name without '{os.sep}', "
                             f"got {filename_prefix!r}")
        directory = os.fspath(path)
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"export directory does not exist: {directory}")
        version = EncodingsVersion.parse(encoding_version)
        exported = export_onnx_model(self, dummy_input, qdq=qdq, prequantize_weights=prequantize_weights,
                                     opset=opset, min_opset=TORCH_DEFAULT_OPSET)
        slot_of = {q: t for t, q in tensor_names(self).items()}
        onnx_names = {slot_of[q]: ts for q, ts in exported.tensors.items() if q in slot_of}
        # the files are written under temporary names first and renamed together at the end, so a failure
        # in any leaves the previous set as it was (never a new graph beside old encodings)
        files = [f"{filename_prefix}.onnx", f"{filename_prefix}.encodings", f"{filename_prefix}_torch.encodings"]
        finals = [os.path.join(directory, f) for f in files]
        temps = [os.path.join(directory, f".{f}.quanta-partial") for f in files]
        try:
            exported.save(temps[0])
            export_encodings(self, temps[1], version, tensors=onnx_names)
            export_torch_encodings(self, temps[2], EncodingsVersion.V1_0_0 if version.is_2x else version)
            for tmp, final in zip(temps, finals):
                os.replace(tmp, final)
        finally:
            for tmp in temps:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return exported.names()

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
def _deepcopy(model: nn.Module) -> nn.Module:
    """``copy.deepcopy`` without torch's own deprecation notice from copying a torch.export graph module's
    pytree specs (``isinstance(treespec, LeafSpec)``), which the user can do nothing about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        return copy.deepcopy(model)


from quanta.quantsim.report import LayerSQNRReport  # noqa: E402  (type used in an annotation above)
