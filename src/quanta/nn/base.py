"""QuantizationMixin: what every quantized module of :mod:`quanta.nn` shares.

A quantized module subclasses its float module and adds three containers of
quantizers (AIMET v2 layout):

* ``input_quantizers`` (``nn.ModuleList``, one entry per tensor input),
* ``output_quantizers`` (``nn.ModuleList``, one entry per output),
* ``param_quantizers`` (``nn.ModuleDict`` keyed by parameter name).

An entry that is ``None`` is disabled: that tensor passes through untouched.
Its forward computes ``QDQ_out(op(QDQ_in(x), QDQ_w(w), ...))`` with the float
op, where each ``QDQ`` is a quantizer module from :mod:`quanta.quantization`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from quanta._snapshot import Snapshot
from quanta.quantization.affine import QuantizeDequantize
from quanta.tensors.quantized import DequantizedTensor

__all__ = ["QuantizationMixin", "default_activation_quantizer", "default_weight_quantizer", "eval_mode", "plain",
           "qdq", "quantizers_off"]


def default_weight_quantizer(weight: torch.Tensor, axis: int = 0) -> QuantizeDequantize:
    """Signed symmetric 8-bit quantizer with one scale per index of ``weight``'s dimension ``axis``.

    >>> default_weight_quantizer(torch.empty(4, 3, 2, 2))
    QuantizeDequantize(shape=(4, 1, 1, 1), qmin=-128, qmax=127, symmetric=True)
    """
    shape = [1] * weight.dim()
    shape[axis] = weight.shape[axis]
    return QuantizeDequantize(shape=tuple(shape), bitwidth=8, symmetric=True)


def default_activation_quantizer() -> QuantizeDequantize:
    """Per-tensor asymmetric 8-bit quantizer (``shape=()``, grid ``[0, 255]``).

    >>> default_activation_quantizer()
    QuantizeDequantize(shape=(), qmin=0, qmax=255, symmetric=False)
    """
    return QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)


def _float_base(cls: type) -> type:
    for c in cls.__mro__:
        if issubclass(c, nn.Module) and not issubclass(c, QuantizationMixin):
            return c
    raise TypeError(f"{cls.__name__} must also subclass a torch.nn.Module")  # pragma: no cover


def _parametrized_names(module: nn.Module) -> list[str]:
    """Names of ``module``'s tensors computed by ``torch.nn.utils.parametrize`` (``weight_norm``'s ``weight``)."""
    return list(module.parametrizations) if parametrize.is_parametrized(module) else []


_PARAMETRIZED_CLASSES: dict[tuple[type, type], type] = {}


def _parametrized_class(qcls: type, float_cls: type) -> type:
    """``qcls`` with the properties torch's parametrization gave ``float_cls`` (``ParametrizedConv1d``): the
    quantized module computes its parametrized tensors from the same ``parametrizations``."""
    key = (qcls, float_cls)
    if key not in _PARAMETRIZED_CLASSES:
        _PARAMETRIZED_CLASSES[key] = type(f"Parametrized{qcls.__name__}", (qcls,), _class_dict(float_cls))
    return _PARAMETRIZED_CLASSES[key]


def _class_dict(cls: type) -> dict[str, Any]:
    return {k: v for k, v in vars(cls).items()
            if k not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__")}


def remove_parametrization(module: nn.Module, name: str) -> None:
    """Make ``module``'s parametrized tensor ``name`` a plain parameter holding its current values
    (``torch.nn.utils.parametrize.remove_parametrizations(..., leave_parametrized=True)``), touching no other
    module.

    torch's function deletes the tensor's property from the module's class, and a deep copy shares that class
    with its original (so removing it on a copy would break the original): the module gets a class of its own
    first."""
    cls = type(module)
    module.__class__ = type(cls.__name__, cls.__bases__, _class_dict(cls))
    parametrize.remove_parametrizations(module, name, leave_parametrized=True)


def assign_parameter(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Give ``module``'s parameter ``name`` the values ``value``, in place; a parametrized tensor (weight norm)
    through its parametrization's ``right_inverse``. Raises ValueError when the parametrization cannot take a
    value back (it has no ``right_inverse``)."""
    with torch.no_grad():
        if name in _parametrized_names(module):
            try:
                setattr(module, name, value.detach().clone())  # parametrize: right_inverse sets the originals
            except NotImplementedError:
                raise ValueError(f"{type(module).__name__}.{name} is computed by a parametrization without "
                                 "right_inverse; its values cannot be set") from None
        else:
            getattr(module, name).copy_(value)


