"""Sequential calibration: quantize a model block after block, each block calibrated on the outputs of the
blocks already quantized before it.

GPTQ (and AWQ, SmoothQuant) calibrate a layer on its inputs. Run on the float
model, every block sees float inputs, but at inference it sees the outputs of
quantized blocks; sequential calibration closes that gap, as the GPTQ paper
does: the inputs of the first block are captured once, then for each block

1. the config's first step observes its layers while the block runs on the current inputs,
2. the second step quantizes them,
3. the *quantized* block runs on the same inputs, and its outputs become the next block's inputs.

The layers outside the blocks (``lm_head``...) are calibrated last, by one
pass of the whole model with every block already quantized.

>>> import torch
>>> from torch import nn
>>> from quanta.quantization import quantize_sequential, GPTQConfig, Int4WeightOnlyConfig
>>> class Block(nn.Module):  # as transformers' layers: hidden states in, hidden states out
...     def __init__(self):
...         super().__init__()
...         self.mlp = nn.Sequential(nn.Linear(64, 64), nn.GELU())
...     def forward(self, x):
...         return x + self.mlp(x)
>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.layers = nn.ModuleList(Block() for _ in range(3))
...         self.head = nn.Linear(64, 10)
...     def forward(self, x):
...         for layer in self.layers:
...             x = layer(x)
...         return self.head(x)
>>> _ = torch.manual_seed(0)
>>> net = Net()
>>> data = [torch.randn(16, 64) for _ in range(4)]
>>> report = quantize_sequential(net, GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32)), data,
...                              progress=False)
>>> report.blocks
['layers.0', 'layers.1', 'layers.2']
>>> report.quantized
['layers.0.mlp.0', 'layers.1.mlp.0', 'layers.2.mlp.0', 'head']
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from quanta._inputs import call_model
from quanta._progress import make_bar
from quanta.quantization.linear_like import is_linear_like
from quanta.quantization.quant_api import AOBaseConfig, CalibrationConfig, ModuleFqnToConfig, QuantizeReport, quantize_

__all__ = ["quantize_sequential", "SequentialReport", "find_blocks"]

@dataclasses.dataclass
class SequentialReport(QuantizeReport):
    """:class:`~quanta.quantization.quant_api.QuantizeReport` of every block, plus the ``blocks`` in order."""

    blocks: list[str] = dataclasses.field(default_factory=list)


def find_blocks(model: nn.Module) -> list[str]:
    """Names of the model's repeated blocks: the children of its largest ``nn.ModuleList`` of one class holding
    Linear (or Conv1D) layers.

    That finds transformers' decoder and encoder layers (``model.layers``, ``transformer.h``,
    ``encoder.layer``...) and the usual hand-written stacks.

    >>> find_blocks(nn.Sequential(nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])))
    ['0.0', '0.1', '0.2']
    """
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0 \
                and len({type(m) for m in module}) == 1 and any(is_linear_like(m) for m in module.modules()):
            size = sum(p.numel() for p in module.parameters())
            if best is None or size > best[0]:
                best = (size, name, module)
    if best is None:
        raise ValueError("no repeated blocks found (an nn.ModuleList of one module class holding Linear layers): "
                         "pass blocks=[names of the blocks, in the order the model runs them]")
    prefix = f"{best[1]}." if best[1] else ""
    return [f"{prefix}{i}" for i in range(len(best[2]))]


class _Stop(Exception):
    """Raised by the capture hook to end the model's forward at the first block."""


def _call(fn: Callable[..., Any], batch: Any) -> Any:
    """:func:`quanta._inputs.call_model`, a list batch taken as positional inputs as a tuple is."""
    return call_model(fn, tuple(batch) if isinstance(batch, list) else batch)


