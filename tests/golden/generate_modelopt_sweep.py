"""Record a wide sweep of NVIDIA ModelOpt 0.47's tensor quantization for ``test_modelopt_sweep.py``.

Not a test, and nothing happens on import. Run it beside ModelOpt in a scratch venv::

    /tmp/anchors/bin/python tests/golden/generate_modelopt_sweep.py

It writes ``modelopt_sweep.json`` next to itself (or to the path given as the first
argument). Inputs are rebuilt from seeds by :mod:`anchor_sweep` (a digest of each
is kept); outputs are stored with :func:`anchor_sweep.pack`. ModelOpt's CPU paths
are the ones recorded (``_tensor_quant`` and ``fp8_eager``).

* ``fake``: ``fake_tensor_quant(x, amax, None, num_bits, unsigned, narrow_range)``
  for num_bits 1-16 x signed/unsigned x narrow/full range x per tensor/channel/
  block amax (one channel with amax 0), with NaN, +-inf, +-0 and subnormals. The
  output is stored as float32 codes ``round(out * max_bound / amax)`` where
  ``codes / scale`` gives it back bit for bit (``"codes"``), else raw.
* ``e4m3``: ``scaled_e4m3(x, amax, None, 4, 3)`` per tensor/channel/block over the
  whole e4m3 range relative to amax (subnormals and beyond), special values, a zero amax.
* ``calibrators``: ``MaxCalibrator`` and ``HistogramCalibrator`` (percentile, mse,
  entropy) over three batches, signed and unsigned, per tensor and per channel (max).
"""

from __future__ import annotations

import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from anchor_sweep import (  # noqa: E402
    calibration_batches,
    digest,
    float_input,
    pack,
    signed_specials_input,
    write_recording,
)

SHAPE = (4, 32)
BLOCK = 8


def amax_for(x, gran: str):
    """Amax per tensor / channel (4, 1) / block (4, 4, 1) at 0.8x the finite absmax (so some values clip),
    channel/block row 3 set to 0 (the amax <= 2**-24 rule)."""
    import torch

    a = x.nan_to_num(0.0, posinf=0.0, neginf=0.0).abs()
    if gran == "tensor":
        return (a.amax() * 0.8).reshape(())
    if gran == "channel":
        m = a.amax(1, keepdim=True) * 0.8
    else:
        m = a.reshape(SHAPE[0], -1, BLOCK).amax(2, keepdim=True) * 0.8
    m[3] = 0.0
    return m


def shaped(x, gran: str):
    return x.reshape(SHAPE[0], -1, BLOCK) if gran == "block" else x


