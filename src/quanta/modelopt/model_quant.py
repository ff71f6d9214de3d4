"""ModelOpt's model-level API: ``quantize``, ``calibrate``, wildcard enable/disable, ``print_quant_summary``,
``fold_weight``.

>>> import torch
>>> import quanta.modelopt as mtq
>>> model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
>>> data = [torch.randn(4, 16) for _ in range(3)]
>>> def forward_loop(m):
...     for x in data:
...         m(x)
>>> model = mtq.quantize(model, mtq.INT8_DEFAULT_CFG, forward_loop)
>>> model[0].weight_quantizer
TensorQuantizer(8 bit fake axis=0 amax=[...](8) calibrator=MaxCalibrator quant)
>>> mtq.disable_quantizer(model, "*input_quantizer")
>>> model[2].input_quantizer
TensorQuantizer(disabled)
"""

from __future__ import annotations

import fnmatch
import inspect
import os
from typing import Any, Callable, Optional, Union

from torch import nn

from quanta.modelopt.algorithms import alpha_of, awq_clip, awq_lite, finish_smoothquant, smoothquant_layers
from quanta.modelopt.config import QuantizerAttributeConfig, check_config, normalize_quant_cfg_list
from quanta.modelopt.modules import convert, fold_weight, is_quantized, quantizers, registered_class
from quanta.modelopt.tensor_quantizer import SequentialQuantizer, TensorQuantizer

__all__ = ["quantize", "calibrate", "set_quantizer_by_cfg", "set_quantizer_attribute", "disable_quantizer",
           "enable_quantizer", "print_quant_summary", "fold_weight", "is_quantized"]

ForwardLoop = Callable[[nn.Module], Any]
_ALGORITHMS_ELSEWHERE = ("mse", "local_hessian", "gptq",
                         "svdquant")


def _matcher(wildcard_or_filter: Union[str, Callable[[str], bool]], parent: Optional[type], model: nn.Module):
    if not isinstance(wildcard_or_filter, str) and not callable(wildcard_or_filter):
        raise TypeError(f"expected a wildcard string or a filter function name -> bool, got {wildcard_or_filter!r}")

    def match(name: str, _module: nn.Module) -> bool:
        ok = fnmatch.fnmatch(name, wildcard_or_filter) if isinstance(wildcard_or_filter, str) \
            else bool(wildcard_or_filter(name))
        return ok and (parent is None or isinstance(model.get_submodule(name.rpartition(".")[0]), parent))

    return match


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(model.get_submodule(owner), attr, new)


def set_quantizer_by_cfg(model: nn.Module, quant_cfg: Any) -> None:
    """Apply ``quant_cfg`` entries in order to the quantizers of ``model`` (see :mod:`quanta.modelopt.config`)."""
    for entry in normalize_quant_cfg_list(quant_cfg):
        parent = registered_class(entry["parent_class"]) if entry["parent_class"] else None
        match = _matcher(entry["quantizer_name"], parent, model)
        cfg, enable = entry["cfg"], entry["enable"]
        for name, q in list(quantizers(model, match)):
            if cfg is None:
                (q.enable if enable else q.disable)()
            elif isinstance(cfg, list):
                seq = SequentialQuantizer(*(TensorQuantizer() for _ in cfg))
                seq.set_from_attribute_config([QuantizerAttributeConfig(**{**c, "enable": enable}) for c in cfg])
                _replace(model, name, seq)
            else:
                if isinstance(q, SequentialQuantizer):
                    q = TensorQuantizer()
                    _replace(model, name, q)
                q.set_from_attribute_config(QuantizerAttributeConfig(**{**cfg, "enable": enable}))


def set_quantizer_attribute(model: nn.Module, wildcard_or_filter: Union[str, Callable[[str], bool]],
                            attribute: dict) -> None:
    """Update the attributes ``attribute`` names (a partial dict) of the matching quantizers."""
    for _, q in quantizers(model, _matcher(wildcard_or_filter, None, model)):
        for t in (q if isinstance(q, SequentialQuantizer) else [q]):
            t.set_from_attribute_config(attribute)


def disable_quantizer(model: nn.Module, wildcard_or_filter: Union[str, Callable[[str], bool]]) -> None:
    """Disable the quantizers whose names match (``"*lm_head*"``, or a function of the name)."""
    for _, q in quantizers(model, _matcher(wildcard_or_filter, None, model)):
        q.disable()


