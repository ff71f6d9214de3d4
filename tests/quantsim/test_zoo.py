"""The model zoo (zoo_models.ZOO) through QuantizationSimModel as a user passes the models: default config, W8A8.

Each model is simulated once (``zoo_models.simulate``: dummy input at one batch size and length, calibration at
another) and shared by four tests, so each criterion fails on its own:

* captured whole: by ``torch.export`` (no fallback), nothing left in float (no functional op without a
  quantized counterpart, no module kept whole); the default config's own float choices (residual adds) are
  not listed there;
* accuracy: at a third batch size and length, the simulated model returns what the original returns (same
  type, keys and shapes) and its output is within 30 dB SQNR of the float model's;
* ONNX: exported at a fourth shape, onnxruntime's outputs are within one output step of the sim's, for the
  graph as written and after onnxruntime's basic graph optimisations.

Every zoo model is expected to pass everything; ``KNOWN`` lists, with reasons, what does not yet (strict
xfails: a fix makes the test fail until its entry is removed).
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch

pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

from quanta.tools.measure import sqnr_db  # noqa: E402
from zoo_models import EVALUATION, ZOO, Simulated, simulate  # noqa: E402

EXPORT = (1, 6)  # (batch, length) the ONNX graph is exported at (static shapes)

# (test, model) -> why it fails today
# Measured: random-init BatchNorm networks are chaotic (Yang et al. 2019, "A mean field theory of batch
# normalization"): the float model alone, given its input with noise at 45 dB SQNR (about one 8-bit input
# quantizer), returns an output at 16.7 dB (mobilenet_v2), 31.8 dB (mobilevit), 39 dB (regnet), 41 dB
# (efficientnet); resnet 40 dB, convnext 45 dB pass. Scaling the BatchNorm weights down tips them into the
# other phase (output independent of the input), so no small random config of these conditions them.
KNOWN: dict[tuple[str, str], str] = {
    ("sqnr", "mobilenet_v2"): "~5 dB: random-init chaos (45 dB of input noise alone leaves 16.7 dB at the output)",
    ("sqnr", "mobilevit"): "~13 dB: random-init chaos (45 dB of input noise alone leaves 31.8 dB at the output)",
    ("sqnr", "regnet"): "~28 dB: random-init chaos (45 dB of input noise alone leaves 39 dB at the output) and "
                        "22 8-bit per-tensor quantizers in series, BatchNorm outputs 35-38 dB locally",
    ("sqnr", "efficientnet"): "~23 dB: 36 8-bit per-tensor quantizers in series; each BatchNorm output before "
                              "SiLU (not fused) 34-38 dB locally",
    ("sqnr", "wav2vec2"): "28 dB: the feature encoder's first conv output is quantized per tensor before its "
                          "GroupNorm normalises each channel (35 dB after it)",
    # The 8-bit model input (AIMET's default_config.json quantizes model inputs, and so does quanta's since
    # issue 16): Gaussian pixels on an 8-bit grid; 30.0 / 30.1 dB with the input left in float.
    ("sqnr", "resnet"): "29.2 dB: the 8-bit model input costs 0.8 dB (random-init chaos: 45 dB of input noise "
                        "alone leaves 40 dB at the output)",
    ("sqnr", "dinov2"): "29.6 dB: the 8-bit model input costs 0.5 dB",
}

_SIMULATED: dict[str, Simulated] = {}
_EXPORTED: dict[str, str] = {}


def _simulated(name: str) -> Simulated:
    if name not in _SIMULATED:
        _SIMULATED[name] = simulate(name)
    return _SIMULATED[name]


def _models(test: str) -> list:
    return [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[test, n], strict=True)) if (test, n) in KNOWN
            else n for n in ZOO]


def _outputs(out) -> dict[str, torch.Tensor]:
    return {k: v.as_subclass(torch.Tensor) for k, v in out.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("name", _models("capture"))
def test_captured_whole_with_nothing_left_in_float(name):
    z = _simulated(name)
    assert z.sim.capture_method == "export", z.sim.capture_errors
    assert z.sim.capture_errors == {}
    assert z.sim.float_ops == [], z.sim.float_ops
    assert z.sim.unquantized_modules == [], z.sim.unquantized_modules
    assert [w for w in z.warnings if w.startswith("QuantizationSimModel")] == []  # a user is told nothing


@pytest.mark.parametrize("name", _models("sqnr"))
def test_w8a8_output_sqnr_at_another_batch_and_length(name):
    z = _simulated(name)
    torch.manual_seed(2)
    x = z.inputs(*EVALUATION)
    with torch.no_grad():
        ref, out = z.model(**x), z.sim.model(**x)
    assert type(out) is type(ref)
    assert list(out.keys()) == list(ref.keys())
    assert {k: v.shape for k, v in _outputs(out).items()} == {k: v.shape for k, v in _outputs(ref).items()}
    assert sqnr_db(ref[z.key], out[z.key]) >= 30.0


def _steps(z: Simulated, x: dict) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The sim's outputs on ``x`` and, for each, one step of its grid: the scale of the quantizer whose output it
    is (the same values, in any layout); an output the config leaves in float (a residual add's sum) gets the
    step of an 8-bit grid over its range."""
    seen: list[tuple[str, torch.Tensor]] = []
    quantizers = dict(z.sim.named_quantizers())
    hooks = [q.register_forward_hook(lambda _m, _i, o, n=n: seen.append((n, o))) for n, q in quantizers.items()]
    try:
        with torch.no_grad():
            out = _outputs(z.sim.model(**x))
    finally:
        for h in hooks:
            h.remove()
    steps = {}
    for key, value in out.items():
        values = value.reshape(-1).sort().values
        name = next((n for n, o in reversed(seen) if isinstance(o, torch.Tensor) and o.numel() == value.numel()
                     and torch.equal(o.as_subclass(torch.Tensor).reshape(-1).sort().values, values)), None)
        steps[key] = (float(quantizers[name].get_scale().max()) if name is not None
                      else float(value.max() - value.min()) / 255)
    return out, steps


