import pytest
import torch

from quanta.kernels.blocks import check_block_size, resolve_layout


@pytest.mark.parametrize(
    "x, s, b, expected",
    [
        ((8, 8), (), None, ()),
        ((8, 8), (8, 1), None, (1, 8)),
        ((8, 8), (1, 8), None, (8, 1)),
        ((3, 8, 8), (8, 1), None, (1, 8)),  # leading input dims broadcast
        ((8, 8), (8, 2), (-1, 4), (1, 4)),
        ((8, 8), (8, 2), (1, -1), (1, 4)),
        ((8, 8), (2, 2), (4, 4), (4, 4)),
        ((2, 6, 8), (3, 2), (2, 4), (2, 4)),
        ((4,), (1, 1, 4), None, (1,)),  # leading singleton scale dims dropped
    ],
)
def test_resolve(x, s, b, expected):
    assert resolve_layout(x, s, b).block_size == expected


def test_blocked_shapes_and_reduction():
    layout = resolve_layout((2, 6, 8), (3, 2), (2, 4))
    assert layout.blocked_input_shape == (2, 3, 2, 2, 4)
    assert layout.blocked_scale_shape == (3, 1, 2, 1)
    assert layout.reduce_dims() == (0, 2, 4)
    t = torch.ones(2, 3, 2, 2, 4)
    assert torch.equal(layout.reduce_to_scale(t), torch.full((3, 2), 16.0))


def test_expand_scale_follows_floor_formula():
    layout = resolve_layout((4, 6), (2, 3), (2, 2))
    s = torch.arange(6.0).reshape(2, 3)
    e = layout.expand_scale(s)
    for j0 in range(4):
        for j1 in range(6):
            assert e[j0, j1] == s[j0 // 2, j1 // 2]


@pytest.mark.parametrize(
    "x, s, b, msg",
    [
        ((8, 10), (8, 3), (-1, -1), r"dim 1 of the input \(10\) is not divisible by dim 1 of the scale \(3\)"),
        ((8, 8), (8, 2), (-1, 3), r"block_size \(-1, 3\) does not fit input shape \(8, 8\)"),
        ((8, 8), (8, 2), None, r"does not broadcast to input shape \(8, 8\)"),
        ((8, 8), (8, 2), (4,), "one entry per scale dimension"),
        ((8,), (2, 8), None, "more dimensions"),
    ],
)
def test_bad_layouts(x, s, b, msg):
    with pytest.raises(ValueError, match=msg):
        resolve_layout(x, s, b)


@pytest.mark.parametrize("bad", [0, (0, 4), (-2, 4)])
def test_bad_block_size_values(bad):
    with pytest.raises((TypeError, ValueError), match="block_size"):
        check_block_size(bad)


@pytest.mark.parametrize("bad", [4, "44", (4.0, 2), (True, 2), torch.tensor([4])])
def test_bad_block_size_types(bad):
    with pytest.raises(TypeError, match="block_size"):
        check_block_size(bad)