def enable_quantizer(model: nn.Module, wildcard_or_filter: Union[str, Callable[[str], bool]]) -> None:
    """Enable the quantizers whose names match."""
    for _, q in quantizers(model, _matcher(wildcard_or_filter, None, model)):
        q.enable()


def _leaves(model: nn.Module):
    for name, q in quantizers(model):
        if isinstance(q, TensorQuantizer):
            yield name, q


def _method(algorithm: Any) -> tuple[Optional[str], dict]:
    if algorithm is None or isinstance(algorithm, str):
        return algorithm, {}
    if isinstance(algorithm, dict) and isinstance(algorithm.get("method"), str):
        return algorithm["method"], {k: v for k, v in algorithm.items() if k != "method"}
    raise TypeError(f"algorithm must be None, a method name or {{'method': name, ...}}, got {algorithm!r}")


def _check_algorithm(algorithm: Any) -> Optional[str]:
    """The method name of ``algorithm`` if quanta.modelopt runs it (``"max"`` or None), else raise."""
    method, kwargs = _method(algorithm)
    if method in _ALGORITHMS_ELSEWHERE:
        raise NotImplementedError(
            f"calibration algorithm {method!r} is not in quanta.modelopt yet; use 'max', 'smoothquant', "
            "'awq_lite', 'awq_clip' or 'awq_full' here, or quanta.quantization.quantize_ with GPTQConfig for real "
            "quantized weights")
    if method == "smoothquant":
        alpha_of(kwargs)
    elif method in ("awq_lite", "awq_clip", "awq_full"):
        _check_awq_kwargs(method, kwargs)
    elif method not in (None, "max") or kwargs:
        raise ValueError(f"unknown calibration algorithm {algorithm!r}; quanta.modelopt runs 'max', 'smoothquant' "
                         "(or None)")
    return method


def _stats_on(model: nn.Module) -> list[TensorQuantizer]:
    """Every enabled quantizer of ``model`` passes its input through unchanged and collects statistics."""
    active = [q for _, q in _leaves(model) if q.is_enabled]
    for q in active:
        q.disable_quant()
        q.enable_calib()
    return active


def _stats_off(active: list[TensorQuantizer]) -> None:
    """Back to quantizing; each static quantizer whose calibrator saw data takes its amax (dynamic ones take it
    from every input; MX blocks have none)."""
    for q in active:
        q.disable_calib()
        q.enable_quant()
        mx = q._dynamic_block is not None and tuple(q._dynamic_block.get("scale_bits", ())) == (8, 0)
        if not q._dynamic and not mx:
            q.load_calib_amax(strict=False)


def _run(forward_loop: ForwardLoop, model: nn.Module) -> None:
    if len(inspect.signature(forward_loop).parameters) == 0:
        forward_loop()
    else:
        forward_loop(model)


def _max_calibrate(model: nn.Module, forward_loop: Optional[ForwardLoop]) -> None:
    """ModelOpt's "max": every weight is collected, then what ``forward_loop`` runs, all in float."""
    active = _stats_on(model)
    try:
        for m in model.modules():  # every weight, whether or not forward_loop reaches its layer
            if hasattr(m, "iter_weights_for_calibration"):
                for w, q in m.iter_weights_for_calibration():
                    q(w)
        if forward_loop is not None:
            _run(forward_loop, model)
    finally:
        _stats_off(active)


_CLIP_KEYS = ("max_co_batch_size", "max_tokens_per_batch", "min_clip_ratio", "shrink_step")


def _check_awq_kwargs(method: str, kwargs: dict) -> None:
    allowed = {"awq_lite": ("alpha_step", "debug"), "awq_clip": (*_CLIP_KEYS, "debug"),
               "awq_full": ("alpha_step", *_CLIP_KEYS, "debug")}[method]
    unknown = set(kwargs) - set(allowed)
    if unknown:
        raise ValueError(f"{method} takes {sorted(set(allowed) - {'debug'})}, got {sorted(unknown)}")


