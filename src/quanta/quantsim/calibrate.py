"""Calibration of a simulated model: its quantizers observe forward passes, then compute their encodings.

Two ways (the methods of :class:`~quanta.quantsim.QuantizationSimModel` call these):

* :func:`compute_encodings`: every quantizer observes the forward passes of a callback (or of a list of
  batches) at once; the activations run in float meanwhile (the quantizers in ``passthrough`` observe their
  inputs and hand them on unchanged; the parameters are quantized), as in AIMET 2.42.
* :func:`compute_encodings_sequential`: the captured graph runs one node at a time over all batches, so each
  op is calibrated on the outputs of the already-quantized ops before it.

>>> import torch
>>> from quanta.quantization.affine import QuantizeDequantize
>>> q = QuantizeDequantize((), 8, symmetric=False)
>>> compute_encodings(q, [("q", q)], [torch.arange(-2.0, 6.0)], progress=False)   # the model is q itself
>>> round(float(q.get_encodings().scale.detach()) * 255, 4)   # the range [-2, 5] over 255 steps
7.0
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import fx, nn

from quanta._inputs import call_model, split_batch
from quanta._text import shortlist as _shortlist
from quanta.nn import QuantizationMixin
from quanta.nn.base import eval_mode
from quanta.quantization.base import QuantizerBase
from quanta.quantsim.capture import flat_inputs
from quanta._progress import make_bar, progress_bar

__all__ = ["NO_ARGS", "compute_encodings", "compute_encodings_sequential", "run_node"]

#: ``forward_pass_callback_args`` not given (None is a value a callback may take)
NO_ARGS: Any = object()


def compute_encodings(
    model: nn.Module,
    quantizers: Iterable[tuple[str, QuantizerBase]],
    forward_pass_callback: Callable[..., Any] | Iterable[Any],
    forward_pass_callback_args: Any = NO_ARGS,
    *,
    progress: bool = True,
    total: int | None = None,
    passthrough: Iterable[QuantizerBase] = (),
) -> None:
    """Calibrate ``quantizers`` (``(name, quantizer)`` pairs of ``model``) on the forward passes of
    ``forward_pass_callback``: ``fn(model)``, ``fn(model, args)``, or ``model(batch)`` for each of an iterable
    of batches (see :meth:`quanta.quantsim.QuantizationSimModel.compute_encodings`).

    ``model`` runs in eval mode under ``torch.no_grad()``. The quantizers in ``passthrough`` (a sim's
    activation quantizers) return their input unchanged meanwhile; the others quantize with the batch's own
    range. Quantizers that saw no input keep their encoding and are named in one RuntimeWarning."""
    run = _forward_runner(forward_pass_callback, forward_pass_callback_args)
    if total is None and not callable(forward_pass_callback):
        total = len(forward_pass_callback) if hasattr(forward_pass_callback, "__len__") else None  # type: ignore[arg-type]
    quantizers = list(quantizers)
    seen: set[int] = set()
    hooks = [q.register_forward_pre_hook(lambda m, args: seen.add(id(m))) for _, q in quantizers]
    hooks += [q.register_forward_hook(lambda m, args, out: args[0]) for q in {id(q): q for q in passthrough}.values()]
    try:
        # catch_warnings outermost: the quantizers' own "no input was seen" warnings fire on exit of the stack
        with warnings.catch_warnings(record=True) as caught, contextlib.ExitStack() as stack:
            warnings.simplefilter("always")
            stack.enter_context(_eval_no_grad(model))
            stack.enter_context(progress_bar(model, total, enabled=progress, desc="compute_encodings"))
            for _, q in quantizers:
                stack.enter_context(q.compute_encodings())
            run(model)
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
            stacklevel=3,  # the caller of sim.compute_encodings
        )


def _forward_runner(fn: Any, args: Any) -> Callable[[nn.Module], None]:
    if callable(fn) and not isinstance(fn, nn.Module):
        if args is NO_ARGS:
            return lambda model: fn(model)
        return lambda model: fn(model, args)
    if args is not NO_ARGS:
        raise TypeError("forward_pass_callback_args needs a callable forward_pass_callback")
    if isinstance(fn, (torch.Tensor, nn.Module, str, bytes)) or not isinstance(fn, Iterable):
        raise TypeError(
            "forward_pass_callback must be a callable fn(model) / fn(model, args), or an iterable of inputs; "
            f"got {type(fn).__name__}"
        )

    def run(model: nn.Module) -> None:
        for batch in fn:
            call_model(model, batch)
    return run


def compute_encodings_sequential(model: nn.Module, graph: fx.Graph, batches: Iterable[Any], *,
                                 progress: bool = True) -> None:
    """Calibrate the quantized modules of ``model`` layer by layer on ``batches``, running ``graph`` (the
    graph ``model`` was captured as) one node at a time (see
    :meth:`quanta.quantsim.QuantizationSimModel.compute_encodings_sequential`).

    A quantized module first observes its inputs for every batch, computes its encodings, then produces its
    quantized outputs (one that quantizes its inputs, such as the first op reading a model input, calibrates
    those first, then its outputs on the quantized inputs); a value is dropped as soon as its last user has
    run."""
    inputs = []
    for b, batch in enumerate(batches):
        args, kwargs = split_batch(batch)
        try:
            inputs.append(flat_inputs(model, args, kwargs))  # type: ignore[arg-type]
        except TypeError as e:
            raise TypeError(f"batch {b} does not fit the model's inputs: {e}") from None
    if not inputs:
        raise ValueError("batches is empty")
    modules = dict(model.named_modules())
    nodes = list(graph.nodes)
    last_use = {}
    for i, node in enumerate(nodes):
        for a in node.all_input_nodes:
            last_use[a] = i
    envs: list[dict[fx.Node, Any]] = [{} for _ in inputs]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    with _eval_no_grad(model), _bar(len(nodes), progress) as advance:
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
                if isinstance(module, QuantizationMixin) and sites[node.target] == 1 and any(
                        q is not None for q in module.input_quantizers):
                    _calibrate_inputs_first(model, node, module, envs)
                elif isinstance(module, QuantizationMixin):
                    visits[node.target] += 1
                    if node.target not in calibrating:
                        stack = calibrating[node.target] = open_calibrations.enter_context(contextlib.ExitStack())
                        stack.enter_context(module.compute_encodings())
                    if visits[node.target] == sites[node.target]:  # last site: finish, then run calibrated
                        for env in envs:
                            run_node(model, node, env)
                        calibrating.pop(node.target).close()
                for env in envs:
                    env[node] = run_node(model, node, env)
                for a in node.all_input_nodes:
                    if last_use.get(a) == i:
                        for env in envs:
                            env.pop(a, None)
                advance()


def _calibrate_inputs_first(model: nn.Module, node: fx.Node, module: QuantizationMixin,
                            envs: list[dict[fx.Node, Any]]) -> None:
    """Calibrate a module that quantizes its inputs in two passes over the batches: its input quantizers
    first (on every batch), then its other quantizers on inputs quantized with those final encodings, so its
    output statistics do not depend on how the data is split into batches."""
    with module.compute_encodings():
        for env in envs:
            run_node(model, node, env)
    inputs = {id(q) for q in module.input_quantizers if q is not None}
    with contextlib.ExitStack() as stack:
        for q in module._quantizers():
            if id(q) not in inputs:
                stack.enter_context(q.compute_encodings())
        for env in envs:
            run_node(model, node, env)


@contextlib.contextmanager
def _eval_no_grad(model: nn.Module) -> Iterator[None]:
    with eval_mode(model), torch.no_grad():
        yield


@contextlib.contextmanager
def _bar(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    bar = make_bar(total, enabled=enabled, desc="sequential calibration")
    try:
        yield bar.advance
    finally:
        bar.close()


def run_node(root: nn.Module, node: fx.Node, env: dict[fx.Node, Any]) -> Any:
    """Run one node of ``root``'s graph on the values in ``env`` (by node); returns its value."""
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
