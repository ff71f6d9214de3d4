"""Record a wide sweep of AIMET's (aimet-torch 2.42) numerics for ``test_aimet_sweep.py``.

Not a test, and nothing happens on import. Run it beside AIMET in a scratch venv
(see ``generate_aimet_affine.py`` for one way to build it)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_sweep.py

It writes ``aimet_sweep.json`` next to itself (or to the path given as the first
argument). Inputs are rebuilt from seeds by :mod:`anchor_sweep` (a digest of each
is kept); outputs are stored with :func:`anchor_sweep.pack`.

* ``functional``: ``Q.affine.quantize_dequantize`` / ``quantize`` for bitwidths
  1-16 x signed/unsigned grids x symmetric/asymmetric offsets x per
  tensor/channel/block, on AIMET's division path (a scale that requires grad;
  quanta has that one path), with NaN, +-inf, +-0, subnormals and float32 limits
  in every input.
* ``modules``: ``QuantizeDequantize(shape, qmin, qmax, symmetric, block_size)``
  calibrated by MinMax over three batches: the range, scale, offset, the output of
  the last batch inside ``compute_encodings()`` (its own range) and of a fresh
  input afterwards; plus calibration batches holding NaN/+-inf.
* ``analyzers``: ``PercentileEncodingAnalyzer`` / ``SqnrEncodingAnalyzer``
  ``compute_encodings_from_stats`` at every bitwidth's ``num_steps`` (and the
  strict-symmetric ``num_steps - 1``), on histograms in quanta's bin layout.
* ``float``: ``Q.float.FloatQuantizeDequantize(e, m)`` for every ``e`` in 1-8 and
  ``m`` in 0-7 (not finite; the finite/fnuz formats AIMET supports too), over the
  whole dynamic range including subnormals and the special values, at scale 1
  and with a set ``maxval`` (AIMET's ``get_scale()`` is recorded: it is
  ``2 ** (log2(maxval) - log2(max))``); float16/bfloat16 inputs; per channel and
  per block; calibration over three batches.
"""

from __future__ import annotations

import math
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from anchor_sweep import (  # noqa: E402
    affine_input,
    calibration_batches,
    digest,
    float_input,
    pack,
    write_recording,
)

SHAPE = (4, 16)
BLOCK = 8  # elements per block along dim 1 (scale shape (4, 2))


def grid(bitwidth: int, signed: bool) -> tuple[int, int]:
    return (-(2 ** (bitwidth - 1)), 2 ** (bitwidth - 1) - 1) if signed else (0, 2**bitwidth - 1)


