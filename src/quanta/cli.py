"""The ``quanta`` command line.

``quanta demo`` runs the main job (see :mod:`quanta.tools.demo`); ``quanta inspect FILE``
describes an encodings, ONNX or safetensors file (:mod:`quanta.tools.inspect_file`);
``quanta quantize MODEL --calib DATA --out DIR`` calibrates a saved model and writes its
encodings, ONNX graph and fake-quantized weights (:mod:`quanta.tools.quantize_model`); given a transformers
checkpoint directory and ``--algorithm gptq|awq|smoothquant|rtn`` it writes the quantized checkpoint instead,
one block in memory at a time (:mod:`quanta.tools.quantize_checkpoint`);
``quanta bench MODEL --data DATA`` compares simulated and real-storage quantization schemes on that model
(output SQNR, weight bytes, latency; :mod:`quanta.tools.bench_model`).
Errors print one line and exit with status 2 (bad usage or input) or 1 (failure);
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

__all__ = ["main"]


class CLIError(Exception):
    """An error to report to the user as one line (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line (``quanta quantize: error: ...``) plus where to find help, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _with_overrides(cfg: Any, **kwargs: Any) -> Any:
    """The frozen config dataclass ``cfg`` with the flags the user gave (None: not given, keep the default)."""
    return replace(cfg, **{k: v for k, v in kwargs.items() if v is not None})


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _cmd_demo(args: argparse.Namespace) -> int:
    import torch

    from quanta.tools.demo import DemoConfig, format_table, run_demo

    if args.threads:
        torch.set_num_threads(args.threads)
    plot = None if args.no_plot else (Path(args.plot) if args.plot else DemoConfig.plot)
    cfg = replace(_with_overrides(DemoConfig(), epochs=args.epochs, qat_epochs=args.qat_epochs, seed=args.seed),
                  progress=not args.no_progress, plot=plot)
    rows = run_demo(cfg, log=lambda msg: print(msg, file=sys.stderr))
    print(format_table(rows))
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    import json

    from quanta.tools.inspect_file import format_report, inspect_file

    report = inspect_file(args.file)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _cmd_quantize(args: argparse.Namespace) -> int:
    from quanta.tools.quantize_model import QuantizeConfig, format_summary, quantize_model

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if Path(args.model).is_dir():
        return _quantize_checkpoint(args)
    checkpoint_only = {"--algorithm": args.algorithm, "--weights": args.weights, "--group-size": args.group_size,
                       "--seq-len": args.seq_len}
    given = [flag for flag, v in checkpoint_only.items() if v is not None]
    if given:
        raise CLIError(f"{', '.join(given)} apply to a transformers checkpoint directory; {args.model} is a file")
    cfg = _with_overrides(QuantizeConfig(), scheme=args.scheme, param_bw=args.param_bw, output_bw=args.output_bw,
                         encoding_version=args.encoding_version, model_class=args.model_class,
                         batch_size=args.batch_size, num_batches=args.num_batches,
                         config_file=Path(args.config) if args.config else None)
    cfg = _with_overrides(cfg, onnx=not args.no_onnx, progress=not args.no_progress, fold_batch_norms=args.fold_bn)
    result = quantize_model(args.model, args.calib, args.out, cfg,
                            log=lambda msg: print(f"quanta quantize: {msg}", file=sys.stderr))
    print(format_summary(result))
    return 0


def _quantize_checkpoint(args: argparse.Namespace) -> int:
    from quanta.tools.quantize_checkpoint import quantize_checkpoint

    simulation_only = {"--model-class": args.model_class, "--config": args.config, "--scheme": args.scheme,
                       "--param-bw": args.param_bw, "--output-bw": args.output_bw,
                       "--encoding-version": args.encoding_version}
    given = [flag for flag, v in simulation_only.items() if v is not None]
    given += [flag for flag, v in (("--fold-bn", args.fold_bn), ("--no-onnx", args.no_onnx)) if v]
    if given:
        raise CLIError(f"{', '.join(given)} apply to simulation of a model file, not to a checkpoint directory")
    if args.algorithm is None:
        raise CLIError(f"{args.model} is a checkpoint directory: choose --algorithm gptq, awq, smoothquant or rtn")
    result = quantize_checkpoint(args.model, args.calib, args.out, algorithm=args.algorithm, weights=args.weights,
                                 group_size=args.group_size or 128, seq_len=args.seq_len or 512,
                                 batch_size=args.batch_size or 4, num_batches=args.num_batches,
                                 progress=not args.no_progress,
                                 log=lambda msg: print(f"quanta quantize: {msg}", file=sys.stderr))
    print(result.report)
    print(f"wrote {result.out_dir} (load it with quanta.load_pretrained)")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import json

    from quanta.tools.bench_model import BenchConfig, bench_model, format_bench

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cfg = _with_overrides(BenchConfig(), model_class=args.model_class, batch_size=args.batch_size,
                          num_batches=args.num_batches, config_file=Path(args.config) if args.config else None)
    cfg = replace(cfg, progress=not args.no_progress)
    result = bench_model(args.model, args.data, cfg, eval_path=args.eval)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_bench(result))
    return 0


def _parsed(parse):  # a tools/ parser as an argparse type: its ValueError becomes a one-line usage error
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


