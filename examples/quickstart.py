"""quanta quick start: fake-quantize, calibrate and inspect, with the AIMET-style API.

Run:  python examples/quickstart.py
"""

import torch

import quanta.quantization as Q


def main() -> None:
    torch.manual_seed(0)

    # 1. Functional fake quantization (seed 001): scale 1/15, 4-bit unsigned grid.
    x = torch.arange(start=-0.3, end=1.3, step=0.05)
    print("quantize_dequantize, 4-bit:")
    print(Q.affine.quantize_dequantize(x, torch.tensor(1 / 15), torch.tensor(0.0), bitwidth=4))

    # 2. A per-channel weight quantizer, calibrated with MinMax (seed 002).
    weight = torch.randn(8, 16)
    qtzr = Q.affine.QuantizeDequantize(shape=(8, 1), bitwidth=8, symmetric=True)
    with qtzr.compute_encodings():
        qtzr(weight)
    w_qdq = qtzr(weight)
    w_q = w_qdq.quantize()
    print(f"\n{qtzr}")
    print("scale per channel:", qtzr.get_scale().detach().flatten())
    print("int8 codes of channel 0:", w_q.quantized_repr()[0])
    err = (w_qdq - weight).abs().max().item()
    print(f"max |error| = {err:.5f} <= max scale / 2 = {qtzr.get_scale().max().item() / 2:.5f}")

    # 3. Quantization-aware training: the range is learnable.
    act = Q.affine.QuantizeDequantize(shape=(), bitwidth=4, symmetric=False)
    data = torch.randn(4096)
    with act.compute_encodings():
        act(data)
    opt = torch.optim.Adam(act.parameters(), lr=1e-2)
    before = torch.mean((act(data) - data) ** 2).item()
    for _ in range(100):
        opt.zero_grad()
        loss = torch.mean((act(data) - data) ** 2)
        loss.backward()
        opt.step()
    print(f"\n4-bit activation MSE: MinMax {before:.5f} -> after 100 Adam steps on the range {loss.item():.5f}")
    print(f"learned range: [{act.get_min().item():.3f}, {act.get_max().item():.3f}]")


if __name__ == "__main__":
    main()
