"""``quanta.modelopt.quantize`` against NVIDIA ModelOpt 0.47's ``mtq.quantize`` (``generate_modelopt_models.py``):
a CNN and a transformer block under every named config ModelOpt calibrates on the CPU with "max", and custom
configs in both config formats; outputs, every amax and the set of enabled quantizers, bit for bit."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

import quanta.modelopt as mtq
from _record import golden_path, unpack
from modelopt_models import build, custom_configs

pytest.importorskip("transformers")

with open(golden_path("modelopt_models.json")) as _f:
    GOLDEN = json.load(_f)

CONFIGS = {n: getattr(mtq, n) for n in mtq.choices} | custom_configs()


@pytest.mark.parametrize("case", [c for c in GOLDEN["cases"] if "error" not in c],
                         ids=lambda c: f"{c['model']}-{c['config']}")
def test_quantize_matches_modelopt(case):
    model, calib, x = build(case["model"])
    with torch.no_grad():
        mtq.quantize(model, copy.deepcopy(CONFIGS[case["config"]]), lambda m: [m(b) for b in calib])
        y = model(x)
    enabled = sorted(n for n, q in model.named_modules() if isinstance(q, mtq.TensorQuantizer) and q.is_enabled)
    assert enabled == case["enabled"]
    for name, a in case["amax"].items():
        got = model.get_submodule(name).amax
        assert got is not None and list(got.shape) == a["shape"], name
        assert hashlib.sha256(got.detach().float().contiguous().numpy().tobytes()).hexdigest() == a["sha256"], name
    assert torch.equal(y, unpack(case["y"], case["shape"]))


def test_the_recording_covers_the_cpu_configs():
    done = {(c["model"], c["config"]) for c in GOLDEN["cases"] if "error" not in c}
    for model in ("cnn", "block", "llama"):
        for name in ("INT8_DEFAULT_CFG", "INT8_WEIGHT_ONLY_CFG", "FP8_DEFAULT_CFG", "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
                     "INT8_SMOOTHQUANT_CFG", "INT4_AWQ_CFG", "W4A8_AWQ_BETA_CFG"):
            assert (model, name) in done
