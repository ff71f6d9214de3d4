"""The models and configs that ``generate_modelopt_models.py`` records with ModelOpt and ``test_modelopt_models.py``
checks quanta against: a small CNN (its BatchNorm statistics settled on data), a pre-LN transformer block, and
transformers' own LlamaForCausalLM. Imported by both: torch, and transformers for the Llama model."""

from __future__ import annotations

import copy

import torch
from torch import nn
import torch.nn.functional as F


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.avg(x), 1))


class Block(nn.Module):
    """Pre-LN transformer block: attention (qkv, proj) and a GELU MLP, hidden 256 (two int4 blocks of 128)."""

    def __init__(self, d: int = 256, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Logits(nn.Module):
    """A transformers causal LM as a function of token ids to logits."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, use_cache=False).logits


def llama() -> nn.Module:
    """transformers' own LlamaForCausalLM (GQA, rotary embeddings, RMSNorm, SiLU-gated MLP), a small random config."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=2, vocab_size=256,
                                   max_position_embeddings=64)
    return Logits(transformers.LlamaForCausalLM(cfg))


MODELS = ("cnn", "block", "llama")


def build(name: str) -> tuple[nn.Module, list[torch.Tensor], torch.Tensor]:
    """``(model in eval mode, calibration batches, test input)``, the same bits on every run of torch 2.13."""
    g = torch.Generator().manual_seed(2026)
    torch.manual_seed(11)
    if name == "llama":
        model = llama().eval()
        calib = [torch.randint(0, 256, (2, 12), generator=g) for _ in range(3)]
        return model, calib, torch.randint(0, 256, (1, 8), generator=g)
    if name == "cnn":
        model = CNN()
        model.train()
        with torch.no_grad():
            for _ in range(8):  # settle the BatchNorm statistics on data
                model(torch.randn(16, 3, 16, 16, generator=g))
        model.eval()
        calib = [torch.randn(8, 3, 16, 16, generator=g) for _ in range(3)]
        x = torch.randn(4, 3, 16, 16, generator=g)
    else:
        model = Block().eval()
        calib = [torch.randn(2, 12, 256, generator=g) for _ in range(3)]
        x = torch.randn(1, 6, 256, generator=g)
    return model, calib, x


#: named configs ModelOpt runs on the CPU ("max", "smoothquant", "awq_lite"), plus custom ones in both formats
NAMED = ["INT8_DEFAULT_CFG", "INT8_WEIGHT_ONLY_CFG", "FP8_DEFAULT_CFG", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
         "INT8_SMOOTHQUANT_CFG", "INT4_AWQ_CFG", "W4A8_AWQ_BETA_CFG"]


def mtq_int4_blocks() -> list[dict]:
    """int4 weights in static blocks of 128, inputs in fp8 (so AWQ also calibrates and folds into them)."""
    return [{"quantizer_name": "*", "enable": False},
            {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 4, "block_sizes": {-1: 128, "type": "static"}}},
            {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": (4, 3)}},
            {"quantizer_name": "*lm_head*", "enable": False}]


def custom_configs() -> dict[str, dict]:
    return {
        "int4_per_channel_unsigned_inputs_legacy_dict": {
            "quant_cfg": {"default": {"enable": False},
                          "*weight_quantizer": {"num_bits": 4, "axis": 0},
                          "*input_quantizer": {"num_bits": 8, "unsigned": False, "narrow_range": True},
                          "*output_quantizer": {"enable": False},
                          "nn.BatchNorm2d": {"*": {"enable": False}}},
            "algorithm": "max"},
        "w8a8_dynamic_inputs_and_output_quantizers": {
            "quant_cfg": [{"quantizer_name": "*", "enable": False},
                          {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 8, "axis": 0}},
                          {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": 8, "type": "dynamic"}},
                          {"quantizer_name": "*fc*output_quantizer", "cfg": {"num_bits": 6}},
                          {"quantizer_name": "*", "parent_class": "nn.LayerNorm", "enable": False}],
            "algorithm": "max"},
        "smoothquant_alpha_half": {
            "quant_cfg": [{"quantizer_name": "*", "enable": False},
                          {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 8, "axis": 0}},
                          {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": 8}}],
            "algorithm": {"method": "smoothquant", "alpha": 0.5}},
        "int4_awq_clip": {"quant_cfg": copy.deepcopy(mtq_int4_blocks()), "algorithm": {"method": "awq_clip"}},
        "int4_awq_full": {"quant_cfg": copy.deepcopy(mtq_int4_blocks()),
                          "algorithm": {"method": "awq_full", "alpha_step": 0.25, "max_tokens_per_batch": 16,
                                        "max_co_batch_size": 100}},
        "int8_blocks_of_64_histogram_free": {
            "quant_cfg": [{"quantizer_name": "*", "enable": False},
                          {"quantizer_name": "*weight_quantizer",
                           "cfg": {"num_bits": 8, "block_sizes": {-1: 64, "type": "static"}}},
                          {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": (4, 3)}}],
            "algorithm": {"method": "max"}},
    }
