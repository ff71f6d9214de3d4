"""Record NVIDIA ModelOpt 0.47's ``mtq.quantize`` on a CNN and a transformer block (``modelopt_models.py``) for
``test_modelopt_models.py``: outputs, a digest of every quantizer's amax (float32 bytes), the enabled quantizers.

Not a test; run it beside ModelOpt in the anchors venv::

    PYTHONPATH=tests/golden /tmp/anchors/bin/python tests/golden/generate_modelopt_models.py

Writes ``modelopt_models.json`` on an AVX2 CPU, ``modelopt_models.<capability>.json`` elsewhere (the convolutions
and matmuls sum in an order that follows the vector width; on AVX-512, run it once more with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` for the AVX2 file).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _hide_stub_torchvision() -> None:
    """The anchors venv holds a stub ``torchvision`` (aimet-torch imports it), which transformers would try to use:
    tell transformers it is absent."""
    import transformers.utils.import_utils as iu

    original = iu._is_package_available

    def available(name, *args, **kwargs):
        return (False, "N/A") if name == "torchvision" else original(name, *args, **kwargs)

    iu._is_package_available = available
    for fn in ("is_torchvision_available", "is_torchvision_v2_available"):
        getattr(getattr(iu, fn, None), "cache_clear", lambda: None)()


def main() -> None:
    import torch

    warnings.filterwarnings("ignore")
    _hide_stub_torchvision()
    import modelopt
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.nn import TensorQuantizer

    from _record import pack
    from modelopt_models import MODELS, NAMED, build, custom_configs

    out = {"modelopt": modelopt.__version__, "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cases": []}
    configs = {n: getattr(mtq, n) for n in NAMED} | custom_configs()
    for model_name in MODELS:
        base, calib, x = build(model_name)
        with torch.no_grad():
            ref = base(x)
        for cfg_name, cfg in configs.items():
            model = copy.deepcopy(base)
            try:
                with torch.no_grad():
                    mtq.quantize(model, copy.deepcopy(cfg), lambda m: [m(b) for b in calib])
                    y = model(x)
            except Exception as e:  # noqa: BLE001 - recorded
                out["cases"].append({"model": model_name, "config": cfg_name, "error": f"{type(e).__name__}: {e}"})
                continue
            amax = {}
            for name, q in model.named_modules():
                if isinstance(q, TensorQuantizer) and q.is_enabled and getattr(q, "_amax", None) is not None:
                    a = q._amax.detach().float().contiguous()
                    amax[name] = {"shape": list(a.shape), "sha256": hashlib.sha256(a.numpy().tobytes()).hexdigest()}
            enabled = sorted(n for n, q in model.named_modules() if isinstance(q, TensorQuantizer) and q.is_enabled)
            out["cases"].append({"model": model_name, "config": cfg_name, "y": pack(y), "shape": list(y.shape),
                                 "ref_sqnr_db": float(10 * torch.log10(ref.pow(2).sum() / (y - ref).pow(2).sum())),
                                 "amax": amax, "enabled": enabled})
            print(model_name, cfg_name, "ok", len(enabled), "quantizers enabled")
    cap = torch.backends.cpu.get_cpu_capability()
    name = "modelopt_models.json" if cap == "AVX2" else f"modelopt_models.{cap.lower()}.json"
    with open(os.path.join(HERE, name), "w") as f:
        json.dump(out, f, indent=0)
    print("wrote", name)


if __name__ == "__main__":
    main()
