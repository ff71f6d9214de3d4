"""Fake-quantization speed suite: ratios to baselines measured in the same run.

Run:  python bench/bench_fake_quant.py [--pairs 15] [--threads 2] [--size 4096] [--markdown]

Each case runs in two allocator modes, each in its own subprocess:

* ``default`` -- glibc as configured: every 64 MB result pays for fresh pages,
  so ``x.clone()`` itself is slow and hides compute;
* ``steady`` -- glibc told to keep freed memory (``MALLOC_MMAP_THRESHOLD_``,
  ``MALLOC_TRIM_THRESHOLD_``), as jemalloc/tcmalloc give PyTorch users: the
  memory roofline shows.

Figures are medians of per-pair ratios over interleaved (candidate, baseline)
pairs. Before any timing each case's output is checked bit for bit against the
reference implementation (and against the anchor library for anchor columns).
Anchor columns (AIMET's ``quantize_dequantize``, torch's fake_quantize) appear
when the package imports; otherwise they say ``n/a``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ratio  # noqa: E402

STEADY_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _setups(n: int, gen: torch.Generator):
    return {
        "per-tensor": (torch.tensor(0.02), torch.tensor(0.0), None),
        "per-channel": (torch.rand(n, 1, generator=gen) * 0.02 + 0.01, torch.zeros(n, 1), None),
        "per-block(64)": (torch.rand(n, n // 64, generator=gen) * 0.02 + 0.01, torch.zeros(n, n // 64), (-1, 64)),
    }


def _check(x, s, o, bits, block):
    from quanta.grids.affine import IntegerGrid
    from quanta.kernels.reference import quantize_dequantize_reference
    import quanta.quantization as Q

    rows = slice(0, 32)
    s_r, o_r = (s, o) if s.dim() == 0 else (s[rows], o[rows])
    got = Q.affine.quantize_dequantize(x[rows], s_r, o_r, bitwidth=bits, signed=True, block_size=block)
    ref = quantize_dequantize_reference(x[rows], s_r, o_r, IntegerGrid.from_bitwidth(bits, True), block)
    assert torch.equal(got, ref), "fast path disagrees with the reference"


def _saved_bytes_per_element(fn, x) -> float:
    """Bytes the autograd graph keeps for backward beyond references to the input itself."""
    total = 0

    def pack(t):
        nonlocal total
        if not (t.data_ptr() == x.data_ptr() and t.numel() == x.numel()):
            total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total / x.numel()


def run_mode(args) -> list[dict]:
    import quanta.quantization as Q
    from quanta.kernels import native

    torch.set_num_threads(args.threads)
    n = args.size
    gen = torch.Generator().manual_seed(0)
    rows: list[dict] = []
    setups = _setups(n, gen)
    base = torch.randn(n, n, generator=gen)
    native.library()  # build outside the timed region

    def add(section, case, r):
        rows.append({"section": section, "case": case, "ratio": r[0], "ms": r[1] * 1e3, "base_ms": r[2] * 1e3})

    # 1. QDQ forward, every granularity x bits x dtype
    for dname, dtype in DTYPES.items():
        x = base.to(dtype)
        for gname, (s, o, block) in setups.items():
            for bits in (8, 4):
                _check(x, s, o, bits, block)
                fn = lambda: Q.affine.quantize_dequantize(x, s, o, bitwidth=bits, signed=True, block_size=block)  # noqa
                add("qdq forward", f"{gname} {bits}-bit {dname}", ratio(fn, x.clone, pairs=args.pairs))

    # 2. forward + backward (input, scale and offset gradients), fp32 8-bit
    x = base
    g = torch.randn(n, n, generator=gen)
    for gname, (s0, o0, block) in setups.items():
        xs = x.clone().requires_grad_()
        s = s0.clone().requires_grad_()
        o = o0.clone().requires_grad_()

        def fwd_bwd():
            xs.grad = s.grad = o.grad = None
            Q.affine.quantize_dequantize(xs, s, o, bitwidth=8, signed=True, block_size=block).backward(g)

        add("qdq forward+backward", f"{gname} 8-bit fp32", ratio(fwd_bwd, x.clone, pairs=args.pairs))
        only_x = _saved_bytes_per_element(
            lambda: Q.affine.quantize_dequantize(xs, s0, o0, bitwidth=8, signed=True, block_size=block), xs)
        all_grads = _saved_bytes_per_element(
            lambda: Q.affine.quantize_dequantize(xs, s, o, bitwidth=8, signed=True, block_size=block), xs)
        rows.append({"section": "saved for backward", "case": f"{gname}",
                     "bytes_input_grad_only": only_x, "bytes_all_grads": all_grads})

    # 3. quantize and dequantize alone, fp32 8-bit
    for gname, (s, o, block) in setups.items():
        q = Q.affine.quantize(x, s, o, bitwidth=8, signed=True, block_size=block)
        add("quantize", f"{gname} 8-bit fp32",
            ratio(lambda: Q.affine.quantize(x, s, o, bitwidth=8, signed=True, block_size=block), x.clone,
                  pairs=args.pairs))
        add("dequantize", f"{gname} 8-bit fp32",
            ratio(lambda: Q.affine.dequantize(q, s, o, block_size=block), q.clone, pairs=args.pairs))

    # 3b. float fake-cast (FloatQuantizeDequantize's kernel), fp32, per-tensor scale
    from quanta.grids.float import FLOAT8_E4M3FN, FP4_E2M1, FloatFormat
    from quanta.kernels import float_cast

    fs = torch.tensor(0.01)
    for fmt in (FLOAT8_E4M3FN, FP4_E2M1, FloatFormat(3, 5)):
        rows_ = slice(0, 32)
        with native.disabled():
            ref = float_cast.quantize_dequantize(x[rows_], fs, fmt)
        assert torch.equal(float_cast.quantize_dequantize(x[rows_], fs, fmt), ref), "native float path disagrees"
        add("float fake-cast forward", f"{fmt.name()} fp32",
            ratio(lambda: float_cast.quantize_dequantize(x, fs, fmt), x.clone, pairs=args.pairs))
        xs = x.clone().requires_grad_()

        def float_fb():
            xs.grad = None
            float_cast.quantize_dequantize(xs, fs, fmt).backward(g)

        add("float fake-cast forward+backward", f"{fmt.name()} fp32 (input grad)",
            ratio(float_fb, x.clone, pairs=args.pairs))

    # 3c. TensorRT dialect: fake_tensor_quant (amax), fp32, per-tensor and per-channel amax
    from quanta import tensor_quant as tq
    from quanta.kernels.amax_reference import fake_tensor_quant_reference

    for aname, amax in (("per-tensor", torch.tensor(3.0)), ("per-channel", x.abs().amax(1, keepdim=True))):
        sub = slice(0, 32)
        a_sub = amax if amax.dim() == 0 else amax[sub]
        ref = fake_tensor_quant_reference(x[sub], a_sub, 8, False, True)
        assert torch.equal(tq.fake_tensor_quant(x[sub], a_sub), ref), "fake_tensor_quant disagrees with reference"
        add("fake_tensor_quant forward", f"{aname} 8-bit fp32",
            ratio(lambda: tq.fake_tensor_quant(x, amax), x.clone, pairs=args.pairs))
        xs = x.clone().requires_grad_()

        def tq_fb():
            xs.grad = None
            tq.fake_tensor_quant(xs, amax).backward(g)

        add("fake_tensor_quant forward+backward", f"{aname} 8-bit fp32 (input grad)",
            ratio(tq_fb, x.clone, pairs=args.pairs))

    # 4. per-call overhead: a calibrated quantizer vs nn.Linear(64, 64) on the same 8x64 input
    small = torch.randn(8, 64, generator=gen)
    lin = torch.nn.Linear(64, 64)
    qtzr = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    with qtzr.compute_encodings():
        qtzr(small)

    def many(fn, k=200):
        def run():
            for _ in range(k):
                fn()
        return run

    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            add("per-call overhead", f"QuantizeDequantize(8x64) vs Linear(64,64), grad={grad}",
                ratio(many(lambda: qtzr(small)), many(lambda: lin(small)), pairs=args.pairs))

    # 5. anchors
    rows += _anchor_rows(args, base, setups)
    return rows


def _anchor_rows(args, x, setups) -> list[dict]:
    import quanta.quantization as Q

    rows = []
    try:
        import aimet_torch.v2.quantization as A  # noqa: F401
    except Exception as e:  # any import failure: the column is n/a
        rows.append({"section": "vs AIMET", "case": "n/a", "note": f"aimet_torch not importable ({type(e).__name__})"})
    else:
        for gname, (s0, o0, block) in setups.items():
            s = s0.clone().requires_grad_()  # AIMET divides (as documented) only on its autograd path
            kwargs = dict(bitwidth=8, signed=True, block_size=block)
            a = A.affine.quantize_dequantize(x, s, o0, **kwargs)
            b = Q.affine.quantize_dequantize(x, s, o0, **kwargs)
            assert torch.equal(a.detach(), b.detach()), f"AIMET and quanta disagree ({gname})"
            r = ratio(lambda: A.affine.quantize_dequantize(x, s, o0, **kwargs),
                      lambda: Q.affine.quantize_dequantize(x, s, o0, **kwargs), pairs=args.pairs)
            rows.append({"section": "vs AIMET", "case": f"{gname} 8-bit fp32 forward (AIMET time / quanta time)",
                         "ratio": r[0], "ms": r[1] * 1e3, "base_ms": r[2] * 1e3})
            xg = x.clone().requires_grad_()
            g = torch.ones_like(x)

            def aimet_fb():
                A.affine.quantize_dequantize(xg, s, o0, **kwargs).backward(g)

            def quanta_fb():
                Q.affine.quantize_dequantize(xg, s, o0, **kwargs).backward(g)

            r = ratio(aimet_fb, quanta_fb, pairs=max(5, args.pairs // 3))
            rows.append({"section": "vs AIMET", "case": f"{gname} 8-bit fp32 forward+backward (AIMET / quanta)",
                         "ratio": r[0], "ms": r[1] * 1e3, "base_ms": r[2] * 1e3})
    try:
        from quanta.quantization import quant_primitives as QP
        from torchao.quantization import quant_primitives as TP
    except Exception as e:  # any import failure: the column is n/a
        rows.append({"section": "vs torchao", "case": "n/a",
                     "note": f"needs torchao and quanta.quantization.quant_primitives ({type(e).__name__})"})
    else:
        n = x.shape[-1]
        for gname, block in (("per-tensor", (x.shape[0], n)), ("per-channel", (1, n)), ("per-group(64)", (1, 64))):
            s, zp = QP.choose_qparams_affine(x, QP.MappingType.ASYMMETRIC, block, torch.uint8)
            ts, tzp = TP.choose_qparams_affine(x, TP.MappingType.ASYMMETRIC, block, torch.uint8)
            assert torch.equal(s, ts) and torch.equal(zp, tzp), f"choose_qparams_affine disagrees ({gname})"

            def q_fn(P=QP, s=s, zp=zp, block=block):
                q = P.quantize_affine(x, block, s, zp, torch.uint8)
                return P.dequantize_affine(q, block, s, zp, torch.uint8)

            a, b = q_fn(TP), q_fn(QP)
            assert torch.equal(a, b), f"torchao and quanta disagree ({gname})"
            r = ratio(lambda: q_fn(TP), lambda: q_fn(QP), pairs=args.pairs)
            rows.append({"section": "vs torchao", "case": f"{gname} uint8 quantize_affine+dequantize_affine "
                         "(torchao time / quanta time)", "ratio": r[0], "ms": r[1] * 1e3, "base_ms": r[2] * 1e3})
    # torch's own fused kernel, for orientation only: it multiplies by 1/scale, so its bits differ at ties
    s, o = setups["per-tensor"][0].item(), 0
    r = ratio(lambda: torch.fake_quantize_per_tensor_affine(x, s, o, -128, 127),
              lambda: Q.affine.quantize_dequantize(x, setups["per-tensor"][0], setups["per-tensor"][1], 8, True),
              pairs=args.pairs)
    rows.append({"section": "vs torch.fake_quantize_per_tensor_affine", "case": "per-tensor 8-bit fp32 (torch / quanta)",
                 "ratio": r[0], "ms": r[1] * 1e3, "base_ms": r[2] * 1e3})
    return rows


def _table(mode_rows: dict[str, list[dict]]) -> str:
    modes = list(mode_rows)
    sections: dict[str, list] = {}
    for r in mode_rows[modes[0]]:
        sections.setdefault(r["section"], []).append((r["section"], r["case"]))
    keys = [k for ks in sections.values() for k in ks]
    index = {m: {(r["section"], r["case"]): r for r in rows} for m, rows in mode_rows.items()}
    out = []
    section = None
    for key in keys:
        if key[0] != section:
            section = key[0]
            if section == "saved for backward":
                out.append(f"\n**{section}** (bytes per element beyond the input itself)\n")
                out.append("| case | input grad only | input + scale + offset grads |")
                out.append("|---|---|---|")
            else:
                out.append(f"\n**{section}**\n")
                out.append("| case | " + " | ".join(f"{m} ratio (ms / baseline ms)" for m in modes) + " |")
                out.append("|---|" + "---|" * len(modes))
        r0 = index[modes[0]][key]
        if section == "saved for backward":
            out.append(f"| {key[1]} | {r0['bytes_input_grad_only']:.2f} | {r0['bytes_all_grads']:.2f} |")
        elif "ratio" not in r0:
            out.append(f"| {key[1]} | " + " | ".join(r0.get("note", "") for _ in modes) + " |")
        else:
            cells = []
            for m in modes:
                r = index[m].get(key)
                cells.append("n/a" if r is None or "ratio" not in r else
                             f"{r['ratio']:.2f} ({r['ms']:.1f} / {r['base_ms']:.1f})")
            out.append(f"| {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--mode", choices=["default", "steady"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args)))
        return
    results = {}
    for mode in ("default", "steady"):
        env = {**os.environ, **(STEADY_ENV if mode == "steady" else {})}
        cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--threads", str(args.threads),
               "--pairs", str(args.pairs), "--size", str(args.size)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"benchmark in mode {mode} failed:\n{proc.stderr}")
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"# fake-quant suite: {args.size}x{args.size}, {args.threads} threads, median of {args.pairs} "
          f"interleaved pairs; torch {torch.__version__}")
    print("Ratios are candidate time / baseline time (x.clone() unless the row says otherwise).")
    print(_table(results))


if __name__ == "__main__":
    main()
