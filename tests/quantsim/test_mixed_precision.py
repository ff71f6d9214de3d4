"""Mixed precision: quantizer groups, BitOps, the chosen configuration meets the budget with fewer bits than the
baseline and is what the sim is left in, early exits, resuming from the cache, float candidates, supported
kernels, the phase-2 searches, the SQNR callback, and bad input."""

from __future__ import annotations

import json
import random
import warnings

import pytest
import torch
from quantsim_models import tiny_bert
from torch import nn

from quanta.mixed_precision import (
    AMPSearchAlgo,
    EvalCallbackFactory,
    QuantizationDataType,
    choose_mixed_precision,
    find_quantizer_groups,
)
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantsim import QuantizationSimModel
from quanta.quantsim.mixed_precision import _search

W8A16 = ((16, QuantizationDataType.int), (8, QuantizationDataType.int))
W4A8 = ((8, int), (4, int))
CONFIG = {"defaults": {"ops": {"is_output_quantized": "True"},
                       "params": {"is_quantized": "True", "is_symmetric": "True"}},
          "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
          "supergroups": [{"op_list": ["Gemm", "Relu"]}, {"op_list": ["Conv", "Relu"]}],
          "model_input": {"is_input_quantized": "True"}, "model_output": {}}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _mlp(outlier=True):
    """Three Linear layers; an outlier weight in layer "2" makes its 4-bit per-tensor weights lose the rest."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8)).eval()
    if outlier:
        with torch.no_grad():
            model[2].weight[0, 0] = 3.0
    data = [torch.randn(64, 16) for _ in range(2)]
    reference = [model(x) for x in data]

    def score(m):
        return float(sum(torch.cosine_similarity(m(x), r, dim=1).mean() for x, r in zip(data, reference)) / 2)

    def forward(m):
        for x in data:
            m(x)
    return model, data, score, forward


def _bits(sim, layer):
    q = sim.model.get_submodule(layer).param_quantizers["weight"]
    return q.bitwidth


def test_groups_share_the_activation_that_feeds_their_layers():
    class Branches(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3)
            self.relu = nn.ReLU()
            self.a = nn.Conv2d(8, 4, 1)
            self.b = nn.Conv2d(8, 4, 1)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.flat = nn.Flatten()
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            y = self.relu(self.stem(x))
            return self.fc(self.flat(self.pool(self.a(y) + self.b(y))))

    sim = QuantizationSimModel(Branches().eval(), torch.randn(2, 3, 8, 8), config_file=CONFIG)
    groups = {g.parameter_quantizers: g for g in find_quantizer_groups(sim)}
    assert groups[("stem",)].input_quantizers == ("stem_input_quantizer_idx_0",)
    assert groups[("a", "b")].output_quantizers == ("relu",)  # one ReLU output feeds both convolutions
    assert groups[("fc",)].output_quantizers == ("pool",)  # through the Flatten
    act_only = [g for g in find_quantizer_groups(sim) if not g.parameter_quantizers]
    assert act_only and all(len(g.to_list()) == 1 for g in act_only)


def test_meets_the_budget_with_fewer_bits_and_leaves_the_sim_there(tmp_path):
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    pareto = choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.01, tmp_path, True, forward,
                                    progress=False)
    info = dict((k, v) for k, v in json.loads((tmp_path / "amp_info_list.json").read_text()))
    assert info["baseline candidate"] == "W: int8 / A: int16"
    assert info["final score"] >= 1.0 - 0.01 and score(sim.model) == pytest.approx(info["final score"])
    assert info["final relative BitOps"] < 1.0  # fewer bits than uniform W8A16
    assert _bits(sim, "2") == 8 and _bits(sim, "0") == 4  # the outlier layer keeps 8 bits, another drops to 4
    uniform_w4a8 = dict(info["candidate scores"])["W: int4 / A: int8"]
    assert uniform_w4a8 < 1.0 - 0.01  # so a uniform choice would have needed W8A16 everywhere
    saved = json.loads((tmp_path / "pareto_list.json").read_text())
    assert [p[:2] for p in saved] == [list(p[:2]) for p in pareto]
    assert saved[0][2][0][0] in ("input", "output", "weight") and saved[0][3].startswith(("W:", "A:"))
    for name in ("pareto_curve.html", "pareto_curve.png", "quantizer_group_sensitivity.html",
                 "quantizer_group_sensitivity.png", ".cache/accuracy_list.json", ".cache/pareto_list.json"):
        assert (tmp_path / name).is_file(), name
    assert "data:image/png;base64," in (tmp_path / "pareto_curve.html").read_text()


@pytest.mark.parametrize("algo", list(AMPSearchAlgo))
@pytest.mark.parametrize("refine", [False, True])
def test_reverse_phase2_starts_low_and_moves_the_sensitive_groups_up(tmp_path, algo, refine):
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    pareto = choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.01, tmp_path, True, forward,
                                    phase2_reverse=True, amp_search_algo=algo, refine=refine, progress=False)
    info = dict((k, v) for k, v in json.loads((tmp_path / "amp_info_list.json").read_text()))
    assert info["final score"] >= 1.0 - 0.01 and score(sim.model) == pytest.approx(info["final score"])
    assert info["final relative BitOps"] < 1.0
    assert _bits(sim, "2") == 8 and _bits(sim, "0") == 4  # the outlier layer moved up, another stayed at 4 bits
    accuracy = json.loads((tmp_path / ".cache" / "accuracy_list.json").read_text())
    walk = json.loads((tmp_path / ".cache" / "pareto_list_reverse.json").read_text())
    # the walk reads the accuracy list backwards: the changes that save no BitOps (listed last) are undone first,
    # for free, then the most sensitive of the others, to the baseline
    saving = {r["group_index"]: r["bit_ops_reduction"] for r in accuracy}
    walk_order = sorted(walk, key=lambda p: p["prefix"])
    free = [p for p in walk_order if saving[p["group_index"]] == 0]
    assert walk_order[:len(free)] == free
    if len(walk_order) > len(free):
        worst = min((r for r in accuracy if r["bit_ops_reduction"] > 0), key=lambda r: r["score"])
        first = walk_order[len(free)]
        assert first["group_index"] == worst["group_index"] and first["candidate"] == [[16, "int"], [8, "int"]]
    # relative BitOps rise along the walk (it only moves groups up) and the points match the returned list
    costs = [p["relative_bit_ops"] for p in sorted(walk, key=lambda p: p["prefix"])]
    assert costs == sorted(costs) and costs[0] < 1.0
    assert [p[:2] for p in pareto][:len(walk)] == [(p["relative_bit_ops"], p["score"])
                                                  for p in sorted(walk, key=lambda p: p["prefix"])]


def test_reverse_phase2_ends_at_the_baseline_when_only_it_meets_the_budget(tmp_path):
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)

    def strict(m):  # any 4-bit weight costs: with a zero budget only the walk's end (every group moved up) meets it
        weights = [m.get_submodule(n).param_quantizers["weight"] for n in ("0", "2", "4")]
        return 0.5 if any(q is not None and q.bitwidth == 4 for q in weights) else 1.0

    with torch.no_grad():
        pareto = choose_mixed_precision(sim, data[0], [W8A16, W4A8], strict, strict, 0.0, tmp_path, True, forward,
                                        phase2_reverse=True, progress=False)
    assert [_bits(sim, n) for n in ("0", "2", "4")] == [8, 8, 8]
    assert pareto[-1][:2] == (1.0, 1.0)  # the last point: everything back at the baseline


def test_bit_ops_savings_are_macs_times_bits(tmp_path):
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, None, tmp_path, True, forward, progress=False)
    rows = json.loads((tmp_path / ".cache" / "accuracy_list.json").read_text())
    saving = {tuple(tuple(x) for x in r["group"]): r["bit_ops_reduction"] for r in rows}
    assert saving[(("output", "1"), ("weight", "2"))] == 64 * 64 * (16 * 8 - 8 * 4)
    assert saving[(("input", "0_input_quantizer_idx_0"), ("weight", "0"))] == 16 * 64 * (16 * 8 - 8 * 4)
    assert saving[(("output", "4"),)] == 0  # the model output feeds no layer
    # allowed_accuracy_drop None: every point evaluated, the sim left at the cheapest (W4A8 everywhere)
    pareto = json.loads((tmp_path / "pareto_list.json").read_text())
    assert len(pareto) == len(rows) and pareto[-1][0] == pytest.approx(0.25)
    assert {_bits(sim, n) for n in ("0", "2", "4")} == {4}


def test_early_exits(tmp_path):
    model, data, score, forward = _mlp(outlier=False)
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    assert choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.5, tmp_path, True, forward,
                                  progress=False) is None  # W4A8 everywhere already within 0.5
    assert {_bits(sim, n) for n in ("0", "2", "4")} == {4}
    with pytest.warns(UserWarning, match="even the best candidate"):
        assert choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.0, tmp_path, True, forward,
                                      progress=False) is None
    assert {_bits(sim, n) for n in ("0", "2", "4")} == {8}


def test_resumes_from_the_cache(tmp_path):
    model, data, score, forward = _mlp()
    calls = []

    def phase1(m):
        calls.append(1)
        return score(m)
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    first = choose_mixed_precision(sim, data[0], [W8A16, W4A8], phase1, score, 0.01, tmp_path, True, forward,
                                   progress=False)
    n = len(calls)
    assert n == 4  # four groups, one cheaper candidate each
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    again = choose_mixed_precision(sim, data[0], [W8A16, W4A8], phase1, score, 0.01, tmp_path, False, forward,
                                   progress=False)
    assert len(calls) == n and [p[:2] for p in again] == [p[:2] for p in first]
    choose_mixed_precision(sim, data[0], [W8A16, W4A8], phase1, score, 0.01, tmp_path, True, forward,
                           progress=False)
    assert len(calls) == 2 * n  # clean_start: computed again


def test_float_candidates(tmp_path):
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    fp16 = ((16, float), (16, float))
    choose_mixed_precision(sim, data[0], [fp16, W4A8], score, score, 0.01, tmp_path, True, forward, progress=False)
    weight = sim.model.get_submodule("2").param_quantizers["weight"]
    assert isinstance(weight, FloatQuantizeDequantize)  # the sensitive layer stays in fp16
    no_quant = ((32, float), (32, float))
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    choose_mixed_precision(sim, data[0], [no_quant, W4A8], score, score, 0.01, tmp_path, True, forward,
                           progress=False)
    assert sim.model.get_submodule("2").param_quantizers["weight"] is None


def test_supported_kernels_restrict_the_candidates(tmp_path):
    model, data, score, forward = _mlp()
    only_w8a16 = {**CONFIG, "defaults": {**CONFIG["defaults"], "supported_kernels": [
        {"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}]}}
    sim = QuantizationSimModel(model, data[0], config_file=only_w8a16)
    assert choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.01, tmp_path, True, forward,
                                  progress=False) is None  # the only supported candidate meets the budget
    assert {_bits(sim, n) for n in ("0", "2", "4")} == {8}
    sim = QuantizationSimModel(model, data[0], config_file=only_w8a16)
    assert choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.01, tmp_path, True, forward,
                                  use_all_amp_candidates=True, progress=False)


@pytest.mark.parametrize("algo", list(AMPSearchAlgo))
def test_searches_find_the_last_point_above_the_target(algo):
    rng = random.Random(int(algo))
    for _ in range(200):
        n = rng.randint(1, 30)
        scores = sorted((rng.random() for _ in range(n)), reverse=True)
        target = rng.uniform(-0.1, 1.1)
        values = [lambda v=v: v for v in scores]
        i = _search(values, target, algo)
        above = [k for k, v in enumerate(scores) if v >= target]
        assert i == (above[-1] if above else 0)


def test_sqnr_callback():
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    sim.compute_encodings(forward, progress=False)
    sqnr = EvalCallbackFactory(data).sqnr(num_samples=64)
    value = sqnr(sim.model)
    assert 0 < value < 100
    with sim.quantizers_disabled():
        assert sqnr(sim.model) == float("inf")
    with pytest.raises(ValueError, match="num_samples"):
        EvalCallbackFactory(data).sqnr(0)
    with pytest.raises(TypeError, match="data_loader"):
        EvalCallbackFactory(torch.randn(3))


def test_bad_input(tmp_path):
    model, data, score, forward = _mlp()
    sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
    args = (data[0], [W8A16, W4A8], score, score, 0.01, tmp_path, True, forward)
    with pytest.raises(TypeError, match="sim must be a QuantizationSimModel"):
        choose_mixed_precision(model, *args)
    with pytest.raises(ValueError, match="candidates"):
        choose_mixed_precision(sim, data[0], [W8A16, (8, 4)], *args[2:])
    with pytest.raises(ValueError, match="float candidates"):
        choose_mixed_precision(sim, data[0], [W8A16, ((8, float), (8, float))], *args[2:])
    with pytest.raises(ValueError, match="at least two"):
        choose_mixed_precision(sim, data[0], [W8A16, W8A16], *args[2:])
    with pytest.raises(TypeError, match="eval_callback_for_phase1"):
        choose_mixed_precision(sim, data[0], [W8A16, W4A8], 1.0, *args[3:])
    with pytest.raises(ValueError, match="allowed_accuracy_drop"):
        choose_mixed_precision(sim, *args[:4], -0.1, *args[5:])
    with pytest.raises(TypeError, match="phase2_reverse"):
        choose_mixed_precision(sim, *args, phase2_reverse=1)
    with pytest.raises(ValueError, match="amp_search_algo"):
        choose_mixed_precision(sim, *args, amp_search_algo=7)
    with pytest.raises(TypeError, match="clean_start"):
        choose_mixed_precision(sim, *args[:6], "yes", forward)


def test_transformers_model(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, batches = tiny_bert(transformers)
    with torch.no_grad():
        reference = [model(**b).last_hidden_state for b in batches]

    def cosine(m):
        return float(sum(torch.cosine_similarity(m(**b).last_hidden_state, r, dim=-1).mean()
                         for b, r in zip(batches, reference)) / 2)
    sim = QuantizationSimModel(model, batches[0])
    groups = {g.parameter_quantizers: g for g in find_quantizer_groups(sim)}
    qkv = tuple(f"encoder.layer.0.attention.self.{n}" for n in ("query", "key", "value"))
    assert groups[qkv].output_quantizers == ("embeddings.LayerNorm",)  # through the dropout
    assert groups[("encoder.layer.0.attention.output.dense",)].output_quantizers == (
        "encoder.layer.0.attention.self.matmul_1",)  # through the head reshapes
    assert groups[("pooler.dense",)].output_quantizers == ("encoder.layer.0.output.LayerNorm",)  # through [:, 0]
    sqnr = EvalCallbackFactory(batches, lambda m, b: m(**b).last_hidden_state).sqnr()
    pareto = choose_mixed_precision(sim, batches[0], [W8A16, W4A8], sqnr, cosine, None, tmp_path, True,
                                    lambda m: [m(**b) for b in batches], progress=False)
    assert len(pareto) == len(json.loads((tmp_path / ".cache" / "accuracy_list.json").read_text()))
    assert pareto[-1][0] == pytest.approx(0.25)  # every weighted layer at W4A8 in the end


def test_refine_never_costs_more_and_keeps_the_budget(tmp_path):
    model, data, score, forward = _mlp()
    results = {}
    for refine in (False, True):
        sim = QuantizationSimModel(model, data[0], config_file=CONFIG)
        choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, 0.01, tmp_path / str(refine), True,
                               forward, refine=refine, progress=False)
        info = dict(json.loads((tmp_path / str(refine) / "amp_info_list.json").read_text()))
        assert info["final score"] >= 1.0 - 0.01
        results[refine] = info["final relative BitOps"]
    assert results[True] <= results[False]