def _hidden(args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """The hidden states a block is called with: its first positional argument, or ``hidden_states=``."""
    return args[0] if args else kwargs.get("hidden_states")


def _first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if hasattr(out, "to_tuple"):  # transformers' ModelOutput
        return _first_tensor(out.to_tuple())
    raise TypeError(f"a block returned {type(out).__name__}; quantize_sequential needs a tensor or a tuple whose "
                    "first element is the hidden states")


def _with_hidden(args: tuple, kwargs: dict, hidden: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (hidden,) + tuple(args[1:]), kwargs
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": hidden}
    raise ValueError("the first block was called without positional arguments or a hidden_states= keyword: "
                     "quantize_sequential cannot tell which argument carries the hidden states")


@contextlib.contextmanager
def _no_cache(model: nn.Module) -> Iterator[None]:
    """transformers models: no KV cache during calibration (the blocks are re-run on stored inputs)."""
    config = getattr(model, "config", None)
    old = getattr(config, "use_cache", None)
    if old is not None:
        config.use_cache = False
    try:
        yield
    finally:
        if old is not None:
            config.use_cache = old


def _resolve_blocks(model: nn.Module, blocks: Optional[Sequence[Union[str, nn.Module]]]) -> list[tuple[str, nn.Module]]:
    names = {id(m): n for n, m in model.named_modules()}
    modules = dict(model.named_modules())
    if blocks is None:
        return [(n, modules[n]) for n in find_blocks(model)]
    if isinstance(blocks, (str, nn.Module)) or not isinstance(blocks, Sequence) or not blocks:
        raise TypeError(f"blocks must be a non-empty list of module names or modules of the model, got {blocks!r}")
    out = []
    for b in blocks:
        if isinstance(b, str):
            if b not in modules:
                raise ValueError(f"blocks names {b!r}, which is not a module of the model")
            out.append((b, modules[b]))
        elif isinstance(b, nn.Module) and id(b) in names:
            out.append((names[id(b)], b))
        else:
            raise ValueError(f"blocks must hold names or modules of the model, got {b!r}")
    return out


def _steps(config: AOBaseConfig) -> tuple[Optional[AOBaseConfig], AOBaseConfig]:
    if isinstance(config, ModuleFqnToConfig):
        raise TypeError("quantize_sequential takes one config for every selected layer, not ModuleFqnToConfig "
                        "(select layers with filter_fn)")
    if not isinstance(config, CalibrationConfig):
        return None, config  # round to nearest: one step
    first, second = type(config).steps
    return dataclasses.replace(config, step=first), dataclasses.replace(config, step=second)


def _merge(total: SequentialReport, part: QuantizeReport, prefix: str) -> None:
    total.quantized += [prefix + n for n in part.quantized]
    total.skipped.update({prefix + n: why for n, why in part.skipped.items()})
    total.output_mse.update({prefix + n: v for n, v in part.output_mse.items()})
    total.notes.update({prefix + n: v for n, v in part.notes.items()})
    total.scale_folded_into.update({prefix + n: None if v is None else prefix + v
                                    for n, v in part.scale_folded_into.items()})


@torch.no_grad()
def quantize_sequential(model: nn.Module, config: AOBaseConfig, data: Iterable[Any], *,
                        blocks: Optional[Sequence[Union[str, nn.Module]]] = None,
                        filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
                        progress: bool = True) -> SequentialReport:
    """Quantize ``model`` in place, block by block, each block calibrated on the quantized blocks' outputs.

    Args:
        model: the model (a transformers model or any ``nn.Module``).
        config: a calibration config (``GPTQConfig(base_config=...)``, its ``step`` is ignored: both steps run
            here) or a plain ``quantize_`` config (round to nearest, block by block).
        data: calibration batches, each passed to the model as ``model(batch)``, ``model(*batch)`` (tuple or
            list) or ``model(**batch)`` (dict). Kept in memory with the inputs of one block.
        blocks: the blocks in the order the model runs them, by name or module (default: :func:`find_blocks`,
            which finds transformers' decoder layers). Each block must take the hidden states as its first
            positional argument (or ``hidden_states=``) and return them first.
        filter_fn: ``filter_fn(module, fqn) -> bool`` selects the layers to quantize, ``fqn`` relative to
            ``model`` (default: every ``nn.Linear`` and transformers ``Conv1D``).
        progress: a progress bar per block (tqdm or rich, if installed).

    Returns:
        a :class:`SequentialReport`: per layer, the output MSE on its calibration inputs with the algorithm
        and with round-to-nearest; the layers kept in float and why.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, AOBaseConfig):
        raise TypeError(f"config must be a quanta.quantization config (e.g. GPTQConfig(base_config=...)), got "
                        f"{config!r}")
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable (module, fqn) -> bool, got {filter_fn!r}")
    if isinstance(data, (torch.Tensor, dict)):
        raise TypeError("data must be an iterable of batches (a list of tensors, tuples or dicts), not one batch")
    batches = list(data)
    if not batches:
        raise ValueError("data is empty: quantize_sequential needs at least one calibration batch")
    first, second = _steps(config)
    block_list = _resolve_blocks(model, blocks)
    select = filter_fn or (lambda m, n: is_linear_like(m))
    report = SequentialReport(blocks=[n for n, _ in block_list])
    in_blocks = {n for n, _ in block_list}

    def outside(m: nn.Module, n: str) -> bool:
        return select(m, n) and not any(n == b or n.startswith(b + ".") for b in in_blocks)

    was_training = model.training
    model.eval()
    try:
        with _no_cache(model):
            _check_chained(model, block_list, batches[0])
            inputs = _capture_inputs(model, block_list[0][1], batches)
            bar = make_bar(len(block_list), enabled=progress, desc="quantize_sequential", unit="block")
            for name, block in block_list:
                inputs = calibrate_block(block, name, (first, second), inputs, select, report)[0]
                bar.advance()
            bar.close()
            del inputs
            # the rest (lm_head...), calibrated through the model with every block quantized
            calibrate_rest(model, (first, second), batches, outside, report)
    finally:
        model.train(was_training)
    return report


Steps = tuple[Optional[AOBaseConfig], AOBaseConfig]


def calibrate_block(block: nn.Module, name: str, steps: Steps, inputs: list[tuple[tuple, dict]],
                    select: Callable[[nn.Module, str], bool], report: "SequentialReport"
                    ) -> tuple[list[tuple[tuple, dict]], list[Any]]:
    """Both steps of ``steps`` on the layers of ``block`` (named ``name`` in the model) that ``select`` takes,
    on ``inputs``; then the quantized block's ``(next inputs, raw outputs)`` for the same calls."""
    first, second = steps
    prefix = f"{name}."

    def under(m: nn.Module, n: str) -> bool:
        return select(m, f"{prefix}{n}")
    if first is not None:
        quantize_(block, first, filter_fn=under)
        for args, kwargs in inputs:
            block(*args, **kwargs)
    _merge(report, quantize_(block, second, filter_fn=under), prefix)
    outputs = [block(*args, **kwargs) for args, kwargs in inputs]
    return [_with_hidden(a, k, _first_tensor(o)) for (a, k), o in zip(inputs, outputs)], outputs


def calibrate_rest(model: nn.Module, steps: Steps, batches: list[Any], outside: Callable[[nn.Module, str], bool],
                   report: "SequentialReport") -> None:
    """Both steps on the layers ``outside`` takes (those outside the blocks), through whole-model calls."""
    first, second = steps
    if not any(outside(m, n) for n, m in model.named_modules()):
        return
    if first is not None:
        quantize_(model, first, filter_fn=outside)
        for batch in batches:
            _call(model, batch)
    _merge(report, quantize_(model, second, filter_fn=outside), "")


def _check_chained(model: nn.Module, blocks: list[tuple[str, nn.Module]], batch: Any) -> None:
    """ValueError unless each block's hidden-states input is the previous block's output (one float forward)."""
    seen: list[tuple[str, str, torch.Tensor]] = []
    handles = []
    for name, block in blocks:
        def pre(_m, args, kwargs, name=name):
            seen.append(("in", name, _hidden(args, kwargs)))

        def post(_m, _args, _kwargs, out, name=name):
            seen.append(("out", name, _first_tensor(out)))
        handles += [block.register_forward_pre_hook(pre, with_kwargs=True),
                    block.register_forward_hook(post, with_kwargs=True)]
    try:
        _call(model, batch)
    finally:
        for h in handles:
            h.remove()
    order = [(kind, name) for kind, name, _ in seen]
    expected = [(kind, name) for name, _ in blocks for kind in ("in", "out")]
    if order != expected:
        raise ValueError(f"the blocks do not run once each in the order given: expected {expected[::2]}, the model "
                         f"ran {[n for k, n in order if k == 'in']}")
    for (_, prev, out), (_, name, nxt) in zip(seen[1::2], seen[2::2]):
        if not isinstance(nxt, torch.Tensor) or (nxt is not out and not torch.equal(nxt, out)):
            raise ValueError(f"block {name!r} does not take block {prev!r}'s output as its hidden states (the model "
                             "changes them between the blocks, e.g. a residual add outside the blocks): pass "
                             "blocks= that chain, or quantize with quantize_ in two steps instead")


def _capture_inputs(model: nn.Module, block: nn.Module, batches: list[Any]) -> list[tuple[tuple, dict]]:
    """``(args, kwargs)`` of the first block's call for every batch (the model stops there)."""
    captured: list[tuple[tuple, dict]] = []

    def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
        captured.append((tuple(args), dict(kwargs)))
        raise _Stop

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for batch in batches:
            try:
                _call(model, batch)
            except _Stop:
                continue
            raise ValueError("the model ran a whole batch without calling the first block: check blocks=")
    finally:
        handle.remove()
    return captured
