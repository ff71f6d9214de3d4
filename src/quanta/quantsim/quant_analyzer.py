"""QuantAnalyzer (AIMET's ``QuantAnalyzer``): which layers does quantization hurt, and why.

Given a float model, a calibration callback and an evaluation callback (which returns one number,
higher is better: an accuracy, a cosine, minus a loss), :meth:`QuantAnalyzer.analyze` builds a
:class:`~quanta.quantsim.QuantizationSimModel` (BatchNorms folded first, on a copy), calibrates it and
writes to ``results_dir``:

=====================================  ==========================================================================
``index.html``                         everything below on one self-contained page (charts embedded)
``per_layer_quant_enabled.{json,html,png}``   score with only that layer quantized (the lowest: the most sensitive)
``per_layer_quant_disabled.{json,html,png}``  score with all layers but that one quantized (the highest: the layer
                                       whose quantization costs most)
``min_max_ranges/weights.{json,html}``         encoding range per weight (per-channel weights: one page each,
``min_max_ranges/activations.{json,html}``     ``<layer>_<param>.html``) and per activation quantizer
``activations_pdf/<layer>_{input,output}_q<i>.html``   histogram of the values each activation quantizer saw
``weights_pdf/<layer>/<param>.html``           in calibration, and of each weight, with the encoding's min and max
``per_layer_mse_loss.{json,html,png}``  MSE of each layer's output in the quantized vs the float model
=====================================  ==========================================================================

The JSON files have AIMET's names and layout (``{layer: score}``; ``{name: [min, max]}``, per-channel weights
``{name: {name_<i>: [min, max]}}``; ``{layer: mse}``), so scripts written for AIMET's output read them. The
sensitivity of the model to weight and to activation quantization alone (W-only and A-only scores) comes from
:meth:`~QuantAnalyzer.check_model_sensitivity_to_quantization`. Histograms are written when the scheme
calibrates from histograms (``tf_enhanced``/SQNR, percentile), as AIMET does for TF-Enhanced. Per-layer MSE
needs :meth:`~QuantAnalyzer.enable_per_layer_mse_loss` first.

Each method also runs alone on a sim you built (``analyzer.perform_per_layer_analysis_by_enabling_quant_wrappers
(sim, "results")``). Layers are the quantized modules with at least one quantizer, named as in the original
model, in the order they first finish running on ``dummy_input``.

>>> import tempfile, torch
>>> from torch import nn
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
>>> data = [torch.randn(32, 8) for _ in range(2)]
>>> def calibrate(m):
...     for x in data:
...         m(x)
>>> def evaluate(m):  # cosine of the outputs to the float model's: higher is better
...     return float(torch.cosine_similarity(m(data[0]), model(data[0]), dim=1).mean())
>>> analyzer = QuantAnalyzer(model, data[0], calibrate, evaluate)
>>> with tempfile.TemporaryDirectory() as d:
...     result = analyzer.analyze(default_param_bw=4, results_dir=d, progress=False)
>>> list(result.per_layer_quant_enabled)
['0', '1', '2']
>>> result.fp32_score > result.quantized_score
True
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quanta._files import output_directory, write_json
from quanta._inputs import call_model
from quanta.kernels import histograms as hk
from quanta.nn import QuantizationMixin
from quanta.nn.base import eval_mode, quantizers_off
from quanta.quantization.base import QuantizerBase
from quanta.quantsim import charts
from quanta.quantsim.callbacks import CallbackFunc, check_callback, evaluate_score
from quanta.quantsim.config import op_types_of
from quanta._progress import make_bar
from quanta.quantsim.quantsim import QuantizationSimModel, _check_bw
from quanta.quantsim.report import measure_layer_errors
from quanta.quantsim.scheme import QuantScheme

__all__ = ["CallbackFunc", "QuantAnalysis", "QuantAnalyzer"]

#: bins of the histograms drawn in ``activations_pdf`` / ``weights_pdf``
HISTOGRAM_BINS = 512
_HISTOGRAM_SCHEMES = (QuantScheme.SQNR, QuantScheme.PERCENTILE, QuantScheme.RANGE_LEARNING_SQNR)

Range = tuple[float, float]


@dataclass
class QuantAnalysis:
    """What :meth:`QuantAnalyzer.analyze` measured (also written to ``results_dir``).

    Scores are the evaluation callback's. ``weight_ranges`` maps ``<layer>_<param>`` to ``(min, max)``, or for
    per-channel / per-block weights to ``{<layer>_<param>_<i>: (min, max)}``; ``activation_ranges`` maps
    ``<layer>_{input,output}_<i>`` to ``(min, max)``; ``per_layer_mse_loss`` is None unless enabled.
    """

    fp32_score: float
    weight_quantized_score: float
    activation_quantized_score: float
    quantized_score: float
    per_layer_quant_enabled: dict[str, float]
    per_layer_quant_disabled: dict[str, float]
    weight_ranges: dict[str, Any]
    activation_ranges: dict[str, Range]
    per_layer_mse_loss: dict[str, float] | None
    results_dir: str
    files: list[str] = field(default_factory=list)

    def most_sensitive(self, k: int = 5) -> list[str]:
        """The ``k`` layers whose quantization alone lowers the score most (``per_layer_quant_enabled``)."""
        return sorted(self.per_layer_quant_enabled, key=self.per_layer_quant_enabled.__getitem__)[:k]


def _file_name(name: str) -> str:
    """A layer name usable as a file name (no path separators)."""
    return name.replace(os.sep, "_").replace("/", "_") or "model"


def _has_quantizers(m: QuantizationMixin) -> bool:
    return any(q is not None for q in itertools.chain(m.input_quantizers, m.output_quantizers,
                                                      m.param_quantizers.values()))


def _encoding_range(q: QuantizerBase) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(min, max)`` of ``q``'s encoding, flattened to one entry per scale (None before initialisation)."""
    enc = q.get_encodings()
    if enc is None:
        return None
    if hasattr(enc, "maxval"):  # a float format: symmetric about zero
        hi = enc.maxval.detach().float().flatten()
        return -hi, hi
    return enc.min.detach().float().flatten(), enc.max.detach().float().flatten()


