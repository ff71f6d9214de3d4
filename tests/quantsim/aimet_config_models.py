"""The two models on which quanta's placement is compared with AIMET's for each of AIMET's quantsim config files.

Plain torch (no quanta import): ``tests/golden/generate_aimet_quantsim_configs.py`` builds them in the anchor
venv, ``tests/quantsim/test_aimet_configs.py`` in quanta's. Between them they contain every op type the
shipped files name that a torch model of this size can hold:

* ``ConfigCNN``: Conv -> BatchNorm -> ReLU, Conv -> ReLU6 (``Clip``), a depthwise Conv, an elementwise add
  -> ReLU, MaxPool, Conv -> GroupNorm -> Sigmoid gating a multiply, global average pooling,
  Linear -> ReLU, Linear -> Tanh;
* ``ConfigTransformer``: token ids -> Embedding (``Gather``) -> a pre-LN attention block (LayerNorm,
  q/k/v Linear, MatMul, a multiply by the constant 1/sqrt(d), Softmax, MatMul, Linear, residual Add) -> a
  LayerNorm -> GELU MLP with its residual add.

Head shapes come from constants fixed at construction (``unflatten``/``flatten``), so tracing leaves no shape
arithmetic in the graph (AIMET's model preparer would otherwise turn ``d // h`` into a quantized module).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class ConfigCNN(nn.Module):
    """``(N, 3, 16, 16)`` images -> 10 values in (-1, 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu6 = nn.ReLU6()
        self.dwconv = nn.Conv2d(8, 8, 3, padding=1, groups=8)  # depthwise
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(8, 8, 1)
        self.gn = nn.GroupNorm(2, 8)
        self.sigmoid = nn.Sigmoid()
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(8, 16)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(16, 10)
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        y = self.dwconv(self.relu6(self.conv2(x)))
        x = self.pool(self.relu2(x + y))
        x = x * self.sigmoid(self.gn(self.conv3(x)))
        x = torch.flatten(self.gap(x), 1)
        return self.tanh(self.fc2(self.relu3(self.fc1(x))))


class ConfigTransformer(nn.Module):
    """``(N, T)`` token ids -> ``(N, T, dim)``: an embedding and one pre-LN encoder block."""

    def __init__(self, vocab: int = 50, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.embed = nn.Embedding(vocab, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        h = self.ln1(x)
        q, k, v = self._split(self.q(h)), self._split(self.k(h)), self._split(self.v(h))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        out = torch.matmul(self.softmax(scores), v).transpose(1, 2).flatten(2)
        x = x + self.proj(out)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


def make_inputs(model: str, n: int = 4, seed: int = 0) -> torch.Tensor:
    """A calibration batch for ``"cnn"`` or ``"transformer"``."""
    g = torch.Generator().manual_seed(seed)
    if model == "cnn":
        return torch.randn(n, 3, 16, 16, generator=g)
    return torch.randint(0, 50, (n, 8), generator=g)


def make_model(model: str, seed: int = 0) -> nn.Module:
    """``ConfigCNN`` or ``ConfigTransformer`` with weights drawn from ``seed``, in eval mode.

    The norms' affine parameters and BatchNorm statistics are drawn too (as trained ones are): at their
    initial values (weights all 1) AIMET would take a weight for one already quantized with scale 1."""
    torch.manual_seed(seed)
    net = ConfigCNN() if model == "cnn" else ConfigTransformer()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    return net.eval()
