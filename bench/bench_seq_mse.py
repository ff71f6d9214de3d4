"""Sequential MSE wall time: quanta's ``apply_seq_mse`` beside aimet-torch's on the same model and data.

The model and data are ``bench_adaround.py``'s (transformers' ResNet, BatchNorm statistics settled on the data);
weights 4 bits per output channel with min-max ranges, every convolution searched. The chosen ranges are
compared bit for bit before the times are printed. aimet-torch is optional (see ``bench_adaround.py``)::

    PYTHONPATH=src /tmp/anchors/bin/python bench/bench_seq_mse.py
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import os
import pathlib
import tempfile
import time
import warnings

import torch

_spec = importlib.util.spec_from_file_location("bench_adaround", pathlib.Path(__file__).with_name("bench_adaround.py"))
bench_adaround = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_adaround)

_CONFIG = bench_adaround.PER_CHANNEL_CONFIG


def _sim(module, model, data, bits, tmp):
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(_CONFIG, f)
    if module == "quanta":
        from quanta.quantsim import QuantizationSimModel

        return QuantizationSimModel(model, data[0], quant_scheme="post_training_tf", default_param_bw=bits,
                                    config_file=path)
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.quantsim import QuantizationSimModel

    return QuantizationSimModel(model, data[0], quant_scheme=QuantScheme.post_training_tf, default_param_bw=bits,
                                config_file=path)


def _ranges(sim):
    return {n: m.param_quantizers["weight"].get_max().detach().clone() for n, m in sim.model.named_modules()
            if isinstance(m, torch.nn.Conv2d) and hasattr(m, "param_quantizers") and m.param_quantizers["weight"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--candidates", type=int, default=20)
    parser.add_argument("--bits", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.INFO)
    model, data, _ = bench_adaround.build(args.batches, args.batch_size, args.size)
    print(f"ResNet (transformers, 4 stages), {args.batches} batches x {args.batch_size} images {args.size}x{args.size}, "
          f"{args.candidates} candidates, W{args.bits} per channel, threads: {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        from quanta.seq_mse import apply_seq_mse

        sim_q = _sim("quanta", copy.deepcopy(model), data, args.bits, tmp)
        t0 = time.perf_counter()
        apply_seq_mse(sim_q, data, num_candidates=args.candidates, progress=False)
        t_q = time.perf_counter() - t0
        print(f"quanta      {t_q:8.1f} s")
        if importlib.util.find_spec("aimet_torch") is None:
            print("aimet-torch n/a (not importable here)")
            return
        from aimet_torch.seq_mse import apply_seq_mse as aimet_apply_seq_mse

        sim_a = _sim("aimet", copy.deepcopy(model), data, args.bits, tmp)
        t0 = time.perf_counter()
        aimet_apply_seq_mse(sim_a, data, num_candidates=args.candidates)
        t_a = time.perf_counter() - t0
    rq, ra = _ranges(sim_q), _ranges(sim_a)
    same = sorted(rq) == sorted(ra) and all(torch.equal(rq[k].reshape(-1), ra[k].reshape(-1)) for k in rq)
    print(f"aimet-torch {t_a:8.1f} s   quanta/aimet = {t_q / t_a:.2f}   same ranges: {same}")


if __name__ == "__main__":
    main()