class QuantAnalyzer:
    """Analyse a float model's sensitivity to quantization, layer by layer (AIMET's ``QuantAnalyzer``).

    Args:
        model: the float model (not modified: :meth:`analyze` folds BatchNorms into a copy).
        dummy_input: an input of the model (tensor, tuple of positional inputs, or dict of keyword inputs).
        forward_pass_callback: calibration: a :class:`CallbackFunc` or ``fn(model)`` running representative
            data (AIMET recommends 500-1000 samples) through the model.
        eval_callback: evaluation: a :class:`CallbackFunc` or ``fn(model)`` returning one number, higher is
            better. It runs in eval mode under ``torch.no_grad()``, once per layer per sensitivity analysis.
        modules_to_ignore: modules of ``model`` to leave unquantized (kept in float, not analysed).

    See the module docstring for what :meth:`analyze` writes.
    """

    def __init__(self, model: nn.Module, dummy_input: Any, forward_pass_callback: Callable[[nn.Module], Any],
                 eval_callback: Callable[[nn.Module], float],
                 modules_to_ignore: Iterable[nn.Module] | None = None) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        self._model = model
        self._dummy_input = dummy_input
        self._forward_pass_callback = check_callback("forward_pass_callback", forward_pass_callback)
        self._eval_callback = check_callback("eval_callback", eval_callback)
        self._ignored: list[str] = []
        if modules_to_ignore is not None:
            names = {id(m): n for n, m in model.named_modules()}
            for m in modules_to_ignore:
                if not isinstance(m, nn.Module) or id(m) not in names:
                    raise ValueError(f"modules_to_ignore must hold submodules of model; {type(m).__name__} "
                                     f"{m!r:.60} is not one")
                self._ignored.append(names[id(m)])
        self._unlabeled: Collection[Any] | None = None
        self._num_batches = 0
        self._scores: dict[str, float] = {}
        self._charts: dict[str, bytes | None] = {}  # drawn once, embedded again in index.html

    # ------------------------------------------------------------------ set-up
    def enable_per_layer_mse_loss(self, unlabeled_dataset_iterable: Collection[Any], num_batches: int) -> None:
        """Have :meth:`analyze` also write the per-layer MSE (:meth:`export_per_layer_mse_loss`) over the first
        ``num_batches`` batches of ``unlabeled_dataset_iterable`` (a sized iterable of model inputs; a tuple
        is the model's positional inputs, a dict its keyword inputs)."""
        if not isinstance(unlabeled_dataset_iterable, Iterable) or not hasattr(unlabeled_dataset_iterable,
                                                                               "__len__"):
            raise TypeError("unlabeled_dataset_iterable must be a sized iterable of model inputs (a DataLoader, "
                            f"a list), got {type(unlabeled_dataset_iterable).__name__}")
        if isinstance(num_batches, bool) or not isinstance(num_batches, int):
            raise TypeError(f"num_batches must be an int, got {type(num_batches).__name__}")
        if num_batches < 1:
            raise ValueError(f"num_batches must be at least 1, got {num_batches}")
        if len(unlabeled_dataset_iterable) < num_batches:
            raise ValueError(f"Can not fetch {num_batches} batches from a data loader of length "
                             f"{len(unlabeled_dataset_iterable)} (num_batches)")
        self._unlabeled = unlabeled_dataset_iterable
        self._num_batches = num_batches

    def create_quantsim_and_encodings(self, quant_scheme: QuantScheme | str = QuantScheme.SQNR,
                                      default_param_bw: int = 8, default_output_bw: int = 8,
                                      config_file: Any = None) -> QuantizationSimModel:
        """The calibrated sim :meth:`analyze` studies: BatchNorms folded into a copy of the model (when the
        model is captured; otherwise a warning and no fold), ``modules_to_ignore`` excluded, encodings from
        ``forward_pass_callback``."""
        scheme = QuantScheme.parse(quant_scheme)
        _check_bw("default_param_bw", default_param_bw)  # before the copy and the fold
        _check_bw("default_output_bw", default_output_bw)
        model = copy.deepcopy(self._model)
        if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
            from quanta.quantsim.batch_norm_fold import fold_all_batch_norms

            try:
                fold_all_batch_norms(model, dummy_input=self._dummy_input)
            except TypeError as e:
                warnings.warn(f"QuantAnalyzer: BatchNorms not folded ({e})", UserWarning, stacklevel=3)
        sim = QuantizationSimModel(model, self._dummy_input, quant_scheme=scheme,
                                   default_param_bw=default_param_bw, default_output_bw=default_output_bw,
                                   config_file=config_file)
        if self._ignored:
            sim.exclude_layers_from_quantization([sim.model.get_submodule(n) for n in self._ignored])
        sim.compute_encodings(self._forward_pass_callback, progress=False)
        return sim

    def analyze(self, quant_scheme: QuantScheme | str = QuantScheme.SQNR, default_param_bw: int = 8,
                default_output_bw: int = 8, config_file: Any = None, results_dir: str | os.PathLike = "./tmp/",
                *, progress: bool = True) -> QuantAnalysis:
        """Run every analysis and write its files to ``results_dir`` (see the module docstring).

        Args:
            quant_scheme: the activations' calibration (:class:`~quanta.quantsim.QuantScheme` or an AIMET
                name; AIMET's default ``post_training_tf_enhanced``).
            default_param_bw: bits of the weights.
            default_output_bw: bits of the activations.
            config_file: a quantsim config (path, dict or :class:`~quanta.quantsim.config.QuantSimConfig`).
            results_dir: where the files go (created).
            progress: show a bar over the layers during the per-layer analyses.
        """
        scheme = QuantScheme.parse(quant_scheme)
        results_dir = output_directory(results_dir)
        sim = self.create_quantsim_and_encodings(scheme, default_param_bw, default_output_bw, config_file)
        fp32, w_only, a_only = self.check_model_sensitivity_to_quantization(sim)
        quantized = self._evaluate(sim.model)
        self._scores["quantized"] = quantized
        enabled = self.perform_per_layer_analysis_by_enabling_quant_wrappers(sim, results_dir, progress=progress)
        disabled = self.perform_per_layer_analysis_by_disabling_quant_wrappers(sim, results_dir,
                                                                               progress=progress)
        weights, activations = self.export_per_layer_encoding_min_max_range(sim, results_dir)
        histograms: list[tuple[str, str]] = []
        if scheme in _HISTOGRAM_SCHEMES:
            histograms = self.export_per_layer_stats_histogram(sim, results_dir)
        mse = self.export_per_layer_mse_loss(sim, results_dir) if self._unlabeled is not None else None
        result = QuantAnalysis(fp32, w_only, a_only, quantized, enabled, disabled, weights, activations, mse,
                               results_dir)
        self._write_index(sim, result, histograms)
        result.files = sorted(os.path.relpath(os.path.join(d, f), results_dir)
                              for d, _, fs in os.walk(results_dir) for f in fs)
        return result

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, model: nn.Module) -> float:
        return evaluate_score(self._eval_callback, model)

    @staticmethod
    def _layers(sim: QuantizationSimModel) -> list[tuple[str, QuantizationMixin]]:
        return [(n, m) for n, m in sim.model.named_modules() if isinstance(m, QuantizationMixin) and _has_quantizers(m)]

    def _ordered_layers(self, sim: QuantizationSimModel) -> list[tuple[str, QuantizationMixin]]:
        """The quantized modules with a quantizer, in the order they first finish running on ``dummy_input``
        (AIMET's order); modules the dummy pass does not reach follow in module order."""
        layers = self._layers(sim)
        order: dict[str, None] = {}
        handles = [m.register_forward_hook(lambda mod, a, o, n=n: order.setdefault(n, None)) for n, m in layers]
        try:
            with eval_mode(sim.model), torch.no_grad():
                call_model(sim.model, self._dummy_input)
        finally:
            for h in handles:
                h.remove()
        by_name = dict(layers)
        return [(n, by_name[n]) for n in order] + [(n, m) for n, m in layers if n not in order]

    def check_model_sensitivity_to_quantization(self, sim: QuantizationSimModel) -> tuple[float, float, float]:
        """``(fp32, weight-quantized, activation-quantized)`` scores: the model with no quantizer, with only
        the parameter quantizers, with only the activation quantizers."""
        modules = [m for _, m in self._layers(sim)]
        with quantizers_off(modules):
            fp32 = self._evaluate(sim.model)
        with quantizers_off(modules, params=False):
            w_only = self._evaluate(sim.model)
        with quantizers_off(modules, activations=False):
            a_only = self._evaluate(sim.model)
        self._scores.update(fp32=fp32, weight=w_only, activation=a_only)
        return fp32, w_only, a_only

    def _per_layer(self, sim: QuantizationSimModel, only: bool, progress: bool) -> dict[str, float]:
        layers = self._ordered_layers(sim)
        scores: dict[str, float] = {}
        bar = make_bar(len(layers), enabled=progress, desc="per-layer " + ("enabled" if only else "disabled"),
                       unit="layer")
        try:
            for name, module in layers:
                others = [m for _, m in layers if m is not module] if only else [module]
                with quantizers_off(others):
                    scores[name] = self._evaluate(sim.model)
                bar.advance()
        finally:
            bar.close()
        return scores

    def perform_per_layer_analysis_by_enabling_quant_wrappers(self, sim: QuantizationSimModel,
                                                              results_dir: str | os.PathLike, *,
                                                              progress: bool = True) -> dict[str, float]:
        """``{layer: score}`` with only that layer's quantizers on (all others off); written as
        ``per_layer_quant_enabled.{json,html,png}``. The lowest scores are the most sensitive layers."""
        results_dir = output_directory(results_dir)
        scores = self._per_layer(sim, only=True, progress=progress)
        self._write_sensitivity(sim, scores, results_dir, "per_layer_quant_enabled",
                                "score with only this layer quantized", baseline=("fp32", "fp32 model"))
        return scores

    def perform_per_layer_analysis_by_disabling_quant_wrappers(self, sim: QuantizationSimModel,
                                                               results_dir: str | os.PathLike, *,
                                                               progress: bool = True) -> dict[str, float]:
        """``{layer: score}`` with every layer quantized except that one; written as
        ``per_layer_quant_disabled.{json,html,png}``. The highest scores mark the layers whose quantization
        costs most."""
        results_dir = output_directory(results_dir)
        scores = self._per_layer(sim, only=False, progress=progress)
        self._write_sensitivity(sim, scores, results_dir, "per_layer_quant_disabled",
                                "score with all layers but this one quantized",
                                baseline=("quantized", "all layers quantized"))
        return scores

    def _write_sensitivity(self, sim: QuantizationSimModel, scores: dict[str, float], results_dir: str,
                           title: str, ylabel: str, baseline: tuple[str, str]) -> None:
        write_json(os.path.join(results_dir, f"{title}.json"), scores)
        names = list(scores)
        lines = {label: self._scores[key] for key, label in (baseline, ("fp32", "fp32 model"))
                 if key in self._scores}
        png = charts.bar_chart(names, {ylabel: list(scores.values())}, ylabel="score", title=title, baselines=lines,
                               zoom=True)
        charts.save_png(png, os.path.join(results_dir, f"{title}.png"))
        types = {n: op_types_of(m)[0] for n, m in self._layers(sim)}
        page = charts.Page(title)
        page.paragraph(ylabel + "; " + ", ".join(f"{k}: {v:.6g}" for k, v in lines.items()))
        page.image(png, title)
        page.table(["layer", "type", "score"], [[n, types.get(n, ""), s] for n, s in scores.items()])
        page.write(os.path.join(results_dir, f"{title}.html"))
        if png is None:
            charts.warn_no_matplotlib("QuantAnalyzer")

    # ------------------------------------------------------------------ ranges and histograms
    def export_per_layer_encoding_min_max_range(self, sim: QuantizationSimModel, results_dir: str | os.PathLike,
                                                ) -> tuple[dict[str, Any], dict[str, Range]]:
        """Encoding ranges of every weight and activation quantizer, written to ``min_max_ranges/``:
        ``weights.json`` / ``activations.json`` (AIMET's layout, see :class:`QuantAnalysis`), a chart page of
        the per-tensor ranges (``weights.html``, ``activations.html``) and one per per-channel weight
        (``<layer>_<param>.html``). Returns ``(weights, activations)``."""
        out_dir = os.path.join(output_directory(results_dir), "min_max_ranges")
        weights: dict[str, Any] = {}
        activations: dict[str, Range] = {}
        for name, m in self._layers(sim):
            for kind, quantizers in (("input", m.input_quantizers), ("output", m.output_quantizers)):
                for i, q in enumerate(quantizers):
                    rng = _encoding_range(q) if q is not None else None
                    if rng is not None:
                        activations[f"{name}_{kind}_{i}"] = (float(rng[0][0]), float(rng[1][0]))
            for pname, q in m.param_quantizers.items():
                rng = _encoding_range(q) if q is not None else None
                if rng is None:
                    continue
                key = f"{name}_{pname}"
                lo, hi = rng
                if lo.numel() > 1:
                    weights[key] = {f"{key}_{i}": (float(a), float(b)) for i, (a, b) in enumerate(zip(lo, hi))}
                else:
                    weights[key] = (float(lo[0]), float(hi[0]))
        os.makedirs(out_dir, exist_ok=True)
        write_json(os.path.join(out_dir, "weights.json"), weights)
        write_json(os.path.join(out_dir, "activations.json"), activations)
        per_tensor = {k: v for k, v in weights.items() if isinstance(v, tuple)}
        for title, ranges in (("weights", per_tensor), ("activations", activations)):
            if ranges:
                self._charts[title] = _range_page(ranges, os.path.join(out_dir, f"{title}.html"), title,
                                                  by_name=True)
        for key, ranges in weights.items():
            if isinstance(ranges, dict):
                _range_page(ranges, os.path.join(out_dir, f"{_file_name(key)}.html"), key, by_name=False)
        return weights, activations

    def export_per_layer_stats_histogram(self, sim: QuantizationSimModel, results_dir: str | os.PathLike,
                                         ) -> list[tuple[str, str]]:
        """Histograms of the values every quantizer sees, with its encoding's min and max: the activations
        as in calibration (one run of ``forward_pass_callback``, activations in float, weights quantized),
        written to ``activations_pdf/<layer>_{input,output}_q<i>.html``; the weights to
        ``weights_pdf/<layer>/<param>.html`` (per-channel weights: all channels in one histogram, lines at
        the lowest min and highest max). Returns ``(name, relative path)`` of every page. Encodings are
        unchanged."""
        results_dir = output_directory(results_dir)
        layers = self._layers(sim)
        acts: dict[str, tuple[QuantizerBase, _ValueHistogram]] = {}
        for name, m in layers:
            for kind, quantizers in (("input", m.input_quantizers), ("output", m.output_quantizers)):
                for i, q in enumerate(quantizers):
                    if q is not None and q.get_encodings() is not None:
                        acts[f"{name}_{kind}_q{i}"] = (q, _ValueHistogram())
        _observe_activations(sim.model, acts.values(), self._forward_pass_callback)
        pages: list[tuple[str, str]] = []
        for key, (q, hist) in acts.items():
            rel = os.path.join("activations_pdf", f"{_file_name(key)}.html")
            if _histogram_page(hist, _encoding_range(q), os.path.join(results_dir, rel), key):
                pages.append((key, rel))
        for name, m in layers:
            for pname, q in m.param_quantizers.items():
                param = getattr(m, pname, None)
                if q is None or q.get_encodings() is None or not isinstance(param, torch.Tensor):
                    continue
                hist = _ValueHistogram()
                hist.update(param.detach().float())
                rel = os.path.join("weights_pdf", _file_name(name), f"{_file_name(pname)}.html")
                if _histogram_page(hist, _encoding_range(q), os.path.join(results_dir, rel), f"{name}.{pname}"):
                    pages.append((f"{name}.{pname}", rel))
        return pages

    # ------------------------------------------------------------------ MSE
    def export_per_layer_mse_loss(self, sim: QuantizationSimModel, results_dir: str | os.PathLike
                                  ) -> dict[str, float]:
        """``{layer: MSE}`` between each layer's output in the quantized model and in the float model
        (the sim with its quantizers off), over the batches given to :meth:`enable_per_layer_mse_loss`;
        written as ``per_layer_mse_loss.{json,html,png}``. Layers: the leaf modules of the original model
        that run, in the order they run (as AIMET; modules the sim no longer calls, such as the folded
        BatchNorms, have no row, where AIMET repeats the previous layer's value).

        As AIMET computes it: ``Σ_batches mean((out_q - out_fp)²) / Σ_batches batch_size``. One float and one
        quantized pass per batch measure every layer at once (AIMET runs both models once per layer per
        batch). The HTML page adds each layer's output SQNR."""
        if self._unlabeled is None:
            raise RuntimeError("export_per_layer_mse_loss needs data: call enable_per_layer_mse_loss("
                               "unlabeled_dataset_iterable, num_batches) first")
        results_dir = output_directory(results_dir)
        # AIMET's rows: the original model's leaf modules (unquantized ones, e.g. folded BatchNorms, too)
        leaves = [n for n, m in self._model.named_modules() if n and not next(m.children(), None)]
        present = dict(sim.model.named_modules())
        modules = [(n, present[n]) for n in leaves if n in present]
        errors = measure_layer_errors(sim, itertools.islice(self._unlabeled, self._num_batches), modules)
        mse = {e.name: e.cumulative.mse_sum / max(1, e.cumulative.samples) for e in errors.layers}
        write_json(os.path.join(results_dir, "per_layer_mse_loss.json"), mse)
        png = charts.line_chart(list(mse), list(mse.values()), ylabel="MSE loss", title="per_layer_mse_loss",
                                log=True)
        charts.save_png(png, os.path.join(results_dir, "per_layer_mse_loss.png"))
        self._charts["mse"] = png
        page = charts.Page("per_layer_mse_loss")
        page.paragraph(f"Output of each layer in the quantized model vs the float model, {self._num_batches} "
                       f"batches; model output SQNR {errors.output.db():.2f} dB")
        page.image(png, "per-layer MSE")
        page.table(["layer", "type", "MSE", "SQNR dB"],
                   [[e.name, e.op_type, mse[e.name], e.cumulative.db()] for e in errors.layers])
        page.write(os.path.join(results_dir, "per_layer_mse_loss.html"))
        return mse

    # ------------------------------------------------------------------ summary page
    def _write_index(self, sim: QuantizationSimModel, r: QuantAnalysis, histograms: list[tuple[str, str]]) -> None:
        page = charts.Page("QuantAnalyzer")
        page.heading("Sensitivity to weight and activation quantization")
        page.table(["model", "score"], [["fp32", r.fp32_score],
                                        [f"weights quantized (W{sim.default_param_bw}A32)", r.weight_quantized_score],
                                        [f"activations quantized (W32A{sim.default_output_bw})",
                                         r.activation_quantized_score],
                                        [f"both (W{sim.default_param_bw}A{sim.default_output_bw})", r.quantized_score]])
        names = list(r.per_layer_quant_enabled)
        page.heading("Per-layer sensitivity")
        page.image(charts.bar_chart(
            names, {"only this layer quantized": list(r.per_layer_quant_enabled.values()),
                    "all but this layer quantized": [r.per_layer_quant_disabled.get(n, math.nan) for n in names]},
            ylabel="score", title="per-layer sensitivity",
            baselines={"fp32 model": r.fp32_score, "all layers quantized": r.quantized_score}, zoom=True),
            "per-layer")
        page.paragraph("Most sensitive (lowest score with only that layer quantized): "
                       + ", ".join(r.most_sensitive()))
        page.links([("per_layer_quant_enabled", "per_layer_quant_enabled.html"),
                    ("per_layer_quant_disabled", "per_layer_quant_disabled.html")])
        page.heading("Encoding ranges")
        per_tensor = {k: v for k, v in r.weight_ranges.items() if isinstance(v, tuple)}
        per_channel = [k for k, v in r.weight_ranges.items() if isinstance(v, dict)]
        for title, ranges in (("weights", per_tensor), ("activations", r.activation_ranges)):
            if ranges:
                page.image(self._charts.get(title), title)
        if per_channel:
            page.paragraph("Per-channel weights:")
            page.links([(k, os.path.join("min_max_ranges", f"{_file_name(k)}.html")) for k in per_channel])
        if histograms:
            page.heading("Histograms")
            page.links(histograms)
        if r.per_layer_mse_loss is not None:
            page.heading("Per-layer MSE")
            page.image(self._charts.get("mse"), "per-layer MSE")
            page.links([("per_layer_mse_loss", "per_layer_mse_loss.html")])
        page.write(os.path.join(r.results_dir, "index.html"))


