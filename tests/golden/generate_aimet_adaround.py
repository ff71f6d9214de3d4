"""Record aimet-torch's AdaRound (``Adaround.apply_adaround``) for ``test_aimet_adaround.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_adaround.py

Writes ``aimet_adaround.json`` beside itself: for each case, the adarounded weights of the returned model as
float32 bytes (zlib, base64) and the ``param_encodings`` of the file AIMET writes. The models, data and configs
are rebuilt by :func:`build` and :data:`CONFIGS` (plain torch, the same seeds in both venvs); torch's generator
is seeded with the case's seed right before ``apply_adaround`` (AdaRound draws its samples from it). The weight
ranges are min-max (``post_training_tf``): quanta's SQNR search bins histograms differently from AIMET's (see
docs/guides/calibrate.md), so its TF-enhanced ranges are not AIMET's bit for bit.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from torch import nn

_DEFAULTS = {"ops": {"is_output_quantized": "True"},
             "params": {"is_quantized": "True", "is_symmetric": "True"},
             "strict_symmetric": "False", "per_channel_quantization": "False"}
_BASE = {"params": {"bias": {"is_quantized": "False"}}, "op_type": {},
         "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
         "model_input": {"is_input_quantized": "True"}, "model_output": {}}

#: quantsim configs (AIMET's JSON format): weights per tensor, and per output channel
CONFIGS = {
    "per_tensor": {"defaults": _DEFAULTS, **_BASE},
    "per_channel": {"defaults": {**_DEFAULTS, "per_channel_quantization": "True"}, **_BASE},
}

#: name -> (model kind, seed, config, default_param_bw, batches, batch size, iterations, bitwidth overrides by
#: module name, ignored module names)
CASES = {
    "cnn_per_tensor_4bit": ("cnn", 0, "per_tensor", 4, 3, 8, 40, {}, []),
    "cnn_per_channel_overrides": ("cnn", 1, "per_channel", 4, 3, 16, 30, {"4": 8}, ["7"]),
    "tokens_per_channel_3bit": ("tokens", 2, "per_channel", 3, 2, 24, 30, {}, []),
}


def build(kind: str, seed: int, num_batches: int, batch_size: int) -> tuple[nn.Module, list[torch.Tensor]]:
    """The model of ``kind`` and its batches: ``cnn`` (Conv2d, ReLU, ConvTranspose2d, Linear) or ``tokens``
    (Linear layers on ``(batch, tokens, features)`` inputs with GELU between)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 100)
    if kind == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
                              nn.ConvTranspose2d(8, 6, 2, stride=2), nn.Conv2d(6, 4, 3), nn.Flatten(),
                              nn.Linear(4 * 8 * 8, 10), nn.ReLU(), nn.Linear(10, 5))
        batches = [torch.randn(batch_size, 3, 12, 12, generator=g) for _ in range(num_batches)]
    else:
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.Linear(16, 8))
        batches = [torch.randn(batch_size, 5, 16, generator=g) for _ in range(num_batches)]
    return model.eval(), batches


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {f"{n}.weight": m.weight for n, m in model.named_modules()
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear))}


def main() -> None:
    from _record import pack, write  # beside this script (run it as one)
    from aimet_torch.adaround import Adaround, AdaroundParameters
    from aimet_torch.common.defs import QuantScheme

    out = {"configs": CONFIGS, "cases": {}}
    for name, (kind, seed, config, bw, num_batches, batch_size, iterations, overrides, ignored) in CASES.items():
        model, batches = build(kind, seed, num_batches, batch_size)
        modules = dict(model.named_modules())  # AIMET's copy is the sim's; the model itself is left as it was
        with tempfile.TemporaryDirectory() as tmp:
            config_path = os.path.join(tmp, "config.json")
            with open(config_path, "w") as f:
                json.dump(CONFIGS[config], f)
            params = AdaroundParameters(batches, num_batches=num_batches, default_num_iterations=iterations)
            torch.manual_seed(seed)
            ada = Adaround.apply_adaround(model, batches[0], params, path=tmp, filename_prefix="ada",
                                          default_param_bw=bw,
                                          param_bw_override_list=[(modules[n], b) for n, b in overrides.items()],
                                          ignore_quant_ops_list=[modules[n] for n in ignored],
                                          default_quant_scheme=QuantScheme.post_training_tf,
                                          default_config_file=config_path)
            with open(os.path.join(tmp, "ada.encodings")) as f:
                encodings = json.load(f)
        out["cases"][name] = {"weights": {k: pack(w) for k, w in weights(ada).items()},
                              "param_encodings": encodings["param_encodings"]}
    write("aimet_adaround.json", out)


if __name__ == "__main__":
    main()