def qdq(quantizer: nn.Module | None, x: Any) -> Any:
    """Apply ``quantizer`` to ``x``; ``None`` (disabled) or a non-tensor ``x`` passes through."""
    if quantizer is None or not isinstance(x, torch.Tensor):
        return x
    return quantizer(x)


def plain(x: Any) -> Any:
    """A :class:`DequantizedTensor` as a plain ``torch.Tensor`` (same values, autograd kept); anything else as is.

    Inside a module the op only needs the values: a plain tensor skips the
    subclass's ``__torch_function__`` on every op (several µs each).
    """
    if type(x) is DequantizedTensor:
        return x.as_subclass(torch.Tensor)
    return x


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` inside the block; on exit every submodule gets back its own train/eval flag
    (``model.train(old)`` would set one flag for all, un-freezing a deliberately frozen BatchNorm)."""
    modes = {m: m.training for m in model.modules()}
    try:
        model.eval()
    except NotImplementedError:  # a torch.export program's module refuses eval(): set the flags one by one
        for m in modes:
            m.training = False
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


@contextlib.contextmanager
def quantizers_off(modules: Iterable[QuantizationMixin], *, params: bool = True,
                   activations: bool = True) -> Iterator[None]:
    """Every quantizer slot of ``modules`` is None inside the block (they run in float); restored on exit.
    ``params=False`` leaves the parameter quantizers on (activations in float, weights quantized);
    ``activations=False`` leaves the input and output quantizers on (weights in float)."""
    saved = [(m, list(m.input_quantizers), list(m.output_quantizers), dict(m.param_quantizers.items()))
             for m in modules]
    try:
        for m, ins, outs, pq in saved:
            _set_slots(m, [None] * len(ins) if activations else ins, [None] * len(outs) if activations else outs,
                       dict.fromkeys(pq) if params else pq)
        yield
    finally:
        for m, ins, outs, pq in saved:
            _set_slots(m, ins, outs, pq)


def _set_slots(m: QuantizationMixin, ins: list, outs: list, params: dict) -> None:
    for i, q in enumerate(ins):
        m.input_quantizers[i] = q
    for i, q in enumerate(outs):
        m.output_quantizers[i] = q
    for k, q in params.items():
        m.param_quantizers[k] = q


def _slot(module: nn.Module, container: str, i: int) -> nn.Module | None:
    """``module.<container>[i]`` for an ``nn.ModuleList`` container, by plain dict lookups on the hot path
    (``nn.Module.__getattr__`` and ``ModuleList.__getitem__`` cost about a microsecond together)."""
    try:
        return module._modules[container]._modules[str(i)]
    except KeyError:  # a negative index, or out of range
        return getattr(module, container)[i]  # raises what indexing raises


class _CachedParam:
    """A fake-quantized parameter and what it was computed from (see :meth:`QuantizationMixin._qparam`)."""

    __slots__ = ("param", "version", "ptr", "dtype", "shape", "quantizer", "state", "value")

    def __init__(self, p: torch.Tensor, q: nn.Module, value: torch.Tensor) -> None:
        self.param, self.version, self.ptr, self.dtype, self.shape = p, p._version, p.data_ptr(), p.dtype, p.shape
        self.quantizer, self.state, self.value = q, Snapshot(q), value

    def valid_for(self, p: torch.Tensor, q: nn.Module) -> bool:
        # the same tensor, unchanged by in-place ops; the same quantizer, its tensors holding the same bytes
        return (p is self.param and p._version == self.version and p.data_ptr() == self.ptr and p.dtype == self.dtype
                and p.shape == self.shape and q is self.quantizer and self.state.unchanged())


class QuantizationMixin:
    """Mixin placed before the float class: ``class QuantizedLinear(QuantizationMixin, nn.Linear)``.

    Subclasses set ``num_inputs``/``num_outputs`` (how many quantizer slots) and
    may override :meth:`_init_quantizers` to choose the defaults. Building one
    from a float module shares its parameters, buffers and config:

    >>> import quanta.nn
    >>> lin = torch.nn.Linear(4, 3)
    >>> qlin = quanta.nn.QuantizedLinear.from_module(lin)
    >>> qlin.weight is lin.weight, isinstance(qlin, torch.nn.Linear)
    (True, True)
    >>> with qlin.compute_encodings():
    ...     _ = qlin(torch.randn(8, 4))
    >>> qlin(torch.randn(2, 4)).shape
    torch.Size([2, 3])
    """

    num_inputs: int = 1
    num_outputs: int = 1
    #: return plain tensors instead of DequantizedTensors (QuantizationSimModel sets it: faster downstream ops)
    plain_outputs: bool = False
    input_quantizers: nn.ModuleList
    output_quantizers: nn.ModuleList
    param_quantizers: nn.ModuleDict

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_quantizers()

    # -- defaults ------------------------------------------------------------------
    def _init_quantizers(self) -> None:
        """Defaults: inputs off, outputs per-tensor asymmetric 8-bit, ``weight`` per output channel, rest off."""
        self.input_quantizers = nn.ModuleList([None] * self.num_inputs)
        self.output_quantizers = nn.ModuleList([default_activation_quantizer() for _ in range(self.num_outputs)])
        params: dict[str, nn.Module | None] = {}
        named = [*self.named_parameters(recurse=False),  # type: ignore[attr-defined]
                 *((n, getattr(self, n)) for n in _parametrized_names(self))]  # weight norm's computed weight
        for name, p in named:
            params[name] = default_weight_quantizer(p, self._weight_axis()) if name == "weight" else None
        self.param_quantizers = nn.ModuleDict(params)

    def to_float_module(self) -> nn.Module:
        """The float module this one quantizes (AIMET's ``get_original_module``): the same parameters
        and buffers, no quantizers. Quantized children (``MultiheadAttention.out_proj``) become float too.

        >>> import quanta.nn
        >>> lin = torch.nn.Linear(4, 3)
        >>> back = quanta.nn.QuantizedLinear.from_module(lin).to_float_module()
        >>> type(back).__name__, back.weight is lin.weight
        ('Linear', True)
        """
        parametrized = self.__dict__.get("_parametrized_float_class") if _parametrized_names(self) else None
        base = parametrized or _float_base(type(self))  # None once the parametrizations are removed (folded)
        module = base.__new__(base)
        skip = {"_qparam_cache", "plain_outputs", "_parametrized_float_class"}
        module.__dict__.update({k: (v.copy() if isinstance(v, (dict, set)) else v)
                                for k, v in self.__dict__.items() if k not in skip})
        for name in ("input_quantizers", "output_quantizers", "param_quantizers"):
            module._modules.pop(name, None)
        for name, child in list(module._modules.items()):
            if isinstance(child, QuantizationMixin):
                module._modules[name] = child.to_float_module()
        return module

    def _weight_axis(self) -> int:
        """Output-channel dimension of ``weight`` (0, or 1 for transposed convolutions)."""
        return 0

    # -- construction --------------------------------------------------------------
    @classmethod
    def from_module(cls, module: nn.Module) -> QuantizationMixin:
        """A quantized module that shares ``module``'s parameters and buffers and copies its config.

        Raises TypeError if ``module`` is not an instance of this class's float
        module (or is already quantized).
        """
        base = _float_base(cls)
        if not isinstance(module, base) or isinstance(module, QuantizationMixin):
            raise TypeError(
                f"{cls.__name__}.from_module() needs a {base.__module__}.{base.__qualname__}, "
                f"got {type(module).__module__}.{type(module).__qualname__}"
            )
        parametrized = bool(_parametrized_names(module))
        qcls = _parametrized_class(cls, type(module)) if parametrized else cls
        qmodule = qcls.__new__(qcls)
        # Shallow copy: same Parameter/buffer objects, own dicts so adding quantizers leaves `module` alone.
        qmodule.__dict__.update(
            {k: (v.copy() if isinstance(v, (dict, set)) else v) for k, v in module.__dict__.items()}
        )
        if parametrized:
            qmodule._parametrized_float_class = type(module)
        qmodule._init_quantizers()
        device = next((t.device for t in module.parameters(recurse=False)), None)
        if device is not None:
            for q in qmodule._quantizers():
                q.to(device)
        return qmodule

    # -- calibration ---------------------------------------------------------------
    def _quantizers(self) -> Iterator[nn.Module]:
        """Each quantizer of the module once (one object may fill several slots: a shared encoding)."""
        seen: set[int] = set()
        for q in (*self.input_quantizers, *self.output_quantizers, *self.param_quantizers.values()):
            if q is not None and id(q) not in seen:
                seen.add(id(q))
                yield q

    @contextlib.contextmanager
    def compute_encodings(self) -> Iterator[None]:
        """Calibrate every quantizer of this module on the forward calls made inside the ``with`` block."""
        with contextlib.ExitStack() as stack:
            for q in self._quantizers():
                stack.enter_context(q.compute_encodings())
            yield

    # -- helpers for forward ---------------------------------------------------------
    def _qparam(self, name: str) -> torch.Tensor | None:
        """Parameter ``name`` after its quantizer (if any), as a plain tensor; None if there is no such parameter.

        In eval mode without autograd (``model.eval()`` under ``torch.no_grad()``),
        the fake-quantized parameter is computed once and reused while the
        quantizer's tensors hold the same values and the parameter is the same
        tensor, unchanged by in-place ops (its version counter), so an inference
        forward costs no weight quantization. The cache holds one copy of each
        quantized parameter; training mode never uses it and ``train()``/``eval()``
        clear it. The one change it cannot see is an in-place write through
        ``param.data`` (which bypasses version counters) made while in eval mode:
        call ``module.eval()`` again after such a write. Under ``torch.compile`` / ``torch.export``
        the cache is not used (its key is tensor data): the quantizer runs inside the graph.
        """
        params = self._parameters  # plain dict lookups: nn.Module.__getattr__ costs ~0.5 µs a call
        p = params[name] if name in params else getattr(self, name)
        if p is None:
            return None
        q = self._modules["param_quantizers"]._modules.get(name)
        if q is None or not isinstance(p, torch.Tensor):
            return p
        return self._cached_qdq(name, p, q)

    def _cached_qdq(self, key: str | int, p: torch.Tensor, q: nn.Module) -> torch.Tensor:
        """``plain(q(p))`` for a parameter ``p``; in eval mode without autograd, the last value computed under
        ``key`` while it is still valid (see :meth:`_qparam`)."""
        if (self.training or torch.is_grad_enabled() or getattr(q, "_calibrating", False)
                or torch.compiler.is_compiling()):
            return plain(q(p))
        cache = self.__dict__.setdefault("_qparam_cache", {})
        hit = cache.get(key)
        if hit is not None and hit.valid_for(p, q):
            return hit.value
        value = plain(q(p))
        cache[key] = _CachedParam(p, q, value)
        return value

    def train(self, mode: bool = True):  # type: ignore[override]
        """``nn.Module.train``; also drops the eval-mode cache of fake-quantized parameters."""
        self.__dict__.pop("_qparam_cache", None)
        return super().train(mode)  # type: ignore[misc]

    def _apply(self, fn, recurse=True):  # type: ignore[override]
        # .to()/.double()/.half() replace parameter data in place (same tensor object): drop the cache
        self.__dict__.pop("_qparam_cache", None)
        return super()._apply(fn, recurse)  # type: ignore[misc]

    def _qinput(self, i: int, x: Any) -> Any:
        """``x`` after input quantizer ``i``, as a plain tensor. A parameter given as an input (a model's
        constant, e.g. a captured graph's ``get_attr``) is cached as :meth:`_qparam` caches parameters."""
        q = _slot(self, "input_quantizers", i)
        if q is not None and type(x) is nn.Parameter:
            return self._cached_qdq(i, x, q)
        return plain(qdq(q, x))

    def _qoutput(self, y: Any, i: int = 0, *, owned: bool = False) -> Any:
        """``y`` after output quantizer ``i``; ``owned``: ``y`` is a fresh op output that nothing else refers to.

        An owned output of a module that hands plain tensors on (``plain_outputs``)
        is fake-quantized in place when autograd is off (one allocation and one
        pass over memory fewer per quantizer at inference); not while compiling
        or exporting, where the out-of-place op gives the same bits.
        """
        q = _slot(self, "output_quantizers", i)
        if owned and self.plain_outputs and q is not None and getattr(q, "_qdq_owned", None) is not None \
                and not torch.compiler.is_compiling():
            out = q._qdq_owned(y)
            if out is not None:
                return out
        y = qdq(q, y)
        return plain(y) if self.plain_outputs else y

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # type: ignore[misc]
        state.pop("_qparam_cache", None)  # derived data: rebuilt on first use
        return state