def scale_shape(gran: str) -> tuple[int, ...]:
    return {"tensor": (), "channel": (SHAPE[0], 1), "block": (SHAPE[0], SHAPE[1] // BLOCK)}[gran]


def block_size(gran: str):
    return (1, BLOCK) if gran == "block" else None


def affine_cases(first_seed: int):
    """``(seed, id, fields)`` for bitwidths 1-16 x unsigned/signed grids x asymmetric/symmetric x granularity."""
    seed = first_seed
    for bw in range(1, 17):
        for signed in (False, True):
            qmin, qmax = grid(bw, signed)
            for symmetric in (False, True):
                for gran in ("tensor", "channel", "block"):
                    seed += 1
                    yield seed, {"id": f"b{bw}_{'s' if signed else 'u'}_{'sym' if symmetric else 'asym'}_{gran}",
                                 "seed": seed, "bitwidth": bw, "signed": signed, "symmetric": symmetric,
                                 "gran": gran, "qmin": qmin, "qmax": qmax}


def main(out_path: str | None = None) -> None:  # noqa: C901 - a flat list of cases
    import torch

    import aimet_torch
    import aimet_torch.v2.quantization as Q
    from aimet_torch.quantization.encoding_analyzer import (
        PercentileEncodingAnalyzer,
        SqnrEncodingAnalyzer,
        _Histogram,
    )

    warnings.filterwarnings("ignore")
    A = Q.affine

    def expand(t, gran):
        """A per-block scale repeated over its block's elements (for building inputs)."""
        if gran != "block":
            return t
        return t.repeat_interleave(BLOCK, dim=1)

    def plain(t):
        return t.detach().as_subclass(torch.Tensor)

    def codes_and_values(q, y, scale, offset, gran) -> dict:
        """``q`` packed, and ``y`` too unless it is ``(q + o) * s`` in float32 bit for bit ("dq(q)")."""
        q, y = plain(q), plain(y)
        s, o = expand(plain(scale).float(), gran), expand(plain(offset).float(), gran)
        dq = (q + o) * s
        same = bool(((dq.view(torch.int32) == y.view(torch.int32)) | (dq.isnan() & y.isnan())).all())
        return {"q": pack(q), "qdq": "dq(q)" if same else pack(y)}

    # ------------------------------------------------------------------ functional
    functional = []
    for seed, case in affine_cases(1000):
        qmin, qmax, gran = case["qmin"], case["qmax"], case["gran"]
        g = torch.Generator().manual_seed(seed)
        sshape = scale_shape(gran)
        scale = (6.0 / (qmax - qmin) * (0.7 + 0.6 * torch.rand(sshape, generator=g))).float()
        if case["symmetric"]:
            offset = torch.full(sshape, float(-round((qmin + qmax) / 2)))
        else:
            offset = torch.randint(-qmax, -qmin + 1, sshape, generator=g).float()
        x = affine_input(seed, SHAPE, expand(scale, gran), expand(offset, gran), qmin, qmax)
        kw = {"qmin": qmin, "qmax": qmax}
        if block_size(gran) is not None:
            kw["block_size"] = block_size(gran)
        s_req = scale.clone().requires_grad_(True)
        with torch.enable_grad():
            qdq = A.quantize_dequantize(x, s_req, offset, **kw).detach()
        q = A.quantize(x, scale, offset, **kw)
        functional.append({**case, "scale": pack(scale), "offset": pack(offset), "input": digest(x),
                           **codes_and_values(q, qdq, scale, offset, gran)})

    # ------------------------------------------------------------------ modules
    modules = []
    for seed, case in affine_cases(5000):
        qmin, qmax, gran, bw = case["qmin"], case["qmax"], case["gran"], case["bitwidth"]
        batches = calibration_batches(seed, SHAPE, 4)
        m = A.QuantizeDequantize(scale_shape(gran), qmin, qmax, case["symmetric"], block_size=block_size(gran))
        with m.compute_encodings():
            for b in batches[:3]:
                last = m(b)
        fresh = batches[3].clone()
        fresh[0, :4] = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
        out = m(fresh)  # grad mode: min/max require grad, AIMET's division path
        kw = {"qmin": qmin, "qmax": qmax}
        if block_size(gran) is not None:
            kw["block_size"] = block_size(gran)
        s, o = m.get_scale().detach(), m.get_offset().detach()
        ls, lo = last.encoding.scale.detach(), last.encoding.offset.detach()
        modules.append({
            **case, "inputs": [digest(b) for b in batches],
            # min, max, scale, offset (each of the quantizer's shape), one after the other
            "encoding": pack(torch.stack([m.min.detach(), m.max.detach(), s, o]).float()),
            "last_batch": {"encoding": pack(torch.stack([ls, lo]).float())},
        })
        if bw <= 8:  # outputs too (wider grids: the functional cases cover the kernel)
            modules[-1]["output"] = codes_and_values(A.quantize(fresh, s, o, **kw), out, s, o, gran)
        if bw in (2, 4, 8):  # and the last batch's, quantized with its own range
            modules[-1]["last_batch"].update(codes_and_values(A.quantize(batches[2], ls, lo, **kw), last, ls, lo,
                                                              gran))

    # calibration batches with NaN / +-inf in them
    special_calibration = []
    for i, (bw, signed, symmetric, gran, what) in enumerate([
        (8, False, False, "tensor", "inf"), (8, True, True, "tensor", "inf"), (8, False, False, "channel", "inf"),
        (4, True, True, "channel", "-inf"), (8, False, False, "tensor", "nan"), (8, True, True, "channel", "nan"),
    ]):
        seed = 9000 + i
        qmin, qmax = grid(bw, signed)
        batches = calibration_batches(seed, SHAPE, 3)
        digests = [digest(b) for b in batches]
        batches[1][1, 5] = float(what)
        m = A.QuantizeDequantize(scale_shape(gran), qmin, qmax, symmetric, block_size=block_size(gran))
        with m.compute_encodings():
            for b in batches:
                m(b)
        special_calibration.append({
            "id": f"b{bw}_{'sym' if symmetric else 'asym'}_{gran}_{what}", "seed": seed, "bitwidth": bw,
            "signed": signed, "symmetric": symmetric, "gran": gran, "qmin": qmin, "qmax": qmax, "special": what,
            "inputs": digests, "min": pack(m.min.detach()), "max": pack(m.max.detach()),
        })

    # ------------------------------------------------------------------ analyzers (from statistics)
    def layout_for(lo: float, hi: float, num_bins: int) -> tuple[int, int]:
        e = math.ceil(math.log2(max(hi - lo, 1e-30) / num_bins)) - 1
        while math.floor(hi / 2.0**e) - math.floor(lo / 2.0**e) + 1 > num_bins:
            e += 1
        return e, math.floor(lo / 2.0**e)

    num_bins = 128
    g = torch.Generator().manual_seed(77)
    rows = [torch.randn(3000, generator=g), torch.randn(3000, generator=g).clamp_min(0) * 2,
            torch.randn(3000, generator=g).exp() - 0.7, -torch.rand(3000, generator=g) * 3 - 0.25]
    hists = []
    for x in rows:
        x = x.double()
        lo, hi = float(x.min()), float(x.max())
        e, start = layout_for(lo, hi, num_bins)
        counts = torch.bincount(torch.floor(x / 2.0**e).long() - start, minlength=num_bins)[:num_bins]
        hists.append({"exponent": e, "start": start, "counts": counts.tolist(),
                      "min": float(x.min()).hex(), "max": float(x.max()).hex(),
                      "edge_min": (start * 2.0**e).hex(), "edge_max": ((start + num_bins) * 2.0**e).hex()})

    def aimet_stats(edges_as_range: bool):
        out = []
        for h in hists:
            w = 2.0 ** h["exponent"]
            edges = (torch.arange(num_bins + 1, dtype=torch.float64) + h["start"]) * w
            lo, hi = (h["edge_min"], h["edge_max"]) if edges_as_range else (h["min"], h["max"])
            out.append(_Histogram(torch.tensor(h["counts"], dtype=torch.float32), edges.float(),
                                  torch.tensor(float.fromhex(lo), dtype=torch.float32),
                                  torch.tensor(float.fromhex(hi), dtype=torch.float32)))
        return out

    analyzers = []
    steps = sorted({2**b - 1 for b in range(1, 17)} | {2**b - 2 for b in range(2, 17)})
    for name, kw in (("percentile", {"percentile": 100.0}), ("percentile", {"percentile": 99.0}),
                     ("sqnr", {"gamma": 3.0})):
        stats = aimet_stats(edges_as_range=name == "percentile")
        for num_steps in steps:
            for symmetric in (False, True):
                cls = PercentileEncodingAnalyzer if name == "percentile" else SqnrEncodingAnalyzer
                a = cls((len(hists),), num_bins=num_bins, **kw)
                lo, hi = a.compute_encodings_from_stats(stats, num_steps, symmetric)
                analyzers.append({"analyzer": name, "kwargs": kw, "num_steps": num_steps, "symmetric": symmetric,
                                  "min": pack(lo.float()), "max": pack(hi.float())})

    # ------------------------------------------------------------------ float formats
    def ieee_range(e: int, m: int) -> tuple[int, int]:
        """Binades from below AIMET's smallest subnormal to above the largest value."""
        bias = 2 ** (e - 1) - 1
        return -bias - m - 3, 2 ** (e - 1) + 1

    floats = []
    n = 256
    formats = [(e, m, False, False) for e in range(1, 9) for m in range(0, 8)]
    formats += [(4, 3, True, False), (2, 1, True, False), (4, 3, True, True), (5, 2, True, True)]
    seed = 20000
    for e, m, finite, uz in formats:
        seed += 1
        fid = f"e{e}m{m}" + ("fn" if finite else "") + ("uz" if uz else "")
        try:
            q = Q.float.FloatQuantizeDequantize(exponent_bits=e, mantissa_bits=m, finite=finite, unsigned_zero=uz)
        except Exception as exc:  # (8, 0): AIMET's integer max 2**127 does not fit torch.full's int64
            floats.append({"id": fid, "exponent_bits": e, "mantissa_bits": m, "finite": finite,
                           "unsigned_zero": uz, "error": f"{type(exc).__name__}: {exc}"})
            continue
        maxval_dtype = str(q.maxval.dtype).removeprefix("torch.")
        fmax = float(q.maxval)
        lowest, highest = ieee_range(e, m)
        x = float_input(seed, n, lowest, highest, m)
        with torch.no_grad():
            out1 = q(x).as_subclass(torch.Tensor)
        # a set maxval: values relative to it over the same binades
        maxval = fmax * 0.7317 if m else fmax * 3  # (an integer for m = 0: AIMET's maxval is an int64 there)
        with torch.no_grad():
            q.maxval.copy_(torch.tensor(maxval))  # an integer maxval (m = 0) truncates it
        maxval = float(q.maxval)
        scale = q.get_scale().detach()
        x2 = (x[:128].double() * (maxval / fmax)).float()
        with torch.no_grad():
            out2 = q(x2).as_subclass(torch.Tensor)
        floats.append({"id": fid, "seed": seed, "exponent_bits": e, "mantissa_bits": m, "finite": finite,
                       "unsigned_zero": uz, "max": fmax.hex(), "maxval_dtype": maxval_dtype, "n": n, "lowest": lowest, "highest": highest,
                       "input": digest(x), "output": pack(out1),
                       "maxval": maxval.hex(), "scale": pack(scale),
                       "input_scaled": digest(x2), "output_scaled": pack(out2)})

    float_half = []
    for e, m in ((2, 1), (3, 2), (2, 3), (4, 3), (5, 2), (3, 4)):
        for dt in (torch.float16, torch.bfloat16):
            seed += 1
            q = Q.float.FloatQuantizeDequantize(exponent_bits=e, mantissa_bits=m)
            lowest, highest = ieee_range(e, m)
            x = float_input(seed, n, lowest, highest, m).to(dt)
            with torch.no_grad():
                out = q(x).as_subclass(torch.Tensor)
            float_half.append({"id": f"e{e}m{m}_{str(dt)[6:]}", "seed": seed, "exponent_bits": e,
                               "mantissa_bits": m, "dtype": str(dt)[6:], "n": n, "lowest": lowest,
                               "highest": highest, "input": digest(x), "output": pack(out)})

    float_granular = []
    for e, m in ((2, 1), (3, 2), (4, 3), (5, 2)):
        for gran in ("channel", "block"):
            seed += 1
            sshape = scale_shape(gran)
            q = Q.float.FloatQuantizeDequantize(exponent_bits=e, mantissa_bits=m, shape=sshape,
                                                block_size=block_size(gran))
            g = torch.Generator().manual_seed(seed)
            maxval = (float(q.maxval.flatten()[0]) * (0.1 + 2 * torch.rand(sshape, generator=g))).float()
            with torch.no_grad():
                q.maxval.copy_(maxval)
            lowest, highest = ieee_range(e, m)
            x = float_input(seed, SHAPE[0] * SHAPE[1], lowest, highest, m).reshape(SHAPE)
            with torch.no_grad():
                out = q(x).as_subclass(torch.Tensor)
            float_granular.append({"id": f"e{e}m{m}_{gran}", "seed": seed, "exponent_bits": e, "mantissa_bits": m,
                                   "gran": gran, "lowest": lowest, "highest": highest, "maxval": pack(maxval),
                                   "scale": pack(q.get_scale().detach()), "input": digest(x), "output": pack(out)})

    float_calibration = []
    for e, m, finite in ((2, 1, False), (3, 2, False), (2, 3, False), (4, 3, False), (5, 2, False), (1, 2, False),
                         (4, 3, True), (2, 1, True)):
        for gran in ("tensor", "channel", "block"):
            seed += 1
            q = Q.float.FloatQuantizeDequantize(exponent_bits=e, mantissa_bits=m, finite=finite,
                                                shape=scale_shape(gran), block_size=block_size(gran))
            batches = calibration_batches(seed, SHAPE, 4)
            with q.compute_encodings():
                for b in batches[:3]:
                    last = q(b)
            with torch.no_grad():
                out = q(batches[3])
            float_calibration.append({
                "id": f"e{e}m{m}{'fn' if finite else ''}_{gran}", "seed": seed, "exponent_bits": e,
                "mantissa_bits": m, "finite": finite, "gran": gran, "inputs": [digest(b) for b in batches],
                "maxval": pack(q.maxval.detach()), "scale": pack(q.get_scale().detach()),
                "last_batch_output": pack(last.detach().as_subclass(torch.Tensor)),
                "output": pack(out.as_subclass(torch.Tensor)),
            })

    doc = {
        "generator": "tests/golden/generate_aimet_sweep.py",
        "aimet_torch": getattr(aimet_torch, "__version__", "unknown"),
        "torch": torch.__version__,
        "shape": list(SHAPE), "block": BLOCK,
        "functional": functional, "modules": modules, "special_calibration": special_calibration,
        "analyzer_histograms": hists, "analyzer_num_bins": num_bins, "analyzers": analyzers,
        "float": floats, "float_half": float_half, "float_granular": float_granular,
        "float_calibration": float_calibration,
    }
    path = write_recording(doc, __file__, "aimet_sweep.json", out_path)
    print(f"wrote {path}: {len(functional)} functional, {len(modules)} module, {len(analyzers)} analyzer, "
          f"{len(floats)} float cases ({os.path.getsize(path) // 1024} KiB)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
