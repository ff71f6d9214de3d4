"""Native (C++) affine kernels: one pass over memory, built on first use.

``affine.cpp`` beside this file is compiled with the system C++ compiler the
first time a kernel is needed (never at import), cached under
``$QUANTA_CACHE_DIR`` (default ``~/.cache/quanta``) keyed by a hash of the
source, the flags and the CPU, and loaded with :mod:`ctypes`. It includes no
torch headers, so the build takes seconds and needs nothing but ``g++``.

If there is no compiler, the build fails, or ``QUANTA_NATIVE=0`` is set, the
kernels in :mod:`quanta.kernels.affine` run their eager PyTorch path instead,
with the same bits (tested). :func:`status` says which is in use and why.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from typing import Iterator

import torch

__all__ = ["library", "status", "disabled", "supports", "Call", "Bound", "float_forward", "straight_through", "QDQ",
           "Q", "DQ", "AMAX_FQ", "AMAX_Q"]

QDQ, Q, DQ, AMAX_FQ, AMAX_Q = 0, 1, 2, 4, 5
_DTYPE_CODE = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}
_SOURCE = pathlib.Path(__file__).with_name("affine.cpp")
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-fPIC", "-shared",
          "-std=c++17"]
_ABI_VERSION = 9

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_state = "not loaded yet"


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("QUANTA_CACHE_DIR")
    if root:
        return pathlib.Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "quanta"


def _cpu_signature() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor()


def _build(compiler: str) -> pathlib.Path:
    source = _SOURCE.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256(b"\0".join([source, " ".join(_FLAGS).encode(), version.encode(),
                                     _cpu_signature().encode(), platform.machine().encode()])).hexdigest()[:16]
    target = _cache_dir() / f"libquanta_affine_{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *_FLAGS, str(_SOURCE), "-o", tmp], capture_output=True, text=True,
                              timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: concurrent builders (e.g. DDP ranks) never see half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _load() -> ctypes.CDLL | None:
    global _lib, _state
    if os.environ.get("QUANTA_NATIVE", "1") == "0":
        _state = "disabled by QUANTA_NATIVE=0"
        return None
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        _state = "no C++ compiler found (install g++ or set CXX)"
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
        if lib.quanta_abi_version() != _ABI_VERSION:
            raise RuntimeError("stale library (ABI version mismatch)")
    except Exception as e:  # any failure means: use the eager path, and say why once
        _state = f"build or load failed: {e}"
        warnings.warn(f"quanta: native kernels unavailable ({_state}); using the eager PyTorch path",
                      RuntimeWarning, stacklevel=3)
        return None
    i64, dbl, vp, i32 = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p, ctypes.c_int
    lib.quanta_affine_forward.argtypes = [i32, i32, i32, vp, vp, vp, i64, i64, i64, vp, vp, dbl, dbl, i32]
    lib.quanta_affine_forward.restype = i32
    lib.quanta_affine_forward_bound.argtypes = [vp, vp, vp, vp, i32]
    lib.quanta_affine_forward_bound.restype = i32
    lib.quanta_affine_backward.argtypes = [i32, i32, i32, vp, vp, vp, i64, i64, i64, vp, vp, dbl, dbl, vp, vp, i32]
    lib.quanta_affine_backward.restype = i32
    lib.quanta_float_forward.argtypes = [i32, vp, vp, vp, i64, i64, i64, vp, i32, i32, i32, dbl, i32, i32]
    lib.quanta_float_forward.restype = i32
    lib.quanta_masked_copy.argtypes = [i32, vp, vp, vp, i64, i32]
    lib.quanta_masked_copy.restype = i32
    _state = "native"
    return lib


class _Depth(threading.local):
    depth = 0  # a class default: reading it in a thread that never set it raises and catches nothing


_disabled = _Depth()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside the block (this thread only), kernels take their eager PyTorch path.

    For comparisons and tests: both paths must give the same bits.
    """
    depth = _disabled.depth
    _disabled.depth = depth + 1
    try:
        yield
    finally:
        _disabled.depth = depth


def library() -> ctypes.CDLL | None:
    """The loaded native library, building it on first call; None if unavailable or disabled."""
    global _lib, _state
    if _disabled.depth:
        return None
    if _lib is None and _state == "not loaded yet":
        with _lock:
            if _state == "not loaded yet":
                _lib = _load()
    return _lib


