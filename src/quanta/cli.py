"""The ``quanta`` command line.

``quanta demo`` runs the main job (see :mod:`quanta.tools.demo`). Errors print
one line and exit with status 2 (bad usage or input) or 1 (failure); ``--debug``
shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


class CLIError(Exception):
    """An error to report to the user as one line (exit status 2)."""


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

    from quanta.tools.demo import DemoConfig, format_table, run_demo, with_overrides

    if args.threads:
        torch.set_num_threads(args.threads)
    plot = None if args.no_plot else (Path(args.plot) if args.plot else DemoConfig.plot)
    cfg = with_overrides(DemoConfig(), epochs=args.epochs, qat_epochs=args.qat_epochs, seed=args.seed)
    cfg = with_overrides(cfg, progress=not args.no_progress)
    from dataclasses import replace

    cfg = replace(cfg, plot=plot)
    rows = run_demo(cfg, log=lambda msg: print(msg, file=sys.stderr))
    print(format_table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``quanta`` (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(prog="quanta", description="Quantization for PyTorch: simulate, store, export.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
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
        print(f"quanta {args.command}: error: {e}", file=sys.stderr)
        return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
