"""What :class:`~quanta.dtypes.MXTensor` and :class:`~quanta.dtypes.NVFP4Tensor` share: a wrapper tensor whose
``F.linear`` runs on the codes a tile of output rows at a time, and whose other operations run on a float copy.

``F.linear(x, w, bias)`` never builds the whole float weight: it dequantizes
about 2**20 weight elements (at least 256 rows) at a time and computes
``addmm(bias[tile], x, w[tile].T)`` into the output's columns. That is bit for
bit the untiled ``addmm`` torchao computes (each output element is the same dot
product) as long as the tiles are not too narrow: torch's CPU GEMV for one
input row sums in another order for N < 128 rows (measured with 2 threads).
"""

from __future__ import annotations

import enum
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from quanta.dtypes.compile_cache import stable_hash_for_caching
from quanta.dtypes.dequantized_fallback import run_on_dequantized

__all__ = ["KernelPreference", "BlockScaledTensor", "tiled_linear"]

aten = torch.ops.aten
_LINEAR = {F.linear, torch._C._nn.linear}
_TILE_ELEMENTS = 1 << 20
_TILE_ROWS = 256  # narrower tiles change the summation order of torch's bf16 GEMV


class KernelPreference(str, enum.Enum):
    """torchao's kernel choice, accepted for compatibility: on the CPU every choice runs quanta's kernels
    (``EMULATED``'s numerics: the matmul of the dequantized operands)."""

    AUTO = "auto"
    TORCH = "torch"
    MSLK = "mslk"
    EMULATED = "emulated"
    TRITON = "triton"


def tiled_linear(x2: torch.Tensor, rows: Callable[[int, int], torch.Tensor], n_out: int,
                 bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``addmm(bias, x2, W.T)`` for ``W`` given by ``rows(r0, r1)`` (its float rows ``r0:r1``), a tile at a time."""
    k = x2.shape[-1]
    step = max(_TILE_ROWS, (_TILE_ELEMENTS // max(k, 1)) // _TILE_ROWS * _TILE_ROWS)
    if torch.is_grad_enabled() and (x2.requires_grad or (bias is not None and bias.requires_grad)):
        # autograd cannot write into out=: the tiles' products, joined
        return torch.cat([x2 @ rows(r0, min(r0 + step, n_out)).t() if bias is None else
                          torch.addmm(bias[r0:r0 + step], x2, rows(r0, min(r0 + step, n_out)).t())
                          for r0 in range(0, n_out, step)], dim=-1)
    out = x2.new_empty(x2.shape[0], n_out)
    for r0 in range(0, n_out, step):
        r1 = min(r0 + step, n_out)
        tile = rows(r0, r1)
        if bias is None:
            torch.mm(x2, tile.t(), out=out[:, r0:r1])
        else:
            torch.addmm(bias[r0:r1], x2, tile.t(), out=out[:, r0:r1])
    return out


class BlockScaledTensor(torch.Tensor):
    """Base of the block-scaled weight tensors: subclasses set ``tensor_data_names`` and
    ``optional_tensor_data_names`` (their tensors), ``tensor_attribute_names`` (the rest, in constructor order),
    and implement ``dequantize``, ``_linear`` and ``_with``."""

    tensor_data_names: tuple[str, ...] = ()
    optional_tensor_data_names: tuple[str, ...] = ()
    tensor_attribute_names: tuple[str, ...] = ()

    def dequantize(self, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _linear(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def _apply_fn_to_data(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "BlockScaledTensor":
        """The same tensor with ``fn`` applied to each of its tensors (device moves, detach, clone)."""
        return self._with(**{n: fn(getattr(self, n)) for n in self._tensor_names()})

    def _tensor_names(self) -> list[str]:
        return [*self.tensor_data_names, *(n for n in self.optional_tensor_data_names if getattr(self, n) is not None)]

    def _with(self, **changes) -> "BlockScaledTensor":  # pragma: no cover
        raise NotImplementedError

    @property
    def storage_nbytes(self) -> int:
        """Bytes of the stored tensors (codes, scales)."""
        return sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in self._tensor_names())

    def _stable_hash_for_caching(self) -> str:
        """The key of this tensor in torch.compile's caches (:mod:`quanta.dtypes.compile_cache`)."""
        return stable_hash_for_caching(self)

    def __tensor_flatten__(self):
        return self._tensor_names(), [getattr(self, a) for a in self.tensor_attribute_names]

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, outer_size, outer_stride):
        return cls._rebuild(inner, meta)

    @classmethod
    def _rebuild(cls, inner: dict, meta: list):  # pragma: no cover
        raise NotImplementedError

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LINEAR:
            x, w, bias = (*args, kwargs.get("bias"))[:3] if len(args) < 3 else args[:3]
            if isinstance(w, cls) and not isinstance(x, BlockScaledTensor) and not isinstance(bias,
                                                                                             BlockScaledTensor):
                if x.dim() == 0 or x.shape[-1] != w.shape[1]:
                    raise ValueError(f"F.linear: input has shape {tuple(x.shape)}, the {cls.__name__} weight "
                                     f"{tuple(w.shape)} needs {w.shape[1]} features")
                return w._linear(x, bias)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t = args[0] if args else None
        if isinstance(t, cls) and func in (aten.detach.default, aten.clone.default, aten.alias.default):
            return t._apply_fn_to_data(lambda d: func(d, *args[1:], **kwargs))
        if isinstance(t, cls) and func is aten._to_copy.default:
            moved = t
            if kwargs.get("device") is not None:
                moved = t._apply_fn_to_data(lambda d: d.to(device=kwargs["device"]))
            dtype = kwargs.get("dtype")
            if dtype is not None and dtype != t.dtype:
                if dtype not in (torch.float32, torch.bfloat16, torch.float16):
                    raise TypeError(f"a {cls.__name__} converts only to float32, bfloat16 or float16, not {dtype}")
                moved = moved._with(orig_dtype=dtype)
            return moved
        return run_on_dequantized(func, args, kwargs, lambda a: isinstance(a, BlockScaledTensor), cls.__name__)