class _ValueHistogram:
    """One streaming histogram (:mod:`quanta.kernels.histograms`) of all the values it is given."""

    def __init__(self) -> None:
        self.stats: hk.Histograms | None = None

    def update(self, x: torch.Tensor) -> None:
        batch, _ = hk.histogram(x.detach().as_subclass(torch.Tensor).reshape(1, -1), HISTOGRAM_BINS)
        self.stats = batch if self.stats is None else hk.merge(self.stats, batch)


def _observe_activations(model: nn.Module, acts: Iterable[tuple[QuantizerBase, _ValueHistogram]],
                         forward_pass_callback: Callable[[nn.Module], Any]) -> None:
    """Run ``forward_pass_callback`` with the activation quantizers passing their inputs through (as in
    calibration) while each of them adds what it sees to its histogram."""
    handles = []
    for q, hist in acts:
        def observe(mod: nn.Module, args: tuple, hist: _ValueHistogram = hist) -> None:
            if args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                hist.update(args[0])
        handles.append(q.register_forward_pre_hook(observe))
        handles.append(q.register_forward_hook(lambda mod, args, out: args[0]))
    try:
        with eval_mode(model), torch.no_grad():
            forward_pass_callback(model)
    finally:
        for h in handles:
            h.remove()


def _range_page(ranges: Mapping[str, Range], path: str, title: str, by_name: bool) -> bytes | None:
    """A chart and a table of ``ranges``; ``by_name=False``: the x axis counts channels (or blocks).
    Returns the chart."""
    png = charts.range_chart(list(ranges) if by_name else None, [v[0] for v in ranges.values()],
                             [v[1] for v in ranges.values()], title=title,
                             xlabel="" if by_name else "channel / block")
    page = charts.Page(title)
    page.image(png, title)
    page.table(["name", "min", "max"], [[n, lo, hi] for n, (lo, hi) in ranges.items()])
    page.write(path)
    return png


def _histogram_page(hist: _ValueHistogram, rng: tuple[torch.Tensor, torch.Tensor] | None, path: str,
                    title: str) -> bool:
    """Write one histogram page (the occupied bins only); False when the histogram saw nothing."""
    stats = hist.stats
    if stats is None or rng is None:
        return False
    counts = stats.counts[0]
    nonzero = torch.nonzero(counts).flatten()
    if nonzero.numel() == 0:
        return False
    a, b = int(nonzero[0]), int(nonzero[-1]) + 1
    edges = stats.edges()[0, a:b + 1].tolist()
    lo, hi = float(rng[0].min()), float(rng[1].max())
    label = "encoding" if rng[0].numel() == 1 else "widest channel"
    png = charts.histogram_chart(edges, counts[a:b].tolist(), title=title,
                                 lines={f"{label} min": lo, f"{label} max": hi})
    page = charts.Page(title)
    page.paragraph(f"observed [{float(stats.min[0]):.6g}, {float(stats.max[0]):.6g}]; {label} range "
                   f"[{lo:.6g}, {hi:.6g}]; {int(counts.sum())} values")
    page.image(png, title)
    page.write(path)
    return True