def status() -> str:
    """``"native"``, or why the eager path is used (``"not loaded yet"`` before first use)."""
    return _state


def supports(dtype: torch.dtype) -> bool:
    return dtype in _DTYPE_CODE


class Call:
    """A prepared kernel call for one (dtype, compute dtype, layout, grid): only pointers vary per call."""

    __slots__ = ("dtype", "code", "wide", "psb", "qmin", "qmax")

    def __init__(self, dtype: torch.dtype, cdt: torch.dtype, psb: tuple[int, int, int], qmin: float,
                 qmax: float) -> None:
        self.dtype = dtype
        self.code = _DTYPE_CODE[dtype]
        self.wide = int(cdt == torch.float64 and dtype != torch.float64)
        self.psb = psb
        self.qmin, self.qmax = float(qmin), float(qmax)

    def forward(self, mode: int, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, *,
                want_mask: bool = False, out: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``y`` (and the bool inside-mask) for ``x``; ``scale``/``offset`` flat, contiguous, compute dtype."""
        lib = library()
        assert lib is not None
        xc, y, mask = _buffers(x, want_mask, out)
        P, S, B = self.psb
        rc = lib.quanta_affine_forward(mode, self.code, self.wide, xc.data_ptr(), y.data_ptr(),
                                       None if mask is None else mask.data_ptr(), P, S, B, scale.data_ptr(),
                                       offset.data_ptr(), self.qmin, self.qmax, torch.get_num_threads())
        return _finish(rc, y, mask, out)

    def bind(self, mode: int, scale: torch.Tensor, offset: torch.Tensor) -> Bound:
        """This call with ``mode``, ``scale`` and ``offset`` fixed (flat, contiguous, compute dtype)."""
        return Bound(self, mode, scale, offset)

    def backward(self, mode: int, grad: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                 *, want_dx: bool) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """``dx`` (or None) and float64 sums per scale entry of the scale and offset gradients."""
        lib = library()
        assert lib is not None and grad.dtype == x.dtype
        gc = grad if grad.is_contiguous() else grad.contiguous()
        xc = x if x.is_contiguous() else x.contiguous()
        dx = torch.empty_like(xc) if want_dx else None
        P, S, B = self.psb
        ds = torch.empty(S, dtype=torch.float64)
        do = torch.empty(S, dtype=torch.float64)
        rc = lib.quanta_affine_backward(mode, self.code, self.wide, gc.data_ptr(), xc.data_ptr(),
                                        None if dx is None else dx.data_ptr(), P, S, B, scale.data_ptr(),
                                        offset.data_ptr(), self.qmin, self.qmax, ds.data_ptr(), do.data_ptr(),
                                        torch.get_num_threads())
        if rc:
            raise RuntimeError(f"quanta native backward failed with code {rc}")
        return dx, ds, do


class _AffineArgs(ctypes.Structure):
    # struct AffineArgs of affine.cpp
    _fields_ = [("mode", ctypes.c_int32), ("dtype", ctypes.c_int32), ("wide", ctypes.c_int32),
                ("unused", ctypes.c_int32), ("P", ctypes.c_int64), ("S", ctypes.c_int64), ("B", ctypes.c_int64),
                ("sc", ctypes.c_void_p), ("of", ctypes.c_void_p), ("qmin", ctypes.c_double), ("qmax", ctypes.c_double)]


class Bound:
    """A :class:`Call` with its mode, scale and offset fixed: a forward passes only the data pointers.

    Same kernel and bits as ``call.forward(mode, x, scale, offset)``; it keeps ``scale`` and ``offset`` alive.
    """

    __slots__ = ("_keep", "_args", "_address")

    def __init__(self, call: Call, mode: int, scale: torch.Tensor, offset: torch.Tensor) -> None:
        P, S, B = call.psb
        self._keep = (scale, offset)
        self._args = _AffineArgs(mode, call.code, call.wide, 0, P, S, B, scale.data_ptr(), offset.data_ptr(),
                                 call.qmin, call.qmax)
        self._address = ctypes.addressof(self._args)

    def forward(self, x: torch.Tensor, *, want_mask: bool = False, out: torch.Tensor | None = None,
                lib: ctypes.CDLL | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As :meth:`Call.forward` with the bound mode, scale and offset (``lib``: :func:`library()`, if the
        caller has it at hand)."""
        lib = lib or library()
        assert lib is not None
        if out is x and not want_mask and x.is_contiguous():
            return self.forward_(x, lib), None
        xc, y, mask = _buffers(x, want_mask, out)
        rc = lib.quanta_affine_forward_bound(self._address, xc.data_ptr(), y.data_ptr(),
                                             None if mask is None else mask.data_ptr(), torch.get_num_threads())
        return _finish(rc, y, mask, out)


    def forward_(self, x: torch.Tensor, lib: ctypes.CDLL) -> torch.Tensor:
        """``x`` (contiguous) overwritten with its values: the quantizers' inference path, with :func:`library()`
        passed in."""
        ptr = x.data_ptr()
        if lib.quanta_affine_forward_bound(self._address, ptr, ptr, None, torch.get_num_threads()):
            _finish(1, x, None, None)  # raises
        return x


def _buffers(x: torch.Tensor, want_mask: bool, out: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The contiguous input, the output to write and the mask (or None) of a forward kernel call."""
    xc = x if x.is_contiguous() else x.contiguous()
    # empty_like of a contiguous tensor is contiguous, and a microsecond cheaper than torch.empty(shape, ...)
    y = out if out is not None and out.is_contiguous() else torch.empty_like(xc)
    return xc, y, torch.empty_like(xc, dtype=torch.bool) if want_mask else None


def _finish(rc: int, y: torch.Tensor, mask: torch.Tensor | None, out: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    if rc:
        raise RuntimeError(f"quanta native forward failed with code {rc}")
    if out is not None and y is not out:
        y = out.copy_(y)
    return y, mask


def float_forward(x: torch.Tensor, psb: tuple[int, int, int], scale: torch.Tensor, emin: int, emax: int,
                  mbits: int, fmax: float, no_negative_zero: bool, *, want_mask: bool = False,
                  exponent_ties_up: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Float fake quantization ``cast(x / s) * s``; ``scale`` flat and contiguous in the compute dtype.

    ``exponent_ties_up``: with 0 mantissa bits a tie goes up, not to the even exponent
    (:attr:`~quanta.grids.float.FloatFormat.exponent_ties_up`).
    """
    lib = library()
    assert lib is not None
    xc = x if x.is_contiguous() else x.contiguous()
    y = torch.empty_like(xc)
    mask = torch.empty_like(xc, dtype=torch.bool) if want_mask else None
    rc = lib.quanta_float_forward(_DTYPE_CODE[x.dtype], xc.data_ptr(), y.data_ptr(),
                                  None if mask is None else mask.data_ptr(), *psb, scale.data_ptr(), emin, emax,
                                  mbits, float(fmax), int(no_negative_zero) | (int(exponent_ties_up) << 1),
                                  torch.get_num_threads())
    if rc:
        raise RuntimeError(f"quanta native float forward failed with code {rc}")
    return y, mask


def straight_through(grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``torch.where(mask, grad, 0.0)``: the straight-through backward, in one pass where possible.

    Native for contiguous CPU float tensors with a bool mask of the same shape
    (bit-identical to ``torch.where``, zeros are +0.0); ``torch.where`` otherwise,
    and always when autograd records ``grad`` (a backward with ``create_graph=True``:
    the result must stay differentiable w.r.t. ``grad``, e.g. for gradient penalties).
    """
    lib = library()
    if (lib is None or (grad.requires_grad and torch.is_grad_enabled()) or grad.device.type != "cpu"
            or mask.dtype != torch.bool or grad.shape != mask.shape
            or grad.element_size() not in (2, 4, 8) or not grad.is_floating_point()):
        return torch.where(mask, grad, 0.0)
    g = grad if grad.is_contiguous() else grad.contiguous()
    m = mask if mask.is_contiguous() else mask.contiguous()
    out = torch.empty_like(g)
    rc = lib.quanta_masked_copy(g.element_size(), g.data_ptr(), m.data_ptr(), out.data_ptr(), g.numel(),
                                torch.get_num_threads())
    if rc:
        raise RuntimeError(f"quanta native masked copy failed with code {rc}")
    return out
