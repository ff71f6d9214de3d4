"""mtq.auto_quantize: the budget holds, the search is exact, sensitive layers keep more bits, bad input is refused."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quanta.modelopt as mtq
from quanta.modelopt.auto_quantize import _choose, format_bits


def _model_and_data():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    with torch.no_grad():
        model[2].weight[:, :4] *= 40  # outlier columns: 4-bit blocks hurt this layer most
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(4)]
    return model, data


def _loss(model, data):
    with torch.no_grad():
        return sum(float(F.cross_entropy(model(x), y)) for x, y in data) / len(data)


def _search(budget, method="gradient", formats=("INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "INT8_WEIGHT_ONLY_CFG")):
    model, data = _model_and_data()
    kwargs = dict(loss_func=lambda out, b: F.cross_entropy(out, b[1])) if method == "gradient" else {}
    model, state = mtq.auto_quantize(model, {"effective_bits": budget}, list(formats), data,
                                     lambda m, b: m(b[0]), method=method, **kwargs)
    return model, data, state


def test_budget_and_recipe():
    model, data, state = _search(6.0)
    best = state["best"]
    assert best["is_satisfied"] and best["constraints"]["effective_bits"] <= 6.0
    assert set(best["recipe"]) == {"0", "2", "4"}
    for name, fmt in best["recipe"].items():
        wq = model.get_submodule(name).weight_quantizer
        assert wq.is_enabled == (fmt != "NONE(16 bits)")
        if fmt == "INT4_BLOCKWISE_WEIGHT_ONLY_CFG":
            assert wq.num_bits == 4 and wq.amax is not None
    stats = state["candidate_stats"]["2"]
    int4, int8 = stats["scores"][1], stats["scores"][2]
    assert int4 > int8 > 0 and stats["scores"][0] == 0.0


def test_sensitive_layer_keeps_more_bits():
    _, _, state = _search(4.0 + 4.0 * 128 * 128 / (64 * 128 + 128 * 128 + 128 * 10))  # room for one 8-bit layer 2
    assert state["best"]["recipe"]["2"] == "INT8_WEIGHT_ONLY_CFG"


def test_a_generous_budget_keeps_float_and_a_tight_one_quantizes_all():
    model, data, state = _search(16.0)
    assert set(state["best"]["recipe"].values()) == {"NONE(16 bits)"}
    ref_model, _ = _model_and_data()
    assert _loss(model, data) == _loss(ref_model, data)
    model, data, state = _search(4.0)
    assert set(state["best"]["recipe"].values()) == {"INT4_BLOCKWISE_WEIGHT_ONLY_CFG"}


def test_kl_div_method():
    _, _, state = _search(6.0, method="kl_div")
    assert state["best"]["constraints"]["effective_bits"] <= 6.0
    assert state["candidate_stats"]["2"]["scores"][1] > state["candidate_stats"]["2"]["scores"][2]


def test_search_is_exact():
    rnd = random.Random(0)
    for _ in range(30):
        layers = [f"l{i}" for i in range(rnd.randint(1, 5))]
        scores = {n: [rnd.random() * 10 for _ in range(3)] for n in layers}
        costs = {n: [rnd.choice([1, 2, 4, 8, 16]) * rnd.randint(1, 4) for _ in range(3)] for n in layers}
        budget = rnd.uniform(sum(min(c) for c in costs.values()), sum(max(c) for c in costs.values()))
        picks = _choose(scores, costs, budget)
        best = min((sum(scores[n][i] for n, i in zip(layers, combo)), combo)
                   for combo in itertools.product(range(3), repeat=len(layers))
                   if sum(costs[n][i] for n, i in zip(layers, combo)) <= budget)
        assert sum(scores[n][picks[n]] for n in layers) == pytest.approx(best[0])


def test_format_bits():
    assert format_bits(mtq.INT8_DEFAULT_CFG) == 8 and format_bits(mtq.FP8_DEFAULT_CFG) == 8
    assert format_bits(mtq.NVFP4_DEFAULT_CFG) == 4.5 and format_bits(mtq.MXFP8_DEFAULT_CFG) == 8.25


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(loss_func=None), ValueError, "loss_func"),
    (dict(quantization_formats=["INT3_CFG"]), ValueError, "INT3_CFG"),
    (dict(quantization_formats=["INT8_SMOOTHQUANT_CFG"]), NotImplementedError, "smoothquant"),
    (dict(constraints={"effective_bits": 1.0}), ValueError, "budget"),
    (dict(constraints={"weight_compression": 0.5}), ValueError, "effective_bits"),
    (dict(method="hessian"), ValueError, "method"),
    (dict(checkpoint="state.pth"), ValueError, "checkpoint"),
])
def test_bad_input(kwargs, exc, words):
    model, data = _model_and_data()
    args = dict(constraints={"effective_bits": 6.0}, quantization_formats=["INT8_WEIGHT_ONLY_CFG"],
                data_loader=data, forward_step=lambda m, b: m(b[0]),
                loss_func=lambda out, b: F.cross_entropy(out, b[1]))
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        mtq.auto_quantize(model, **args)