def _export(name: str, directory) -> str:
    if name not in _EXPORTED:
        z = _simulated(name)
        torch.manual_seed(3)
        x = z.inputs(*EXPORT)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the ONNX exporters' notes
            z.sim.export(str(directory), name, x)
        _EXPORTED[name] = os.path.join(str(directory), f"{name}.onnx")
    return _EXPORTED[name]


def _check_onnxruntime(name: str, directory, options) -> None:
    z = _simulated(name)
    path = _export(name, directory)
    torch.manual_seed(3)
    x = z.inputs(*EXPORT)
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {i.name: x[i.name].numpy() for i in session.get_inputs()}
    assert set(feeds) == {k for k, v in x.items() if isinstance(v, torch.Tensor)}
    names = [o.name for o in session.get_outputs()]
    want, steps = _steps(z, x)
    assert set(names) == set(want)
    for key, got in zip(names, session.run(names, feeds)):
        diff = (torch.from_numpy(got) - want[key]).abs().max().item()
        # 1.01: the difference of two dequantized values is taken in float32
        assert diff <= 1.01 * steps[key], (key, diff, steps[key])


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("zoo_onnx")


@pytest.mark.parametrize("name", _models("onnx"))
def test_onnxruntime_runs_the_export_within_one_output_step(name, onnx_dir):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the QDQ graph as written
    _check_onnxruntime(name, onnx_dir, options)


@pytest.mark.parametrize("name", _models("onnx_basic"))
def test_onnxruntime_basic_graph_optimisations_keep_the_results(name, onnx_dir):
    # constant folding and the removal of redundant nodes (double Q/DQ pairs among them) must not change the
    # results; the higher levels swap Q/DQ around an op for onnxruntime's integer kernels (QLinearConv,
    # QLinearMatMul, ...), whose requantisation differs from Q/DQ arithmetic by design
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    _check_onnxruntime(name, onnx_dir, options)
