"""The CPU integer linear kernels as opaque ``torch.library`` ops, for ``torch.compile``.

Eager code calls :mod:`quanta.kernels.int_linear` directly. Traced code
(``torch.compile``, ``torch.export``) cannot run those functions: they check
data pointers and values that traced tensors do not have, and Inductor cannot
lower the native kernels (opaque C++ ops) on unrealized inputs. Wrapped as custom ops with a
shape-only fake implementation, they stay single opaque calls in the graph and
run the same code, with the same bits, at run time.

>>> w = torch.tensor([[1, -2] * 8, [3, 0] * 8], dtype=torch.int8)
>>> s = torch.tensor([0.5, 0.25], dtype=torch.bfloat16)
>>> torch.ops.quanta.int8_weight_only_linear(torch.ones(1, 16), w, s, None)
tensor([[-4.,  6.]])
"""

from __future__ import annotations

from typing import Optional

import torch

from quanta.kernels import int_linear as K

__all__ = ["int8_weight_only_linear", "int4_cpu_linear", "int8_dynamic_activation_linear"]


def _out(x: torch.Tensor, n: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))


@torch.library.custom_op("quanta::int8_weight_only_linear", mutates_args=())
def int8_weight_only_linear(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                            bias: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`quanta.kernels.int_linear.int8_weight_only_linear` as an op."""
    return K.int8_weight_only_linear(x, weight_int8, scale, bias)


@int8_weight_only_linear.register_fake
def _(x, weight_int8, scale, bias):
    return _out(x, weight_int8.shape[0])


@torch.library.custom_op("quanta::int4_cpu_linear", mutates_args=())
def int4_cpu_linear(x: torch.Tensor, packed_weight: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int,
                    out_features: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`quanta.kernels.int_linear.int4_cpu_linear` as an op."""
    return K.int4_cpu_linear(x, packed_weight, scale_and_zero, group_size, out_features, bias)


@int4_cpu_linear.register_fake
def _(x, packed_weight, scale_and_zero, group_size, out_features, bias):
    return _out(x, out_features)


@torch.library.custom_op("quanta::int8_dynamic_activation_linear", mutates_args=())
def int8_dynamic_activation_linear(x: torch.Tensor, weight_t: torch.Tensor, weight_scale: torch.Tensor,
                                   weight_col_sums: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                                   act_symmetric: bool) -> torch.Tensor:
    """:func:`quanta.kernels.int_linear.int8_dynamic_activation_linear` as an op."""
    return K.int8_dynamic_activation_linear(x, weight_t, weight_scale, weight_col_sums, bias,
                                            act_symmetric=act_symmetric)


@int8_dynamic_activation_linear.register_fake
def _(x, weight_t, weight_scale, weight_col_sums, bias, act_symmetric):
    return _out(x, weight_t.shape[1])
