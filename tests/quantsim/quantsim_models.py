"""The two reference models of the QuantSim tests and benchmark (issue 7).

``SmallCNN``: conv, BatchNorm, ReLU, grouped conv, pooling, linear.
``TransformerBlock``: a pre-LN encoder block written the Hugging Face way,
attention with ``torch.matmul``/``softmax`` inside ``forward``, a GELU MLP and
residual adds.

Both come with a deterministic task (``make_cnn_data``, ``make_seq_data``) so
tests can train them a little and measure accuracy and SQNR.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


#: a quantsim config (AIMET file format, as a dict): W8A8 defaults, 4-bit weights in blocks of 8 on Linear layers
W4_BLOCK_CONFIG = {
    "defaults": {
        "ops": {"is_output_quantized": "True", "is_symmetric": "False"},
        "params": {"is_quantized": "True", "is_symmetric": "True"},
        "per_channel_quantization": "True",
    },
    "params": {"bias": {"is_quantized": "False"}},
    "op_type": {"Gemm": {"params": {"weight": {"block_size": 8, "bitwidth": 4}}}},
}


class SmallCNN(nn.Module):
    """3×16×16 images → ``num_classes`` logits."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, groups=4)  # grouped
        self.bn2 = nn.BatchNorm2d(2 * width)
        self.pool = nn.MaxPool2d(2)
        self.conv3 = nn.Conv2d(2 * width, 2 * width, 3, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.bn2(self.conv2(x))))
        x = F.relu(self.conv3(x))
        return self.fc(torch.flatten(self.gap(x), 1))


class TransformerBlock(nn.Module):
    """Pre-LN encoder block on ``(batch, seq, dim)``; attention written with functional ops."""

    def __init__(self, dim: int = 32, heads: int = 4, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_ratio * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d // h)
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(out)
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class SeqClassifier(nn.Module):
    """``TransformerBlock`` plus a linear head on the mean token: a trainable task for QAT tests."""

    def __init__(self, dim: int = 32, heads: int = 4, num_classes: int = 4) -> None:
        super().__init__()
        self.block = TransformerBlock(dim, heads)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x).mean(dim=1))


class _EncoderLayer(nn.Module):
    """Post-LN BERT layer: separate q/k/v Linear layers, F.scaled_dot_product_attention, GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.ln1 = nn.LayerNorm(dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.ln2 = nn.LayerNorm(dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).permute(0, 2, 1, 3).reshape(x.shape)
        x = self.ln1(x + self.out(a))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class HFEncoder(nn.Module):
    """A Hugging Face-style encoder: ``(input_ids, attention_mask)`` in, a dict out, the additive mask made
    with ``torch.finfo(x.dtype).min`` and positions with ``torch.arange(t, device=...)``."""

    def __init__(self, vocab: int = 100, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(64, dim)
        self.ln = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([_EncoderLayer(dim, heads) for _ in range(layers)])
        self.pool = nn.Linear(dim, dim)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        t = input_ids.shape[1]
        x = self.ln(self.word(input_ids) + self.position(torch.arange(t, device=input_ids.device)))
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return {"last_hidden_state": x, "pooler_output": torch.tanh(self.pool(x[:, 0]))}


def tiny_bert(transformers) -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
    """transformers' own BertModel (one layer, hidden 16, eval mode, seed 0) and two batches of keyword inputs
    (``input_ids``, ``attention_mask``), as a user passes them. ``transformers``: the imported module."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    model = transformers.BertModel(config).eval()
    batches = [{"input_ids": torch.randint(0, 50, (4, 8)), "attention_mask": torch.ones(4, 8, dtype=torch.long)}
               for _ in range(2)]
    return model, batches


def make_token_data(n: int, seq: int = 16, vocab: int = 100, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and an attention mask whose rows end in 0-6 padding positions."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    pad = torch.randint(0, 7, (n,), generator=g)
    mask = (torch.arange(seq)[None, :] < (seq - pad)[:, None]).long()
    return ids, mask


def make_cnn_data(n: int, num_classes: int = 10, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Images whose class is the position and colour of a bright blob, with noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = 0.3 * torch.randn(n, 3, 16, 16, generator=g)
    for i in range(n):
        c = int(y[i])
        r, col = 2 + 3 * (c // 4), 2 + 3 * (c % 4)
        x[i, c % 3, r:r + 4, col:col + 4] += 1.5
    return x, y


def make_seq_data(n: int, dim: int = 32, seq: int = 16, num_classes: int = 4,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences whose class is which of ``num_classes`` directions a few tokens carry."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(num_classes, dim, generator=g)
    y = torch.randint(0, num_classes, (n,), generator=g)
    x = torch.randn(n, seq, dim, generator=g)
    x[:, :4, :] += 0.8 * dirs[y].unsqueeze(1)
    return x, y


def sqnr_db(reference: torch.Tensor, output: torch.Tensor) -> float:
    """``10·log10(Σ ref² / Σ (out − ref)²)`` in float64."""
    ref = reference.detach().double()
    err = output.detach().double() - ref
    return float(10 * torch.log10(ref.pow(2).sum() / err.pow(2).sum()))
