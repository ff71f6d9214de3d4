"""``auto_quantize``: a quantization format per layer, the most accurate choice under an effective-bits budget
(ModelOpt's ``mtq.auto_quantize``).

For every layer with a weight (``nn.Linear``, convolutions) and every candidate
format (plus "not quantized", 16 bits), a sensitivity score estimates how much
the loss grows if that layer alone takes that format:

* ``method="gradient"`` (default): ``sum((y_q - y)**2 * g**2)`` over the scoring batches, ``y`` the layer's
  float output, ``y_q`` its output with the format's input and weight quantizers, ``g`` the gradient of the
  loss with respect to ``y`` (the Fisher approximation ModelOpt uses); needs ``loss_func`` or
  ``forward_backward_step``.
* ``method="kl_div"``: the KL divergence between the model's float output distribution (softmax of
  ``forward_step``'s logits) and the one with that layer quantized; needs only ``forward_step``.

The search then minimises the summed score subject to
``sum(weight elements * bits) / sum(weight elements) <= effective_bits`` (the
multiple-choice knapsack, solved exactly by dynamic programming over the layers'
costs), and the chosen formats are applied and calibrated (``"max"``) on
``num_calib_steps`` batches.

>>> import torch
>>> import quanta.modelopt as mtq
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
>>> batches = [(torch.randn(16, 32), torch.randint(0, 8, (16,))) for _ in range(4)]
>>> model, state = mtq.auto_quantize(
...     model, constraints={"effective_bits": 6.0},
...     quantization_formats=["INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "INT8_DEFAULT_CFG"], data_loader=batches,
...     forward_step=lambda m, b: m(b[0]), loss_func=lambda out, b: torch.nn.functional.cross_entropy(out, b[1]))
>>> sorted(state["best"]["recipe"]), state["best"]["constraints"]["effective_bits"] <= 6.0
(['0', '2'], True)
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from quanta.modelopt.config import QuantizerAttributeConfig, check_config, choices
from quanta.modelopt.model_quant import calibrate, set_quantizer_by_cfg
from quanta.modelopt.modules import QuantModule, convert, is_quantized
from quanta.modelopt.tensor_quantizer import SequentialQuantizer, TensorQuantizer

__all__ = ["auto_quantize", "format_bits"]

_NONE = "NONE(16 bits)"
# entries of a format that act per layer; name-based exclusions such as "*lm_head*" do not (as in ModelOpt)
_PER_LAYER = ("*", "*weight_quantizer", "*input_quantizer", "*output_quantizer")


def format_bits(config: dict) -> float:
    """Bits per weight element of a format: the weight quantizer's ``effective_bits``, else its element bits plus
    the block scale's share (MX: 8 bits per 32; NVFP4: 8 per 16), else ``num_bits`` (``(E, M)``: ``1 + E + M``).

    >>> format_bits(choices["INT4_BLOCKWISE_WEIGHT_ONLY_CFG"]), format_bits(choices["MXFP4_DEFAULT_CFG"])
    (4.0, 4.25)
    """
    entries, _ = check_config(config)
    cfg = None
    for e in entries:
        if e["parent_class"] is None and fnmatch.fnmatch("layer.weight_quantizer", e["quantizer_name"]) \
                and e["cfg"] is not None:
            cfg = e["cfg"]
    if cfg is None:
        return 16.0
    first = cfg[0] if isinstance(cfg, list) else cfg
    a = QuantizerAttributeConfig(**first)
    if a.effective_bits is not None:
        return float(a.effective_bits)
    nb = a.num_bits
    bits = float(1 + nb[0] + nb[1]) if isinstance(nb, tuple) else float(nb)
    bs = a.block_sizes or {}
    if bs.get("type") == "dynamic":
        bits += 8 / bs.get(-1, 32)
    return bits


def _formats(quantization_formats: Optional[Iterable[Union[dict, str]]]) -> dict[str, dict]:
    if quantization_formats is None:
        quantization_formats = ["NVFP4_DEFAULT_CFG", "FP8_DEFAULT_CFG"]
    out: dict[str, dict] = {}
    for i, f in enumerate(quantization_formats):
        if isinstance(f, str):
            if f not in choices:
                raise ValueError(f"quantization_formats[{i}]: unknown format {f!r}; named formats: {sorted(choices)}")
            out[f] = choices[f]
        elif isinstance(f, dict):
            check_config(f)
            out[f"custom_{i}"] = f
        else:
            raise TypeError(f"quantization_formats[{i}] must be a config dict or a format name, got {f!r}")
    if not out:
        raise ValueError("quantization_formats must name at least one format")
    return out


def _per_layer_entries(config: dict) -> list[dict]:
    entries, _ = check_config(config)
    return [e for e in entries if e["parent_class"] is None and e["quantizer_name"] in _PER_LAYER]


def _apply(layer: nn.Module, entries: Optional[list[dict]]) -> None:
    """Configure ``layer``'s own quantizers with a format's per-layer entries (None: all off)."""
    if entries is None:
        for m in layer.children():
            if isinstance(m, (TensorQuantizer, SequentialQuantizer)):
                m.disable()
        return
    set_quantizer_by_cfg(layer, [{"quantizer_name": "*", "enable": False}, *entries])


def _layers(model: nn.Module, disabled: list[str]) -> dict[str, nn.Module]:
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, QuantModule) and hasattr(m, "weight_quantizer") and isinstance(m.weight_quantizer,
                                                                                        (TensorQuantizer,
                                                                                         SequentialQuantizer)):
            if not any(fnmatch.fnmatch(name, p) for p in disabled) and m.weight.dim() >= 2:
                out[name] = m
    return out


def _choose(scores: dict[str, list[float]], costs: dict[str, list[float]], budget: float) -> dict[str, int]:
    """Exact multiple-choice knapsack: the option per layer with the least total score whose total cost stays
    within ``budget`` (costs in bits, made integral at 1/8 bit per element)."""
    names = list(scores)
    # dp over total cost: {cost: (score, choices)}; costs are (numel * bits * 8) integers
    frontier: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for n in names:
        nxt: dict[int, tuple[float, tuple[int, ...]]] = {}
        for c, (s, picks) in frontier.items():
            for i, (sc, co) in enumerate(zip(scores[n], costs[n])):
                cc = c + int(round(co * 8))
                if cc > budget * 8 + 1e-6:
                    continue
                cand = (s + sc, picks + (i,))
                if cc not in nxt or cand[0] < nxt[cc][0]:
                    nxt[cc] = cand
        # keep the Pareto front: a cost only if it buys a lower score than every cheaper one
        front, best = {}, float("inf")
        for cc in sorted(nxt):
            if nxt[cc][0] < best:
                best = nxt[cc][0]
                front[cc] = nxt[cc]
        frontier = front
        if not frontier:
            raise ValueError("the effective_bits budget is below what the cheapest format of every layer costs")
    _, picks = min(frontier.values(), key=lambda v: v[0])
    return dict(zip(names, picks))


def auto_quantize(model: nn.Module, constraints: Optional[dict] = None,
                  quantization_formats: Optional[list[Union[dict, str]]] = None,
                  data_loader: Optional[Iterable] = None, forward_step: Optional[Callable[[nn.Module, Any], Any]] = None,
                  loss_func: Optional[Callable[[Any, Any], torch.Tensor]] = None,
                  forward_backward_step: Optional[Callable[[nn.Module, Any], Any]] = None,
                  disabled_layers: Optional[Union[list[str], str]] = None, num_calib_steps: int = 512,
                  num_score_steps: int = 128, verbose: bool = False, method: str = "gradient",
                  checkpoint: Optional[str] = None) -> tuple[nn.Module, dict]:
    """Choose a format per layer under ``constraints={"effective_bits": b}`` (default 4.8) and quantize
    ``model`` with it, in place. Returns ``(model, search_state)``; ``search_state["best"]["recipe"]`` maps each
    searched layer to its format name (``"NONE(16 bits)"``: left in float) and
    ``search_state["candidate_stats"]`` holds every layer's formats, scores and costs.

    ``data_loader`` yields batches; ``forward_step(model, batch)`` returns the output ``loss_func(output, batch)``
    takes. ``checkpoint`` (ModelOpt's resumable search state) is not supported.
    """
    if checkpoint is not None:
        raise ValueError("checkpoint is not supported by quanta.modelopt.auto_quantize (the search is not resumable)")
    if method not in ("gradient", "kl_div"):
        raise ValueError(f"method must be 'gradient' or 'kl_div', got {method!r}")
    constraints = dict(constraints or {"effective_bits": 4.8})
    unknown = set(constraints) - {"effective_bits"}
    if unknown:
        raise ValueError(f"constraints supports 'effective_bits' only, got {sorted(unknown)}")
    budget_bits = constraints.get("effective_bits", 4.8)
    if isinstance(budget_bits, bool) or not isinstance(budget_bits, (int, float)) or budget_bits <= 0:
        raise ValueError(f"constraints['effective_bits'] must be a positive number, got {budget_bits!r}")
    if data_loader is None or forward_step is None:
        raise ValueError("auto_quantize needs data_loader and forward_step (forward_step(model, batch) -> output)")
    if method == "gradient" and loss_func is None and forward_backward_step is None:
        raise ValueError("method='gradient' needs loss_func(output, batch) or forward_backward_step(model, batch)")
    formats = _formats(quantization_formats)
    for name, f in formats.items():
        _, algorithm = check_config(f)
        if algorithm not in (None, "max") and not (isinstance(algorithm, dict) and algorithm.get("method") == "max"):
            raise NotImplementedError(f"format {name!r} calibrates with {algorithm!r}; quanta.modelopt runs 'max'")
    disabled = [disabled_layers] if isinstance(disabled_layers, str) else list(disabled_layers or [])
    batches = list(data_loader)
    if not batches:
        raise ValueError("data_loader yielded no batches")
    score_batches = batches[:num_score_steps]

    if not is_quantized(model):
        convert(model)
    layers = _layers(model, disabled)
    if not layers:
        raise ValueError("the model has no layer with a weight to search (nn.Linear, convolutions)")
    for layer in layers.values():
        _apply(layer, None)
    for q in model.modules():  # quantizers outside the searched layers stay off during the search
        if isinstance(q, (TensorQuantizer, SequentialQuantizer)):
            q.disable()

    training = model.training
    model.eval()
    names = list(layers)
    options = [_NONE, *formats]
    # the float pass: each layer's input and output, and (gradient) the loss gradient at its output
    inputs: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    outputs: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    grads: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    hooks = []
    for n, layer in layers.items():
        def fwd(mod, args, out, n=n):
            inputs[n].append(args[0].detach())
            outputs[n].append(out.detach())
            if out.requires_grad:
                out.register_hook(lambda g, n=n: grads[n].append(g.detach()))
        hooks.append(layer.register_forward_hook(fwd))
    ref_logits = []
    try:
        for b in score_batches:
            if method == "gradient":
                with torch.enable_grad():
                    if forward_backward_step is not None:
                        forward_backward_step(model, b)
                    else:
                        loss_func(forward_step(model, b), b).backward()
            else:
                with torch.no_grad():
                    ref_logits.append(forward_step(model, b).detach())
    finally:
        for h in hooks:
            h.remove()
        model.zero_grad(set_to_none=True)

    if method == "gradient":
        missing = [n for n in names if len(grads[n]) != len(inputs[n])]
        if missing:
            raise ValueError(f"no loss gradient reached the output of {missing[:3]}: the loss must depend on every "
                             "searched layer and the model's parameters need requires_grad=True (or use "
                             "method='kl_div')")
    scores: dict[str, list[float]] = {}
    costs: dict[str, list[float]] = {}
    for n, layer in layers.items():
        numel = layer.weight.numel()
        scores[n], costs[n] = [], []
        for opt in options:
            costs[n].append(numel * (16.0 if opt == _NONE else format_bits(formats[opt])))
            if opt == _NONE:
                scores[n].append(0.0)
                continue
            _apply(layer, _per_layer_entries(formats[opt]))
            calibrate(layer, "max", lambda m, n=n: [m(x) for x in inputs[n][:num_calib_steps]])
            total = 0.0
            with torch.no_grad():
                if method == "gradient":
                    for x, y, g in zip(inputs[n], outputs[n], grads[n]):
                        total += float(((layer(x) - y).float().pow(2) * g.float().pow(2)).sum())
                else:
                    for b, ref in zip(score_batches, ref_logits):
                        total += float(F.kl_div(F.log_softmax(forward_step(model, b).float(), -1),
                                                F.log_softmax(ref.float(), -1), log_target=True,
                                                reduction="batchmean"))
            scores[n].append(total)
            _apply(layer, None)
    total_numel = sum(layer.weight.numel() for layer in layers.values())
    picks = _choose(scores, costs, budget_bits * total_numel)
    recipe = {n: options[i] for n, i in picks.items()}
    for n, opt in recipe.items():
        _apply(layers[n], None if opt == _NONE else _per_layer_entries(formats[opt]))
    calibrate(model, "max", lambda m: [forward_step(m, b) for b in batches[:num_calib_steps]])
    model.train(training)
    achieved = sum(costs[n][picks[n]] for n in names) / total_numel
    state = {"best": {"recipe": recipe, "constraints": {"effective_bits": achieved},
                      "score": sum(scores[n][picks[n]] for n in names), "is_satisfied": achieved <= budget_bits},
             "candidate_stats": {n: {"formats": options, "scores": scores[n], "costs": costs[n]} for n in names}}
    if verbose:
        for n, opt in recipe.items():
            print(f"AutoQuantize: {n}: {opt}")
        print(f"AutoQuantize: effective bits {achieved:.3f} (budget {budget_bits})")
    return model, state

