"""quanta.quantsim.report: per-layer SQNR of a QuantizationSimModel against its float self.

References: SQNRs recomputed here from outputs captured with forward hooks,
once with the quantizers on and once inside ``sim.quantizers_disabled()``,
accumulated over batches in float64 as ``10·log10(Σ ref² / Σ (out − ref)²)``.
"""

from __future__ import annotations

import math
import sys
import warnings

import pytest
import torch
from torch import nn

from quanta.quantsim import INTEGER_ONLY, LayerSQNR, LayerSQNRReport, QuantizationSimModel
from quantsim_models import SmallCNN, TransformerBlock, make_cnn_data, make_seq_data


def _sqnr(refs: list[torch.Tensor], outs: list[torch.Tensor]) -> float:
    signal = sum(float(r.double().pow(2).sum()) for r in refs)
    noise = sum(float((o.double() - r.double()).pow(2).sum()) for r, o in zip(refs, outs))
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _sim(model: nn.Module, batches: list, **kwargs) -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sim = QuantizationSimModel(model, batches[0], **kwargs)
    sim.compute_encodings(batches, progress=False)
    return sim


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x, _ = make_cnn_data(8)
    batches = [x[:4], x[4:]]
    sim = _sim(model, batches)
    return model, sim, batches, sim.layer_sqnr(batches)


@pytest.fixture(scope="module")
def transformer():
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x, _ = make_seq_data(8, seq=8)
    batches = [x[:4], x[4:]]
    sim = _sim(model, batches, config_file=INTEGER_ONLY)  # every op has a row, the residual adds too
    return model, sim, batches, sim.layer_sqnr(batches)


def _capture(sim: QuantizationSimModel, batches: list, names: list[str]) -> dict[str, list[torch.Tensor]]:
    """Outputs of ``names`` per call, over all batches, and the model outputs under key ''."""
    got: dict[str, list[torch.Tensor]] = {n: [] for n in [*names, ""]}
    hooks = [sim.model.get_submodule(n).register_forward_hook(
        lambda m, a, out, n=n: got[n].append(out.detach().as_subclass(torch.Tensor).clone())) for n in names]
    try:
        with torch.no_grad():
            for b in batches:
                got[""].append(sim.model(b).clone())
    finally:
        for h in hooks:
            h.remove()
    return got


def _execution_order(sim: QuantizationSimModel, x: torch.Tensor) -> list[str]:
    order: list[str] = []
    names = [n for n, m in sim.quantized_modules() if next(iter(m._quantizers()), None) is not None]
    hooks = [sim.model.get_submodule(n).register_forward_hook(lambda *a, n=n: order.append(n)) for n in names]
    try:
        with torch.no_grad():
            sim.model(x)
    finally:
        for h in hooks:
            h.remove()
    return list(dict.fromkeys(order))


# -- rows --------------------------------------------------------------------------------------------
def test_cnn_rows_in_execution_order(cnn):
    _, sim, batches, report = cnn
    names = [r.name for r in report.layers]
    assert names == ["conv1", "relu1", "conv2", "relu", "conv3", "relu_1", "gap", "fc"]
    assert names == _execution_order(sim, batches[0])
    quantized = dict(sim.quantized_modules())
    assert set(names) <= set(quantized)
    # BatchNorm inside Conv-BN-ReLU has every quantizer off: it adds no error and gets no row
    assert all(q is None for q in (*quantized["bn1"].output_quantizers, *quantized["bn1"].param_quantizers.values()))
    assert [r.op_type for r in report.layers] == ["Conv2d", "ReLU", "Conv2d", "ReLU", "Conv2d", "ReLU",
                                                  "AdaptiveAvgPool2d", "Linear"]
    assert all(isinstance(r, LayerSQNR) for r in report.layers)


def test_transformer_rows_in_execution_order(transformer):
    _, sim, batches, report = transformer
    names = [r.name for r in report.layers]
    # the division by a constant rescales its input's grid: no quantizer, no row
    assert names == ["ln1", "qkv", "matmul", "softmax", "matmul_1", "proj", "add", "ln2", "fc1", "act", "fc2", "add_1"]
    assert names == _execution_order(sim, batches[0])
    assert report.layers[2].op_type == "MatMul" and report.layers[6].op_type == "Add"


