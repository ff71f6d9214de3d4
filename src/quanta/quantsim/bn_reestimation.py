"""BatchNorm re-estimation (AIMET's ``reestimate_bn_stats``): BatchNorm statistics measured again on data.

A BatchNorm's running statistics were accumulated, with momentum, over the
weights training went through. After quantization-aware training (or any change
of the layers before it) they no longer describe what the network now computes,
and folding them into the weights bakes the mismatch in. Re-estimation runs
``num_batches`` batches with every BatchNorm normalising by the batch's own
statistics (train mode) and every other layer in eval mode (dropout off,
quantizers as they are), and sets, as AIMET does,

    running_mean = (1/B) · Σ_b mean_b,    running_var = (1/B) · Σ_b var_b

with ``mean_b`` and the unbiased ``var_b`` of batch ``b`` per channel. The
returned :class:`Handle` puts the previous statistics back.

>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
>>> batches = [torch.randn(8, 3, 10, 10) + 2.0 for _ in range(4)]
>>> handle = reestimate_bn_stats(model, batches, num_batches=4, progress=False)
>>> bool((model[1].running_mean != 0).all()), model.training
(True, False)
>>> handle.remove()  # the statistics before re-estimation are back
>>> bool((model[1].running_mean == 0).all())
True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from quanta._progress import make_bar

__all__ = ["DEFAULT_NUM_BATCHES", "Handle", "reestimate_bn_stats"]

#: Batches of the data loader that :func:`reestimate_bn_stats` reads when ``num_batches`` is not given.
DEFAULT_NUM_BATCHES = 100


class Handle:
    """Undoes what a call did, once: :meth:`Handle.remove` (AIMET's ``Handle``); also a context manager.

    >>> undone = []
    >>> with Handle(lambda: undone.append(True)):
    ...     pass
    >>> undone
    [True]
    """

    def __init__(self, cleanup: Callable[[], None]) -> None:
        self._cleanup: Callable[[], None] | None = cleanup

    def remove(self) -> None:
        """Undo (a second call does nothing)."""
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def __enter__(self) -> "Handle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def _batch_norms(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules()
            if isinstance(m, _BatchNorm) and m.running_mean is not None and m.running_var is not None]


def reestimate_bn_stats(model: nn.Module, dataloader: Iterable[Any], num_batches: int = DEFAULT_NUM_BATCHES,
                        forward_fn: Callable[[nn.Module, Any], Any] | None = None, *,
                        progress: bool = True) -> Handle:
    """Re-estimate the running mean and variance of every BatchNorm of ``model`` (in place; see the module).

    Args:
        model: the model, float or simulated (a QuantizationSimModel's ``model``):
            its BatchNorms with running statistics are re-estimated.
        dataloader: batches (training data); the first ``num_batches`` are used
            (fewer if it ends first). Anything iterable: a DataLoader, a list.
        num_batches: at most this many batches (AIMET's default, 100).
        forward_fn: ``forward_fn(model, batch)`` runs one batch (default:
            ``model(batch)``); use it when batches hold labels too.
        progress: a tqdm/rich bar when one of them is installed.

    Returns:
        A :class:`Handle` whose ``remove()`` restores the statistics from before.
        Train/eval flags and BatchNorm momenta are restored on return.

    Raises TypeError for a non-module model, a non-iterable ``dataloader`` or a
    non-callable ``forward_fn``; ValueError for ``num_batches < 1``, a model
    without BatchNorm running statistics, or a ``dataloader`` that yields no
    batch (nothing is changed then). An exception from ``forward_fn`` restores
    everything and propagates.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    if forward_fn is not None and not callable(forward_fn):
        raise TypeError(f"forward_fn must be callable as forward_fn(model, batch), got {type(forward_fn).__name__}")
    try:
        batches = iter(dataloader)
    except TypeError:
        raise TypeError(f"dataloader must be iterable (a DataLoader, a list of batches), got "
                        f"{type(dataloader).__name__}") from None
    bns = _batch_norms(model)
    if not bns:
        raise ValueError("model has no BatchNorm with running statistics to re-estimate")
    run = forward_fn if forward_fn is not None else (lambda m, batch: m(batch))

    saved = [(bn.running_mean.clone(), bn.running_var.clone(),
              None if bn.num_batches_tracked is None else bn.num_batches_tracked.clone()) for bn in bns]

    def restore_stats() -> None:
        with torch.no_grad():
            for bn, (mean, var, tracked) in zip(bns, saved):
                bn.running_mean.copy_(mean)
                bn.running_var.copy_(var)
                if tracked is not None:
                    bn.num_batches_tracked.copy_(tracked)

    flags = {m: m.training for m in model.modules()}
    momenta = {bn: bn.momentum for bn in bns}
    total = num_batches
    if hasattr(dataloader, "__len__"):
        total = min(total, len(dataloader))
    bar = make_bar(total, enabled=progress, desc="batchnorm reestimation")
    try:
        model.eval()
        for bn in bns:
            bn.train()
            bn.momentum = 1.0  # the running statistics become each batch's own
            bn.reset_running_stats()
        sums = [(torch.zeros_like(bn.running_mean), torch.zeros_like(bn.running_var)) for bn in bns]
        count = 0
        with torch.no_grad():
            for batch in itertools.islice(batches, num_batches):
                run(model, batch)
                for bn, (mean_sum, var_sum) in zip(bns, sums):
                    mean_sum += bn.running_mean
                    var_sum += bn.running_var
                count += 1
                bar.advance()
            if count == 0:
                raise ValueError("dataloader yielded no batches; the BatchNorm statistics are unchanged")
            for bn, (mean_sum, var_sum) in zip(bns, sums):
                bn.running_mean.copy_(mean_sum / count)
                bn.running_var.copy_(var_sum / count)
    except BaseException:
        restore_stats()
        raise
    finally:
        bar.close()
        for bn, momentum in momenta.items():
            bn.momentum = momentum
        for m, training in flags.items():
            m.training = training
    return Handle(restore_stats)
