"""QuantizerBase: the calibration protocol shared by every quantizer module."""

from __future__ import annotations

import abc
import contextlib
from typing import Iterator

from typing import Any

import torch
from torch import nn

__all__ = ["QuantizerBase"]


class QuantizerBase(nn.Module, abc.ABC):
    """Base class of quanta's quantizer modules.

    A quantizer holds its encoding as module state and runs in two modes:

    * calibration, inside ``with quantizer.compute_encodings():`` — each forward
      call feeds the encoding analyzer and quantizes with the batch's own range;
      on exit the accumulated statistics become the quantizer's encoding;
    * normal — forward quantizes with the stored encoding (an error if none).

    ``allow_overwrite(False)`` freezes the encoding: ``compute_encodings`` then
    leaves it untouched. The initialised flag is a buffer, so it travels with
    ``state_dict`` and is broadcast by DDP like any other buffer.
    """

    _version = 1

    def __init__(self) -> None:
        super().__init__()
        self._allow_overwrite = True
        self._calibrating = False
        self.register_buffer("_initialized", torch.tensor(False), persistent=True)

    def is_initialized(self) -> bool:
        """True once the encoding has been set (by calibration, ``set_range`` or loading)."""
        return bool(self._initialized)

    def allow_overwrite(self, mode: bool) -> None:
        """Whether ``compute_encodings`` may overwrite the current encoding."""
        if not isinstance(mode, bool):
            raise TypeError(f"mode must be a bool, got {mode!r}")
        self._allow_overwrite = mode

    @contextlib.contextmanager
    def compute_encodings(self) -> Iterator[None]:
        """Calibrate: observe the inputs of forward calls made inside the ``with`` block.

        On normal exit the observed statistics become the encoding. If the block
        raises, the encoding is left as it was.
        """
        if not self._allow_overwrite:
            yield
            return
        if self._calibrating:
            raise RuntimeError(f"{type(self).__name__}.compute_encodings() is already active")
        self._reset_statistics()
        self._calibrating = True
        try:
            yield
        finally:
            self._calibrating = False
        self._finish_calibration()

    @abc.abstractmethod
    def _reset_statistics(self) -> None: ...

    @abc.abstractmethod
    def _finish_calibration(self) -> None: ...

    def _set_initialized(self, value: bool) -> None:
        self._initialized.fill_(value)

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise ValueError/TypeError if ``state`` (this module's state-dict entries by local name; missing
        ones keep their current values) is not a valid state. Called before every ``load_state_dict``."""
        own = dict(self.named_parameters(recurse=False)) | dict(self.named_buffers(recurse=False))
        for name, value in state.items():
            if name not in own or own[name] is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name}: expected a tensor, got {type(value).__name__}")
            if tuple(value.shape) != tuple(own[name].shape):
                raise ValueError(f"{name}: expected shape {tuple(own[name].shape)}, got {tuple(value.shape)}")
            if value.dtype.is_floating_point != own[name].dtype.is_floating_point or (
                    value.dtype == torch.bool) != (own[name].dtype == torch.bool):
                raise ValueError(f"{name}: expected a {own[name].dtype} tensor, got {value.dtype}")
        merged = {name: state.get(name, t) for name, t in own.items() if t is not None}
        if bool(merged.get("_initialized", False)):
            self._check_values(merged)

    def _check_values(self, state: dict[str, torch.Tensor]) -> None:
        """Subclasses: reject invalid values of an initialised state (ValueError naming the entry)."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "_initialized"
        if key not in state_dict:
            # Checkpoints without the flag (older or foreign): initialised iff every parameter is finite.
            params = [state_dict[prefix + n] for n, _ in self.named_parameters(recurse=False)
                      if prefix + n in state_dict]
            state_dict[key] = torch.tensor(bool(params) and all(bool(torch.isfinite(p).all()) for p in params))
        local = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix) and "." not in k[len(prefix):]}
        try:
            self.check_state(local)
        except (ValueError, TypeError) as e:
            raise type(e)(f"{prefix.rstrip('.') or type(self).__name__}: invalid quantizer state: {e}") from None
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