def test_ops_without_quantizers_get_no_row():
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x, _ = make_seq_data(8, seq=8)
    sim = _sim(model, [x])  # the built-in default: the residual adds stay in float
    report = sim.layer_sqnr([x])
    assert [r.name for r in report.layers] == ["ln1", "qkv", "matmul", "softmax", "matmul_1", "proj", "ln2", "fc1",
                                               "act", "fc2"]
    assert report.layers[-1].sqnr_db != report.output_sqnr_db  # fc2's output is summed with the float stream


# -- numbers ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["cnn", "transformer"])
def test_sqnr_values_match_hand_computation(which, request):
    model, sim, batches, report = request.getfixturevalue(which)
    names = [r.name for r in report.layers]
    quantized = _capture(sim, batches, names)
    with sim.quantizers_disabled():
        reference = _capture(sim, batches, names)
    with torch.no_grad():
        float_outputs = [model(b) for b in batches]
    for ref, out in zip(reference[""], float_outputs):
        assert torch.equal(ref, out)  # the reference really is the float model
    assert report.output_sqnr_db == pytest.approx(_sqnr(reference[""], quantized[""]), rel=1e-9)
    for row in report.layers:
        assert row.sqnr_db == pytest.approx(_sqnr(reference[row.name], quantized[row.name]), rel=1e-9), row.name
        assert math.isfinite(row.sqnr_db) and math.isfinite(row.local_sqnr_db)
        if row.op_type == "Divide":  # scores / sqrt(d) of quantized scores: the grid scaled, requantized exactly
            assert row.local_sqnr_db > 100, row
            continue
        assert 20 < row.local_sqnr_db < (120 if row.op_type in ("LayerNorm", "RMSNorm") else 80), row  # 16-bit
    # the last layer's output is the model output
    assert report.layers[-1].sqnr_db == pytest.approx(report.output_sqnr_db, rel=1e-12)
    # the first layer reads the model input, so its local and cumulative errors are the same
    assert report.layers[0].local_sqnr_db == pytest.approx(report.layers[0].sqnr_db, rel=1e-12)


def test_local_sqnr_matches_hand_computation(cnn):
    _, sim, batches, report = cnn
    row = next(r for r in report.layers if r.name == "conv2")
    conv2 = sim.model.get_submodule("conv2")
    inputs: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []

    def record(module, args, out):
        inputs.append(args[0].clone())
        outs.append(out.clone())

    handle = conv2.register_forward_hook(record)
    try:
        with torch.no_grad():
            for b in batches:
                sim.model(b)
    finally:
        handle.remove()
    with sim.quantizers_disabled(), torch.no_grad():
        plain = [conv2(i) for i in inputs]  # the same (quantized-model) input, conv2 without its quantizers
    assert row.local_sqnr_db == pytest.approx(_sqnr(plain, outs), rel=1e-9)
    assert row.local_sqnr_db > row.sqnr_db  # conv2 alone adds less error than everything up to it


