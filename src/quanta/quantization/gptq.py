"""GPTQ (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
Transformers"): quantize a Linear weight column by column, spreading each column's rounding error over the
columns not yet quantized so that the layer's *output* on calibration data moves least.

For a weight ``W [N, K]`` and inputs ``X [K, T]`` it minimises ``||W X - Q(W) X||^2`` one column at a
time with the Hessian of that loss, ``H = 2 X X^T / T``::

    H += damp * mean(diag(H)) * I                      (percdamp: keeps H invertible)
    U = cholesky(H^-1)^T                               (upper: row i holds what column i's error moves)
    for each column i (in blocks of B, the updates to later blocks applied once per block):
        q_i = Q(w_i)                                   (on the base config's grid, qparams fixed)
        e_i = (w_i - q_i) / U[i, i]
        w_j -= e_i * U[i, j]   for every j > i

Group-wise configs fit each group's qparams when GPTQ reaches the group, on the
columns as the earlier errors have moved them ("the scales follow the update");
with ``act_order=True`` the columns go in decreasing ``diag(H)`` and every group
keeps the qparams of the original weight (static groups), so that the stored
tensor keeps its groups contiguous. Per-row configs take their qparams from the
original weight. A column that never saw a non-zero input (``diag(H) = 0``) is
set to zero, as in the paper's code.

Two steps through ``quantize_``, as torchao's ``GPTQConfig``:

>>> import torch
>>> from torch import nn
>>> from quanta.quantization import quantize_, GPTQConfig, Int4WeightOnlyConfig
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32))
>>> base = Int4WeightOnlyConfig(group_size=32)
>>> report = quantize_(model, GPTQConfig(step="observe", base_config=base))
>>> report.observed
['0', '2']
>>> for _ in range(4):
...     _ = model(torch.randn(64, 128))
>>> report = quantize_(model, GPTQConfig(step="convert", base_config=base))
>>> report.quantized, type(model[0].weight).__name__
(['0', '2'], 'AffineQuantizedTensor')

Blocks of a model one after another, each calibrated on the outputs of the
blocks already quantized: :func:`quanta.quantization.quantize_sequential`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from quanta.quantization.linear_like import in_features, is_linear_like, linear_weight, stored_weight
from quanta.quantization.observed import (
    HessianObserver,
    attach_observer,
    check_base_config,
    check_step,
    detach_observer,
    output_mse,
)
from quanta.quantization.quant_api import (
    AOBaseConfig,
    CalibrationConfig,
    Int4WeightOnlyConfig,
    LayerNotQuantizable,
    QuantizeReport,
)
from quanta.quantization.weight_grid import WeightGrid, _affine

__all__ = ["GPTQConfig", "HessianObserver", "GPTQResult", "gptq_quantize", "output_mse"]


@dataclass
class GPTQResult:
    """``tensor``: the quantized weight; ``mse``/``rtn_mse``: output MSE on the calibration inputs with GPTQ
    and with round-to-nearest on the same base config; ``damping``: the ``percdamp`` finally used."""

    tensor: torch.Tensor
    mse: float
    rtn_mse: float
    damping: float
    notes: list[str] = field(default_factory=list)


def _inverse_cholesky(h: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of ``(H + damp I)^-1``; the damping grows 10x (up to 3 times) until H is positive."""
    mean_diag = float(h.diagonal().mean())
    damp = percdamp
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    for _ in range(4):
        l, info = torch.linalg.cholesky_ex(h + damp * mean_diag * eye)
        if int(info) == 0:
            inv = torch.cholesky_inverse(l)
            u, info = torch.linalg.cholesky_ex(inv, upper=True)
            if int(info) == 0:
                return u, damp
        damp *= 10
    raise ValueError(f"the Hessian is not positive definite even with percdamp={damp / 10:g}; the calibration "
                     "inputs may contain NaN/inf or be degenerate")


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, grid: WeightGrid, *, percdamp: float = 0.01,
                  block_size: int = 128, act_order: bool = False) -> GPTQResult:
    """GPTQ of ``weight`` ``[N, K]`` onto ``grid`` given ``hessian`` ``[K, K]`` (see the module docstring).

    Args:
        weight: the float weight (not modified).
        hessian: ``2 X X^T / T`` of the layer's inputs (:class:`HessianObserver`).
        grid: the base config's :class:`~quanta.quantization.weight_grid.WeightGrid` for ``weight``.
        percdamp: damping, a fraction of the mean of ``diag(H)`` added to the diagonal.
        block_size: columns per lazy batch (the updates to later columns are applied once per batch).
        act_order: quantize columns in decreasing ``diag(H)``, with static groups.

    Returns:
        a :class:`GPTQResult`.
    """
    n, k = weight.shape
    if tuple(hessian.shape) != (k, k):
        raise ValueError(f"hessian must have shape {(k, k)} for a weight of shape {(n, k)}, got "
                         f"{tuple(hessian.shape)}")
    if not math.isfinite(percdamp) or percdamp <= 0:
        raise ValueError(f"percdamp must be a positive number, got {percdamp}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if not bool(torch.isfinite(hessian).all()):
        raise ValueError("hessian contains NaN or inf: the calibration inputs are not finite")
    h = hessian.clone().double() if hessian.dtype == torch.float64 else hessian.clone().float()
    w = weight.detach().to(h.dtype).clone()
    notes = []
    dead = h.diagonal() == 0
    if bool(dead.any()):
        h[dead, dead] = 1
        w[:, dead] = 0
        notes.append(f"{int(dead.sum())} input feature(s) never non-zero in calibration: their weights set to 0")

    g = grid.group_columns
    perm = None
    if act_order:
        perm = torch.argsort(h.diagonal(), descending=True, stable=True)
        w, h = w[:, perm], h[perm][:, perm]
        grid.fit_all_from_template()
    u, damp = _inverse_cholesky(h, percdamp)
    if damp != percdamp:
        notes.append(f"percdamp raised to {damp:g} to make the Hessian positive definite")

    quantized = torch.empty_like(w)   # Q(w_i) in the working order
    inputs = torch.empty_like(w)      # the values each column had when it was quantized
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        # the block transposed: a column is a contiguous row (the strided columns of a [2048, 128] block made
        # each column's ops several times slower)
        wt = w[:, b0:b1].t().contiguous()
        qt, errors_t = torch.empty_like(wt), torch.empty_like(wt)
        ub = u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            orig = int(perm[col]) if perm is not None else col
            if perm is None and grid.num_groups > 1 and col % g == 0:
                # the group's qparams from its columns as they are now (later ones in w, not yet in this block)
                ahead = col + g - b1
                if ahead <= 0:
                    cols = wt[i:i + g].t().contiguous()
                else:
                    cols = torch.cat([wt[i:].t(), w[:, b1:b1 + ahead]], dim=1)
                grid.fit(col // g, cols)
            x = wt[i].unsqueeze(1)
            q = grid.fake_quantize(x, orig).to(w.dtype)
            qt[i] = q.squeeze(1)
            err = torch.sub(x.squeeze(1), qt[i], out=errors_t[i]).div_(ub[i, i])
            # the later columns only (an outer product: an [N, 1] @ [1, b] mm is slower); column i keeps the
            # value it was quantized from, recorded for the whole block below
            wt[i + 1:] -= ub[i, i + 1:].unsqueeze(1) * err
        inputs[:, b0:b1] = wt.t()
        quantized[:, b0:b1] = qt.t()
        w[:, b1:] -= errors_t.t().contiguous() @ u[b0:b1, b1:]  # the layout of the textbook's matmul: its bits

    if perm is not None:
        inv = torch.argsort(perm)
        quantized, inputs = quantized[:, inv], inputs[:, inv]
    tensor = grid.build(inputs)
    deq = tensor.dequantize().to(h.dtype)
    if not torch.equal(deq, quantized.to(deq.dtype)):
        # build() re-quantizes the recorded inputs with the same qparams: any difference is a bug
        raise RuntimeError("GPTQ: the built tensor differs from the columns quantized along the way")
    ref = weight.detach().to(h.dtype)
    hess = hessian.to(h.dtype)
    rtn = grid.config.quantize_weight(weight.detach(), grid.module).dequantize().to(h.dtype)
    return GPTQResult(tensor, output_mse(deq - ref, hess), output_mse(rtn - ref, hess), damp, notes)


def gptq_quantize_reference(weight: torch.Tensor, hessian: torch.Tensor, grid: WeightGrid, *,
                            block_size: int = 128) -> torch.Tensor:
    """The dequantized weight of GPTQ as the paper writes its loop (Frantar et al. 2023, Algorithm 1), kept beside
    :func:`gptq_quantize` for the tests and ``bench/bench_gptq.py``: :func:`gptq_quantize` returns the same bits.

    Float32 weights, ``percdamp`` 0.01, no ``act_order``; static groups fitted at their first column; every column
    through the checked primitives (``quantize_affine`` / ``dequantize_affine``), the rank-1 update as an
    ``[N, 1] @ [1, b]`` matmul over the block's columns from ``i`` on.
    """
    k = weight.shape[1]
    u, _ = _inverse_cholesky(hessian.clone().float(), 0.01)
    w = weight.detach().float().clone()
    inputs = torch.zeros_like(w)
    g = grid.group_columns
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        errors = torch.zeros(w.shape[0], b1 - b0)
        for i in range(b0, b1):
            if grid.num_groups > 1 and i % g == 0:
                grid.fit(i // g, w[:, i:i + g])  # columns i.. as they are now (the block's updates applied)
            x = w[:, i:i + 1].clone()
            scale, zp = grid._params(i, 1)
            q = _affine(grid.template)._dequantize_codes(grid._codes(x, scale, zp), scale, zp, (1, 1),
                                                         grid.dtype).float()
            inputs[:, i:i + 1] = x
            err = (x - q) / u[i, i]
            w[:, i:b1] -= err @ u[i:i + 1, i:b1]
            errors[:, i - b0:i - b0 + 1] = err
        w[:, b1:] -= errors @ u[b0:b1, b1:]
    return grid.build(inputs).dequantize()


_OBSERVER = "_quanta_gptq_observer"


@dataclass
class GPTQConfig(CalibrationConfig):
    """GPTQ through ``quantize_``, in two steps (torchao's ``GPTQConfig``; see the module docstring).

    Args:
        step: ``"observe"`` attaches a Hessian observer to every selected Linear (weights unchanged);
            run calibration data through the model, then ``"convert"`` quantizes each observed layer
            with GPTQ and removes the observers.
        base_config: the storage: any quanta ``quantize_`` config (int4 / int8 / intx weight-only, int8
            dynamic activation, float8, fpx). The result is that config's ordinary quantized tensor.
        percdamp: damping as a fraction of the mean of ``diag(H)``.
        gptq_quantize_block_size: columns per lazy batch of updates.
        act_order: quantize columns in decreasing ``diag(H)`` (groups keep the original weight's qparams).

    torchao 0.18's GPTQConfig refuses int4 on CPU and cannot run sequentially; quanta's runs every base
    config on CPU, and :func:`quanta.quantization.quantize_sequential` runs it block by block.
    """

    step: str = "observe"
    base_config: AOBaseConfig = field(default_factory=Int4WeightOnlyConfig)
    percdamp: float = 0.01
    gptq_quantize_block_size: int = 256
    act_order: bool = False

    def __post_init__(self) -> None:
        check_step(self.step, self.steps, "GPTQConfig")
        check_base_config(self.base_config, "GPTQConfig")
        if isinstance(self.percdamp, bool) or not isinstance(self.percdamp, (int, float)) \
                or not math.isfinite(self.percdamp) or self.percdamp <= 0:
            raise ValueError(f"GPTQConfig.percdamp must be a positive number, got {self.percdamp!r}")
        b = self.gptq_quantize_block_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"GPTQConfig.gptq_quantize_block_size must be a positive int, got {b!r}")
        if not isinstance(self.act_order, bool):
            raise TypeError(f"GPTQConfig.act_order must be a bool, got {self.act_order!r}")

    def describe(self) -> str:
        return f"GPTQConfig(step={self.step!r}, base_config={self.base_config.describe()})"

    def apply(self, model, selected, report):
        changes = []
        for fqn, module in selected:
            try:
                if not is_linear_like(module):
                    raise LayerNotQuantizable(f"GPTQ quantizes nn.Linear (and Conv1D) layers, not "
                                              f"{type(module).__name__}")
                if self.step == "observe":
                    changes.append(self._observe(module))
                    report.observed.append(fqn)
                else:
                    changes.append(self._convert(fqn, module, report))
                    report.quantized.append(fqn)
            except LayerNotQuantizable as e:
                report.skipped[fqn] = str(e)
        if self.step == "convert" and selected and not any(_OBSERVER in m.__dict__ for _, m in selected):
            raise ValueError("GPTQConfig(step='convert'): no selected layer was observed; run quantize_ with "
                             "step='observe', then calibration data through the model, then convert")
        return changes

    @staticmethod
    def _observe(module: nn.Module) -> Callable[[], None]:
        obs = HessianObserver(in_features(module))
        return lambda: attach_observer(module, _OBSERVER, obs, obs.update)

    def _convert(self, fqn: str, module: nn.Module, report: QuantizeReport) -> Callable[[], None]:
        entry = module.__dict__.get(_OBSERVER)
        if entry is None:
            raise LayerNotQuantizable("not observed: run quantize_ with GPTQConfig(step='observe') first")
        obs = entry[0]
        if obs.count == 0:
            raise LayerNotQuantizable("GPTQ saw no calibration input for this layer")
        weight = linear_weight(module)
        grid = WeightGrid(self.base_config, module, weight)  # LayerNotQuantizable if the base config refuses
        result = gptq_quantize(weight, obs.hessian(), grid, percdamp=self.percdamp,
                               block_size=self.gptq_quantize_block_size, act_order=self.act_order)
        report.output_mse[fqn] = (result.rtn_mse, result.mse)
        if result.notes:
            report.notes[fqn] = result.notes

        def install() -> None:
            module.weight = nn.Parameter(stored_weight(module, result.tensor), requires_grad=False)
            detach_observer(module, _OBSERVER)

        return install
