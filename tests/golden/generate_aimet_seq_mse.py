"""Record aimet-torch's Sequential MSE (``apply_seq_mse``) for ``test_aimet_seq_mse.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_seq_mse.py

Writes ``aimet_seq_mse.json`` beside itself: for each case, the weight quantizers' min and max after the search
as float32 bytes (zlib, base64). The models, data, sims (min-max ranges, AIMET's config with per-channel
weights) and per-block quantizers are rebuilt by :func:`build` and :data:`CASES` (plain torch, same seeds).
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from torch import nn

CONFIG = {"defaults": {"ops": {"is_output_quantized": "True"},
                       "params": {"is_quantized": "True", "is_symmetric": "True"},
                       "strict_symmetric": "False", "per_channel_quantization": "True"},
          "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
          "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
          "model_input": {"is_input_quantized": "True"}, "model_output": {}}

#: name -> (model kind, seed, weight bits, {layer: block size}, num_candidates, inp_symmetry, loss_fn)
CASES = {
    "mlp_symqt_mse": ("mlp", 0, 4, {}, 20, "symqt", "mse"),
    "mlp_blocks_asym_l1": ("mlp", 1, 3, {"0": 8, "2": 16}, 12, "asym", "l1"),
    "cnn_symfp_sqnr": ("cnn", 2, 4, {}, 16, "symfp", "sqnr"),
    "cnn_symqt_mse": ("cnn", 3, 4, {}, 20, "symqt", "mse"),
}


def build(kind: str, seed: int) -> tuple[nn.Module, list[torch.Tensor]]:
    """``mlp``: Linear layers on ``(batch, tokens, features)``; ``cnn``: Conv2d layers (one with stride 2)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 100)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.GELU(), nn.Linear(16, 8))
        data = [torch.randn(6, 5, 32, generator=g) for _ in range(3)]
    else:
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                              nn.Conv2d(16, 8, 1))
        data = [torch.randn(4, 3, 12, 12, generator=g) for _ in range(3)]
    return model.eval(), data


def weight_layers(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def main() -> None:
    from _record import pack, write  # beside this script (run it as one)
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.quantization.affine import QuantizeDequantize
    from aimet_torch.quantsim import QuantizationSimModel
    from aimet_torch.seq_mse import SeqMseParams, apply_seq_mse

    out = {"config": CONFIG, "cases": {}}
    for name, (kind, seed, bits, blocks, candidates, symmetry, loss) in CASES.items():
        model, data = build(kind, seed)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(CONFIG, f)
            sim = QuantizationSimModel(model, data[0], quant_scheme=QuantScheme.post_training_tf,
                                       default_param_bw=bits, config_file=path)
        for layer, size in blocks.items():
            m = sim.model.get_submodule(layer)
            out_f, in_f = m.weight.shape
            m.param_quantizers["weight"] = QuantizeDequantize((out_f, in_f // size), bits, True,
                                                              block_size=(1, size))
        params = SeqMseParams(num_batches=len(data), num_candidates=candidates, inp_symmetry=symmetry, loss_fn=loss)
        apply_seq_mse(model, sim, data, params)
        ranges = {}
        for layer in weight_layers(model):
            q = sim.model.get_submodule(layer).param_quantizers["weight"]
            ranges[layer] = {"min": pack(q.get_min()), "max": pack(q.get_max())}
        out["cases"][name] = ranges
    write("aimet_seq_mse.json", out)


if __name__ == "__main__":
    main()