def test_local_sqnr_is_inf_when_the_quantizers_change_nothing():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(64, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sim = QuantizationSimModel(model, x, config_file={"defaults": {"ops": {"is_output_quantized": True}}})
    sim.compute_encodings([x], progress=False)
    lin, relu = sim.model.get_submodule("0"), sim.model.get_submodule("1")
    # the ReLU re-quantizes values already on the linear's grid (which holds 0): an exact no-op
    relu.output_quantizers[0].set_encodings(lin.output_quantizers[0].get_encodings())
    report = sim.layer_sqnr([x])
    row = {r.name: r for r in report.layers}["1"]
    assert row.local_sqnr_db == math.inf
    assert row.sqnr_db < 60  # the error built up before it is still there
    assert math.isfinite({r.name: r for r in report.layers}["0"].local_sqnr_db)


def test_shared_module_accumulates_every_call():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.act = nn.Linear(8, 8), nn.Linear(8, 8), nn.ReLU()

        def forward(self, x):
            return self.act(self.fc2(self.act(self.fc1(x))))

    torch.manual_seed(0)
    batches = [torch.randn(16, 8), torch.randn(16, 8) * 2]
    sim = _sim(Shared(), batches)
    report = sim.layer_sqnr(batches)
    assert [r.name for r in report.layers] == ["fc1", "act", "fc2"]  # one row, first call's position
    quantized = _capture(sim, batches, ["act"])
    with sim.quantizers_disabled():
        reference = _capture(sim, batches, ["act"])
    assert len(quantized["act"]) == 4
    assert report.layers[1].sqnr_db == pytest.approx(_sqnr(reference["act"], quantized["act"]), rel=1e-9)


def test_two_input_model_with_tuple_batches():
    class TwoIn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(7, 4)

        def forward(self, a, b):
            return self.fc(torch.cat([a, b], dim=-1))

    torch.manual_seed(0)
    batches = [(torch.randn(8, 3), torch.randn(8, 4)) for _ in range(2)]
    sim = QuantizationSimModel(TwoIn(), batches[0])
    sim.compute_encodings(batches, progress=False)
    report = sim.layer_sqnr(batches)
    assert [r.name for r in report.layers] == ["cat", "fc"]
    assert report.output_sqnr_db == pytest.approx(report.layers[-1].sqnr_db, rel=1e-12)


def test_report_leaves_the_sim_as_it_was(cnn):
    _, sim, batches, _ = cnn
    sim.model.train()
    slots = {n: (list(m.input_quantizers), list(m.output_quantizers), dict(m.param_quantizers.items()))
             for n, m in sim.quantized_modules()}
    hooks = {n: (len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in sim.model.named_modules()}
    try:
        sim.layer_sqnr(batches[:1])
        assert sim.model.training and all(m.training for m in sim.model.modules())
    finally:
        sim.model.eval()
    for n, m in sim.quantized_modules():
        assert list(m.input_quantizers) == slots[n][0] and list(m.output_quantizers) == slots[n][1]
        assert all(m.param_quantizers[k] is v for k, v in slots[n][2].items())
    assert {n: (len(m._forward_hooks), len(m._forward_pre_hooks)) for n, m in sim.model.named_modules()} == hooks


# -- presentation ----------------------------------------------------------------------------------
def _report() -> LayerSQNRReport:
    return LayerSQNRReport(
        [LayerSQNR("stem.conv", "Conv2d", 40.0, 45.0), LayerSQNR("attn.softmax", "Softmax", 30.0, 18.5),
         LayerSQNR("head", "Linear", 25.0, math.inf), LayerSQNR("a", "ReLU", 35.0, 31.0)],
        output_sqnr_db=24.5)


def test_most_sensitive_orders_by_local_sqnr():
    report = _report()
    assert [r.name for r in report.most_sensitive(2)] == ["attn.softmax", "a"]
    assert [r.name for r in report.most_sensitive()] == ["attn.softmax", "a", "stem.conv", "head"]
    assert report.most_sensitive(0) == []


def test_most_sensitive_on_a_real_report(transformer):
    _, sim, batches, report = transformer
    worst = report.most_sensitive(3)
    assert len(worst) == 3
    assert worst[0].local_sqnr_db == min(r.local_sqnr_db for r in report.layers)
    assert [r.local_sqnr_db for r in worst] == sorted(r.local_sqnr_db for r in worst)
    rest = [r for r in report.layers if r not in worst]
    assert max(r.local_sqnr_db for r in worst) <= min(r.local_sqnr_db for r in rest)


def test_to_table_lists_every_layer(cnn):
    _, sim, batches, report = cnn
    table = report.to_table()
    lines = table.splitlines()
    assert len(lines) == len(report.layers) + 2  # header, rows, model output
    assert lines[0].split() == ["layer", "type", "SQNR", "dB", "local", "dB"]
    for line, row in zip(lines[1:], report.layers):
        assert line.split()[:2] == [row.name, row.op_type]
        assert line.split()[2:] == [f"{row.sqnr_db:.2f}", f"{row.local_sqnr_db:.2f}"]
    assert lines[-1].split() == ["model", "output", f"{report.output_sqnr_db:.2f}"]
    assert str(report) == table


def test_to_table_shows_inf():
    table = _report().to_table()
    assert "inf" in table.splitlines()[3]
    assert len({len(line.rstrip()) for line in table.splitlines()[:-1]}) == 1  # fixed width columns


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sqnr.png"
    _report().plot(str(path), title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match=r"pip install 'quanta\[plot\]'"):
        _report().plot(str(tmp_path / "sqnr.png"))
    assert not (tmp_path / "sqnr.png").exists()
