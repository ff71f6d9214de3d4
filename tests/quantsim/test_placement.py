"""quanta.quantsim.placement: config + graph facts -> a spec per quantizer slot, without touching the model."""

from __future__ import annotations

import torch
from torch import nn

from quanta.quantsim import INTEGER_ONLY, QuantSimConfig, prepare_model
from quanta.quantsim.construction import quantize_modules, quantized_modules
from quanta.quantsim.placement import Kind, place


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(8, 8) for _ in range(4))
        self.drop = nn.Dropout(0.1)
        self.emb = nn.Embedding(10, 8)
        self.p = nn.Parameter(torch.randn(8))

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.a(x), self.b(x), x], -1)  # a concat of three tensors
        z = torch.relu(self.drop(self.d(x)))  # Linear -> (dropout) -> ReLU: a supergroup
        w = self.c(x)
        return y[..., :8] + z + (torch.relu(w) + w) + x * self.p + self.emb(ids)  # c has two users: no supergroup


def _placed(config=None):
    prepared = prepare_model(Net().eval(), (torch.randn(2, 8), torch.randint(0, 10, (2,))))
    quantize_modules(prepared.model, prepared.method)
    modules = list(quantized_modules(prepared.model))
    before = {k: v.clone() for k, v in prepared.model.state_dict().items()}
    slots = {n: (list(m.input_quantizers), list(m.output_quantizers)) for n, m in modules}
    placements = place(QuantSimConfig.load(config), prepared.model, modules, prepared.graph, prepared.param_inputs)
    after = prepared.model.state_dict()
    assert list(after) == list(before) and all(torch.equal(after[k], v) for k, v in before.items())  # pure
    assert all((list(m.input_quantizers), list(m.output_quantizers)) == slots[n] for n, m in modules)
    return placements


def test_supergroups_drop_outputs_inside_the_chain_only():
    p = _placed()
    assert p["d"].outputs == (None,)  # through the dropout into the ReLU
    assert p["relu"].outputs[0] is not None
    assert p["c"].outputs[0] is not None  # its output has two users


def test_a_concat_gets_one_input_slot_per_tensor():
    p = _placed(INTEGER_ONLY)
    assert len(p["cat"].inputs) == 3


def test_a_parameter_read_in_forward_is_quantized_per_tensor_as_a_parameter():
    p = _placed()
    placed = p["mul"].inputs[1]
    assert placed.kind is Kind.PARAMETER and not placed.spec.per_channel and placed.spec.block_size is None
    assert p["a"].params["weight"].spec.per_channel  # the config's per-channel weights stay per channel


def test_integer_inputs_and_absent_parameters_get_nothing():
    p = _placed(INTEGER_ONLY)
    assert p["emb"].inputs == (None,)
    assert p["a"].params["bias"] is None  # the default config leaves biases in float


def test_without_a_graph_no_supergroup_applies():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    quantize_modules(model, prepare_model(model, trace=False).method)
    p = place(QuantSimConfig.load(), model, list(quantized_modules(model)), None)
    assert p["0"].outputs[0] is not None and p["0"].outputs[0].kind is Kind.ACTIVATION
