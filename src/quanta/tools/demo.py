"""``quanta demo``: one small model through every quantization scheme quanta simulates.

Trains a small CNN on scikit-learn's bundled handwritten digits (8×8 images,
1,797 samples, no download), then evaluates it in float and under W8A8
per-tensor, W8A8 per-channel, W4A8 per-block, float8 (e4m3) and W4A8 with QAT.
Prints a table (accuracy, weight storage in bytes, simulated forward time vs
float) and writes a per-layer SQNR plot of the W8A8 per-channel model.
Needs the ``demo`` extra: ``pip install 'quanta[demo]'``.

>>> cfg = DemoConfig(epochs=1, qat_epochs=1, plot=None, progress=False)
>>> rows = run_demo(cfg)                                     # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quanta.tools.measure import sqnr_db, time_ratio, weight_bytes

__all__ = ["DemoConfig", "DemoRow", "DigitsCNN", "format_table", "load_digits_data", "run_demo"]


@dataclass(frozen=True)
class DemoConfig:
    """Settings of ``quanta demo`` (the CLI's flags default to these)."""

    epochs: int = 15
    qat_epochs: int = 4
    batch_size: int = 64
    seed: int = 0
    plot: Path | None = Path("quanta-demo-sqnr.png")
    progress: bool = True


@dataclass(frozen=True)
class DemoRow:
    """One scheme's results: test accuracy, weight storage, forward time / float's, output SQNR vs float
    (``inf`` for float itself, NaN after QAT, whose weights are retrained)."""

    scheme: str
    accuracy: float
    weight_bytes: int
    time_ratio: float
    output_sqnr_db: float


class DigitsCNN(nn.Module):
    """1×8×8 digits → 10 logits: conv-BN-ReLU ×2, max-pool, conv-ReLU, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(32, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = F.relu(self.conv3(x))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def load_digits_data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_train, y_train, x_test, y_test)``: scikit-learn's digits scaled to [0, 1], a fixed 75/25 split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("quanta demo needs scikit-learn for its bundled digits: pip install 'quanta[demo]'") from None
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm], y[perm]
    n_train = int(0.75 * len(y))
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _batches(x: torch.Tensor, y: torch.Tensor, size: int, gen: torch.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    perm = torch.randperm(len(y), generator=gen)
    for i in range(0, len(y), size):
        idx = perm[i:i + size]
        yield x[idx], y[idx]


def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float, cfg: DemoConfig) -> None:
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(epochs):
        for xb, yb in _batches(x, y, cfg.batch_size, gen):
            opt.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
    model.eval()


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    return float((model(x).argmax(dim=1) == y).float().mean())


@dataclass
class _Scheme:
    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    qat: bool = False


def _schemes() -> list[_Scheme]:
    from quanta.quantsim import QuantSimConfig

    default = QuantSimConfig.load().to_dict()
    per_tensor = copy.deepcopy(default)
    per_tensor["defaults"]["per_channel_quantization"] = False
    per_block = copy.deepcopy(default)  # blocks of 16 input channels on the linear layers (94% of the weights)
    per_block.setdefault("op_type", {}).setdefault("Gemm", {}).setdefault("params", {})["weight"] = {"block_size": 16}
    return [
        _Scheme("W8A8 per-tensor", {"config_file": per_tensor}),
        _Scheme("W8A8 per-channel", {}),
        _Scheme("W4A8 per-block 16", {"config_file": per_block, "default_param_bw": 4}),
        _Scheme("FP8 e4m3 W+A", {"default_data_type": float, "default_param_bw": 8, "default_output_bw": 8}),
        _Scheme("W4A8 QAT", {"default_param_bw": 4, "quant_scheme": "range_learning_min_max"}, qat=True),
    ]


def run_demo(cfg: DemoConfig = DemoConfig(), *, log: Callable[[str], None] = print) -> list[DemoRow]:
    """Run the demo and return its rows (the CLI prints them with :func:`format_table`)."""
    from quanta.quantsim import QuantizationSimModel
    from quanta._progress import make_bar

    torch.manual_seed(cfg.seed)
    x_train, y_train, x_test, y_test = load_digits_data(cfg.seed)
    schemes = _schemes()
    bar = make_bar(2 + len(schemes), enabled=cfg.progress, desc="quanta demo")
    model = DigitsCNN()
    _train(model, x_train, y_train, cfg.epochs, 3e-3, cfg)
    bar.advance()
    with torch.no_grad():
        ref = model(x_test)
    rows = [DemoRow("float32", _accuracy(model, x_test, y_test), weight_bytes(model), 1.0, float("inf"))]
    calib = [x_train[i:i + 256] for i in range(0, 1024, 256)]
    report_sim = None
    for scheme in schemes:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            sim = QuantizationSimModel(model, x_test[:1], **scheme.kwargs)
        sim.compute_encodings(calib, progress=False)
        if scheme.qat:
            _train(sim.model, x_train, y_train, cfg.qat_epochs, 5e-4, cfg)
        with torch.no_grad():
            out = sim.model(x_test)
        # after QAT the weights differ from the float model's: SQNR against it would measure retraining
        sqnr = float("nan") if scheme.qat else sqnr_db(ref, out)
        rows.append(DemoRow(scheme.name, _accuracy(sim.model, x_test, y_test), weight_bytes(sim.model),
                            time_ratio(sim.model, model, x_test), sqnr))
        if scheme.name == "W8A8 per-channel":
            report_sim = sim
        bar.advance()
    if cfg.plot is not None and report_sim is not None:
        report = report_sim.layer_sqnr([x_test])
        report.plot(str(cfg.plot), title="quanta demo: W8A8 per-channel, per-layer SQNR")
        log(f"per-layer SQNR plot written to {cfg.plot}")
    bar.advance()
    bar.close()
    return rows


def format_table(rows: list[DemoRow]) -> str:
    """Fixed-width table of the demo's rows."""
    base = rows[0].weight_bytes
    lines = [f"{'scheme':<20} {'accuracy':>8} {'weights (bytes)':>15} {'vs fp32':>7} {'SQNR dB':>8} {'sim time':>8}"]
    for r in rows:
        sq = f"{r.output_sqnr_db:.1f}" if math.isfinite(r.output_sqnr_db) else "-"
        lines.append(f"{r.scheme:<20} {100 * r.accuracy:>7.1f}% {r.weight_bytes:>15,} {r.weight_bytes / base:>7.3f} "
                     f"{sq:>8} {r.time_ratio:>7.2f}x")
    return "\n".join(lines)
