"""BatchNorm re-estimation: the statistics it computes, what it leaves as it was, undo, bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quanta.quantsim import QuantizationSimModel
from quanta.quantsim.bn_reestimation import Handle, reestimate_bn_stats


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3), nn.Dropout(0.5), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(),
                         nn.Linear(6 * 8 * 8, 4), nn.BatchNorm1d(4))


def _batches(n: int, seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(5, 3, 10, 10, generator=g) * 2 + 1 for _ in range(n)]


def _bn_inputs(model: nn.Module, batches: list[torch.Tensor]) -> dict[nn.Module, list[torch.Tensor]]:
    """What each BatchNorm receives per batch, with every layer in eval mode but the BatchNorms (as re-estimation
    runs it), each BN normalising by its batch."""
    seen: dict[nn.Module, list[torch.Tensor]] = {}
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    hooks = [bn.register_forward_pre_hook(lambda m, a: seen.setdefault(m, []).append(a[0].detach().clone()))
             for bn in bns]
    model.eval()
    momenta = {bn: bn.momentum for bn in bns}
    for bn in bns:
        bn.train()
    with torch.no_grad():
        for b in batches:
            model(b)
    for bn in bns:
        bn.eval()
        bn.momentum = momenta[bn]
    for h in hooks:
        h.remove()
    return seen


def test_statistics_are_the_averages_of_the_batches():
    model, batches = _model(), _batches(4)
    reference = _model()
    inputs = _bn_inputs(reference, batches)
    reestimate_bn_stats(model, batches, num_batches=10, progress=False)  # the list ends first: 4 batches
    for bn in (model[2], model[6]):
        ref_bn = reference[2] if bn is model[2] else reference[6]
        dims = [0, 2, 3] if bn is model[2] else [0]
        var_mean = [torch.var_mean(x.double(), dim=dims, unbiased=True) for x in inputs[ref_bn]]
        torch.testing.assert_close(bn.running_mean.double(), torch.stack([m for _, m in var_mean]).mean(0),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bn.running_var.double(), torch.stack([v for v, _ in var_mean]).mean(0),
                                   rtol=1e-5, atol=1e-6)


def test_num_batches_limits_the_batches_used():
    a, b = _model(), _model()
    batches = _batches(6)
    reestimate_bn_stats(a, batches, num_batches=2, progress=False)
    reestimate_bn_stats(b, batches[:2], progress=False)
    assert torch.equal(a[2].running_mean, b[2].running_mean) and torch.equal(a[2].running_var, b[2].running_var)


def test_dropout_stays_off_and_flags_and_momenta_are_restored():
    model = _model().train()
    model[2].momentum = 0.3
    reestimate_bn_stats(model, _batches(3), progress=False)
    first = model[2].running_mean.clone()
    assert all(m.training for m in model.modules()) and model[2].momentum == 0.3
    reestimate_bn_stats(model, _batches(3), progress=False)  # dropout off: the same statistics again
    assert torch.equal(model[2].running_mean, first)


def test_handle_restores_the_previous_statistics():
    model = _model().eval()
    with torch.no_grad():
        model[2].running_mean.fill_(0.25)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    handle = reestimate_bn_stats(model, _batches(2), progress=False)
    assert not torch.equal(model[2].running_mean, before["2.running_mean"])
    handle.remove()
    handle.remove()  # once only
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with reestimate_bn_stats(model, _batches(2), progress=False):
        assert not torch.equal(model[6].running_var, before["6.running_var"])
    assert torch.equal(model[6].running_var, before["6.running_var"])


def test_forward_fn_and_any_iterable():
    model = _model()
    labelled = ((x, torch.zeros(5)) for x in _batches(3))  # a generator of (input, label)
    calls = []

    def forward_fn(m, batch):
        calls.append(1)
        return m(batch[0])

    reestimate_bn_stats(model, labelled, forward_fn=forward_fn, progress=False)
    assert len(calls) == 3


def test_a_simulated_model():
    model = _model().eval()
    x = _batches(1)[0]
    sim = QuantizationSimModel(model, dummy_input=x)
    sim.compute_encodings(lambda m, _: m(x), None)
    bn = next(m for m in sim.model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    before = bn.running_mean.clone()
    handle = reestimate_bn_stats(sim.model, _batches(3), progress=False)
    assert not torch.equal(bn.running_mean, before)
    handle.remove()
    assert torch.equal(bn.running_mean, before)


def test_an_error_in_forward_restores_everything():
    model = _model().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def broken(m, batch):
        m(batch)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        reestimate_bn_stats(model, _batches(2), forward_fn=broken, progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not model.training and model[2].momentum == 0.1


def test_bad_input():
    model = _model()
    with pytest.raises(TypeError, match="nn.Module"):
        reestimate_bn_stats("model", _batches(1))
    with pytest.raises(ValueError, match="num_batches"):
        reestimate_bn_stats(model, _batches(1), num_batches=0)
    with pytest.raises(ValueError, match="num_batches"):
        reestimate_bn_stats(model, _batches(1), num_batches=True)
    with pytest.raises(TypeError, match="forward_fn"):
        reestimate_bn_stats(model, _batches(1), forward_fn=3)
    with pytest.raises(TypeError, match="iterable"):
        reestimate_bn_stats(model, 5)
    with pytest.raises(ValueError, match="no BatchNorm"):
        reestimate_bn_stats(nn.Linear(3, 3), _batches(1))
    before = model[2].running_mean.clone()
    with pytest.raises(ValueError, match="no batches"):
        reestimate_bn_stats(model, [], progress=False)
    assert torch.equal(model[2].running_mean, before)
    assert isinstance(Handle(lambda: None), Handle)