def _awq(model: nn.Module, forward_loop: ForwardLoop, method: str, kwargs: dict) -> None:
    _check_awq_kwargs(method, kwargs)
    loop = lambda m: _run(forward_loop, m)  # noqa: E731
    # a SequentialQuantizer (W4A8: int4 then fp8) searches with its first quantizer, as ModelOpt's
    sequential = [(name, q) for name, q in quantizers(model) if isinstance(q, SequentialQuantizer)]
    for name, q in sequential:
        _replace(model, name, q[0])
    try:
        if method in ("awq_lite", "awq_full"):
            awq_lite(model, loop, kwargs.get("alpha_step", 0.1), _stats_on, _stats_off, _max_calibrate)
        if method in ("awq_clip", "awq_full"):
            awq_clip(model, loop, _stats_on, _stats_off, _max_calibrate,
                     **{k: kwargs[k] for k in _CLIP_KEYS if k in kwargs})
    finally:
        for name, q in sequential:
            _replace(model, name, q)
    for name, _ in sequential:
        owner = model.get_submodule(name.rpartition(".")[0])
        _max_calibrate(owner, lambda m: m.weight_quantizer(m.weight))


def calibrate(model: nn.Module, algorithm: Any = "max", forward_loop: Optional[ForwardLoop] = None) -> nn.Module:
    """Calibrate the quantizers of ``model`` by ``algorithm``.

    ``"max"``: every static quantizer's amax from the weights and from what ``forward_loop(model)`` runs through
    the model (in float: quantization is off meanwhile). ``"smoothquant"`` (``{"method": "smoothquant",
    "alpha": a}``): SmoothQuant on the int8 Linear layers (:mod:`quanta.modelopt.algorithms`), then "max".
    ``"awq_lite"`` (``{"method": "awq_lite", "alpha_step": 0.1}``): AWQ's scale search on the Linear layers;
    ``"awq_clip"`` (``max_co_batch_size``, ``max_tokens_per_batch``, ``min_clip_ratio``, ``shrink_step``): the
    search of each weight block's clipping ratio; ``"awq_full"``: both. ``None`` does nothing. ModelOpt's other
    algorithms (``"mse"``, ``"gptq"``...) raise ``NotImplementedError``: quanta runs GPTQ through
    ``quanta.quantization.quantize_`` (``GPTQConfig``) on real quantized weights.
    """
    method = _check_algorithm(algorithm)
    if method is None:
        return model
    if forward_loop is not None and not callable(forward_loop):
        raise TypeError(f"forward_loop must be a callable taking the model, got {forward_loop!r}")
    training = model.training
    model.eval()
    try:
        if method in ("awq_lite", "awq_clip", "awq_full"):
            if forward_loop is None:
                raise ValueError(f"{method} needs forward_loop (it searches on the activations)")
            _awq(model, forward_loop, method, _method(algorithm)[1])
        elif method == "smoothquant":
            if forward_loop is None:
                raise ValueError("smoothquant needs forward_loop (it calibrates on the activations)")
            alpha = alpha_of(_method(algorithm)[1])
            layers = smoothquant_layers(model)
            _max_calibrate(model, forward_loop)
            finish_smoothquant(layers, alpha, lambda m: _max_calibrate(m, lambda mm: mm.weight_quantizer(mm.weight)))
        else:
            _max_calibrate(model, forward_loop)
    finally:
        model.train(training)
    return model


def quantize(model: nn.Module, config: dict, forward_loop: Optional[ForwardLoop] = None) -> nn.Module:
    """Give ``model`` quantizers (in place), configure them by ``config["quant_cfg"]`` and calibrate them by
    ``config["algorithm"]`` with ``forward_loop``; returns ``model``.

    A model that already has quantizers is reconfigured and recalibrated. Bad configs raise before the model
    changes.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    entries, algorithm = check_config(config)
    method = _check_algorithm(algorithm)
    if method in ("smoothquant", "awq_lite", "awq_clip", "awq_full") and forward_loop is None:  # before any change
        raise ValueError(f"{method} needs forward_loop (it calibrates on the activations)")
    for e in entries:
        if e["parent_class"]:
            registered_class(e["parent_class"])
    if not is_quantized(model):
        convert(model)
    set_quantizer_by_cfg(model, entries)
    return calibrate(model, algorithm, forward_loop)


def print_quant_summary(model: nn.Module, output_dir: Optional[str] = None) -> None:
    """Print every quantizer of ``model`` with its settings (or write ``output_dir/.quant_summary.txt``)."""
    lines = [f"{name:80} {q}" for name, q in _leaves(model)]
    lines.append(f"{len(lines)} TensorQuantizers found in model")
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, ".quant_summary.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print(f"Quant summary saved to {path}")
    else:
        print("\n".join(lines))