def _add_model_arguments(p: argparse.ArgumentParser, qm: Any, batch_help: str, model_help: str = "") -> None:
    """MODEL and the flags that say how to load it and batch its data (shared by quantize and bench)."""
    from quanta.tools.model_files import check_model_class

    p.add_argument("model", metavar="MODEL",
                   help="a torch.export program (.pt2) or a state dict (.pt/.pth, with --model-class)" + model_help)
    p.add_argument("--model-class", type=_parsed(check_model_class),
                   metavar="MODULE:CLASS", help="the nn.Module class of a state dict, e.g. mypkg.nets:TinyNet")
    p.add_argument("--batch-size", type=_positive_int,
                   help=f"{batch_help} (default {qm.DEFAULT_BATCH_SIZE}, or a torch.export program's static "
                        "batch size)")
    p.add_argument("--num-batches", type=_positive_int, help="calibrate on the first N batches (default all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--threads", type=_positive_int, help="torch threads (default: torch's)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``quanta`` (exposed for tests and docs)."""
    parser = _Parser(prog="quanta", description="Quantization for PyTorch: simulate, store, export.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    demo = sub.add_parser("demo", help="train a small CNN on the bundled digits and compare quantization schemes")
    demo.add_argument("--epochs", type=_positive_int, help="float training epochs (default 15)")
    demo.add_argument("--qat-epochs", type=_positive_int, help="QAT epochs (default 4)")
    demo.add_argument("--seed", type=int, help="random seed (default 0)")
    demo.add_argument("--threads", type=_positive_int, help="torch threads (default: torch's)")
    demo.add_argument("--plot", help="where to write the per-layer SQNR plot (default quanta-demo-sqnr.png)")
    demo.add_argument("--no-plot", action="store_true", help="do not write the plot")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(func=_cmd_demo)

    inspect = sub.add_parser("inspect", help="describe an encodings (AIMET or quanta), ONNX or safetensors file")
    inspect.add_argument("file", metavar="FILE", help="the file; its type is told by content")
    inspect.add_argument("--json", action="store_true", help="print a machine-readable JSON summary")
    inspect.set_defaults(func=_cmd_inspect)

    from quanta.tools import quantize_model as qm

    d = qm.QuantizeConfig()
    quantize = sub.add_parser("quantize", help="calibrate a saved model; write encodings, ONNX and quantized weights")
    quantize.add_argument("--calib", required=True, metavar="DATA",
                          help="calibration inputs: a tensor in a .pt file (or a dict with 'x'/'inputs') or a .npy; "
                               "several inputs: a .pt tuple of tensors, or a dict keyed by the forward's "
                               "parameter names")
    quantize.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    _add_model_arguments(quantize, qm, "calibration batch size (checkpoints: 4)",
                         "; or a transformers checkpoint directory, with --algorithm")
    quantize.add_argument("--config", metavar="CFG", help="quantsim config file (.json/.yaml); default: built in")
    quantize.add_argument("--scheme", type=_parsed(qm.parse_scheme),
                          help=f"calibration scheme: {', '.join(s.value for s in qm.QuantScheme)} "
                               f"(default {d.scheme.value})")
    quantize.add_argument("--param-bw", type=_parsed(qm.parse_bitwidth), help=f"weight bitwidth (default {d.param_bw})")
    quantize.add_argument("--output-bw", type=_parsed(qm.parse_bitwidth),
                          help=f"activation bitwidth (default {d.output_bw})")
    quantize.add_argument("--encoding-version", type=_parsed(qm.parse_encoding_version),
                          help=f"AIMET encodings version of model.encodings: "
                               f"{', '.join(v.value for v in qm.EncodingsVersion)} (default {d.encoding_version.value})")
    quantize.add_argument("--fold-bn", action="store_true",
                          help="fold BatchNorm layers into the Conv/Linear next to them first, as a device does "
                               "(the written weights and graph are the folded model's)")
    quantize.add_argument("--no-onnx", action="store_true", help="write model.encodings without model.onnx")
    from quanta.tools import quantize_checkpoint as qc

    quantize.add_argument("--algorithm", choices=qc.ALGORITHMS,
                          help="MODEL a transformers checkpoint directory: quantize its weights with this algorithm, "
                               "block by block (--calib: a text file, or token ids [samples, length] in .pt/.npy)")
    quantize.add_argument("--weights", choices=qc.WEIGHTS,
                          help="checkpoint weights: int4/int3 groups, int8 per row, w8a8 (int8 dynamic activations), "
                               "nvfp4 (weight-only), mxfp4/mxfp8 (MX weights and activations; rtn only); "
                               "default int4, w8a8 for smoothquant")
    quantize.add_argument("--group-size", type=_positive_int, help="checkpoint int4/int3 group size (default 128)")
    quantize.add_argument("--seq-len", type=_positive_int, help="checkpoint calibration window in tokens (default 512)")
    quantize.set_defaults(func=_cmd_quantize)

    bench = sub.add_parser("bench", help="compare quantization schemes on a saved model: SQNR, weight bytes, latency")
    bench.add_argument("--data", required=True, metavar="DATA",
                       help="calibration inputs, as quantize's --calib: a tensor in a .pt file (or a dict with "
                            "'x'/'inputs') or a .npy; several inputs: a .pt tuple of tensors, or a dict keyed by "
                            "the forward's parameter names")
    bench.add_argument("--eval", metavar="DATA2",
                       help="evaluation inputs for the SQNR and the latency, laid out as --data (default: all of "
                            "--data)")
    _add_model_arguments(bench, qm, "batch size")
    bench.add_argument("--config", metavar="CFG", help="quantsim config file of the W8A8 row; default: built in")
    bench.add_argument("--json", action="store_true", help="print the rows and notes as JSON")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``quanta`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("quanta: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001  (one clear line unless --debug)
        if args.debug:
            raise
        status = 2 if isinstance(e, (CLIError, FileNotFoundError, ValueError, TypeError, ImportError)) else 1
        message = " ".join(str(e).split()) or type(e).__name__  # one line, whatever the exception says
        print(f"quanta {args.command}: error: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