def main(out_path: str | None = None) -> None:  # noqa: C901 - a flat list of cases
    import torch

    import modelopt
    from modelopt.torch.quantization import calib
    from modelopt.torch.quantization import tensor_quant as tq

    warnings.filterwarnings("ignore")

    def err(e: Exception) -> str:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    # ------------------------------------------------------------------ integer fake quantization
    fake = []
    seed = 60000
    for bits in range(1, 17):
        for unsigned in (False, True):
            for narrow in (False, True):
                for gran in ("tensor", "channel", "block"):
                    seed += 1
                    x = signed_specials_input(seed, SHAPE, unsigned)
                    amax = amax_for(x, gran)
                    case = {"id": f"b{bits}_{'u' if unsigned else 's'}_{'narrow' if narrow else 'full'}_{gran}",
                            "seed": seed, "num_bits": bits, "unsigned": unsigned, "narrow_range": narrow,
                            "gran": gran, "input": digest(x), "amax": pack(amax)}
                    try:
                        out = tq.fake_tensor_quant(shaped(x, gran), amax, None, bits, unsigned, narrow)
                        out = out.reshape(SHAPE)
                        max_bound = torch.tensor(2.0 ** (bits - 1 + int(unsigned)) - 1.0)
                        a = amax.float() if gran != "block" else amax
                        scale = (max_bound / a).reshape(amax.shape)
                        scale = torch.where(scale.isinf() | (a <= 2.0**-24), torch.ones_like(scale), scale)
                        s = scale.reshape(SHAPE[0], -1, 1).expand(SHAPE[0], -1, BLOCK).reshape(SHAPE) \
                            if gran == "block" else scale
                        codes = torch.round(out * s)
                        same = (codes / s).view(torch.int32) == out.view(torch.int32)
                        same |= (codes / s).isnan() & out.isnan()
                        case["output"] = {"codes": pack(codes)} if bool(same.all()) else pack(out)
                    except Exception as e:  # noqa: BLE001
                        case["error"] = err(e)
                    fake.append(case)

    # ------------------------------------------------------------------ e4m3
    e4m3 = []
    seed = 70000
    for gran in ("tensor", "channel", "block"):
        for zero_amax in (False, True):
            seed += 1
            x = float_input(seed, SHAPE[0] * SHAPE[1], -12, 10, 3).reshape(SHAPE)  # e4m3's range and beyond
            amax = amax_for(x, gran) if zero_amax else amax_for(x, gran).abs().clamp_min(1.0)
            if gran == "tensor" and zero_amax:
                amax = torch.tensor(0.0)
            case = {"id": f"{gran}{'_zero_amax' if zero_amax else ''}", "seed": seed, "gran": gran,
                    "zero_amax": zero_amax, "input": digest(x), "amax": pack(amax)}
            try:
                case["output"] = pack(tq.scaled_e4m3(shaped(x, gran), amax, None, 4, 3).reshape(SHAPE))
            except Exception as e:  # noqa: BLE001
                case["error"] = err(e)
            e4m3.append(case)

    # ------------------------------------------------------------------ calibrators
    calibrators = []
    seed = 80000
    for unsigned in (False, True):
        for axis in (None, 0):
            seed += 1
            batches = [b.abs() if unsigned else b for b in calibration_batches(seed, SHAPE, 3)]
            c = calib.MaxCalibrator(num_bits=8, axis=axis, unsigned=unsigned)
            for b in batches:
                c.collect(b)
            calibrators.append({"id": f"max_{'u' if unsigned else 's'}_{'tensor' if axis is None else 'channel'}",
                                "seed": seed, "kind": "max", "unsigned": unsigned, "axis": axis,
                                "inputs": [digest(b) for b in batches], "amax": pack(c.compute_amax().float())})
        seed += 1
        batches = [b.abs() if unsigned else b for b in calibration_batches(seed, SHAPE, 3)]
        for method, kw in (("percentile", {"percentile": 99.9}), ("percentile", {"percentile": 99.99}),
                           ("mse", {}), ("entropy", {})):
            c = calib.HistogramCalibrator(num_bits=8, axis=None, unsigned=unsigned)
            for b in batches:
                c.collect(b)
            amax = c.compute_amax(method, **kw)
            calibrators.append({"id": f"hist_{method}{kw.get('percentile', '')}_{'u' if unsigned else 's'}",
                                "seed": seed, "kind": "histogram", "method": method, "kwargs": kw,
                                "unsigned": unsigned, "inputs": [digest(b) for b in batches],
                                "amax": pack(torch.as_tensor(amax).float())})

    doc = {
        "generator": "tests/golden/generate_modelopt_sweep.py",
        "modelopt": modelopt.__version__, "torch": torch.__version__,
        "shape": list(SHAPE), "block": BLOCK, "fake": fake, "e4m3": e4m3, "calibrators": calibrators,
    }
    path = write_recording(doc, __file__, "modelopt_sweep.json", out_path)
    n_err = sum("error" in c for c in fake + e4m3)
    print(f"wrote {path}: {len(fake)} fake, {len(e4m3)} e4m3, {len(calibrators)} calibrator cases, {n_err} errors "
          f"({os.path.getsize(path) // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
