"""Build and load quanta's CPU kernels, a torch C++ extension: the integer-weight linear layers
(``csrc/int_linear.cpp``) and decode attention (``csrc/decode_attention.cpp``).

The extension is compiled with :func:`torch.utils.cpp_extension.load` the first
time a kernel is needed (never at import), into
``$QUANTA_CACHE_DIR/torch_ext/<key>`` (default ``~/.cache/quanta``), keyed by a
hash of the sources, the flags and torch's version, and reused by every later
process. It registers ``torch.ops.quanta_cpu.*``; its kernels run on torch's
intra-op thread pool (``at::parallel_for``) and link torch's own OpenMP
runtime, so no second pool competes with torch's for the cores.

If the build is impossible (no compiler, no ``ninja``) or fails, or
``QUANTA_INT_LINEAR_NATIVE=0`` is set, :func:`ops` returns None once with a
one-time ``RuntimeWarning`` saying why, and :mod:`quanta.kernels.int_linear`
runs its fallback (torch's own int8 kernel, or the reference implementation;
:mod:`quanta.kernels.decode_attention` its reference).

>>> status() in ("not loaded yet", "native") or status().startswith(("disabled", "unavailable"))
True
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import pathlib
import shutil
import threading
import warnings
from typing import Iterator

import torch

__all__ = ["ops", "status", "ready", "isa", "cpu_isa", "force_isa", "ISA_NAMES"]

_SOURCES = tuple(pathlib.Path(__file__).with_name("csrc") / name for name in ("int_linear.cpp", "decode_attention.cpp"))
_CFLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"]
_ABI_VERSION = 5
ISA_NAMES = ("portable", "avx2", "avx512", "avx512_bf16")

_lock = threading.Lock()
_ops = None
_state = "not loaded yet"


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("QUANTA_CACHE_DIR")
    if root:
        return pathlib.Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache") / "quanta"


def _openmp_ldflags() -> list[str]:
    """Link torch's own OpenMP runtime (its lib directory), never a second one."""
    lib = pathlib.Path(torch.__file__).parent / "lib"
    found = sorted(glob.glob(str(lib / "libgomp*.so*")) + glob.glob(str(lib / "libiomp*.so*")))
    if found:
        return [f"-L{lib}", f"-l:{pathlib.Path(found[0]).name}", f"-Wl,-rpath,{lib}"]
    return ["-fopenmp"]  # torch links the system's runtime: the same library, loaded once


def _build():
    from torch.utils import cpp_extension

    ldflags = _openmp_ldflags()
    key = hashlib.sha256(b"\0".join([*(src.read_bytes() for src in _SOURCES), " ".join(_CFLAGS + ldflags).encode(),
                                     torch.__version__.encode()])).hexdigest()[:16]
    build_dir = _cache_dir() / "torch_ext" / f"quanta_cpu_{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(name=f"quanta_cpu_{key}", sources=[str(src) for src in _SOURCES], extra_cflags=_CFLAGS,
                       extra_ldflags=ldflags, build_directory=str(build_dir), is_python_module=False,
                       verbose=False)
    return torch.ops.quanta_cpu


def _ninja_on_path() -> None:
    """Put the ``ninja`` Python package's binary on PATH when no ``ninja`` is (a venv used without activating it)."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    if bin_dir and os.path.isdir(bin_dir):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def _load():
    global _state
    if os.environ.get("QUANTA_INT_LINEAR_NATIVE", "1") == "0":
        _state = "disabled by QUANTA_INT_LINEAR_NATIVE=0"
        return None
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    reason = None
    if compiler is None:
        reason = "no C++ compiler found (install g++ or set CXX)"
    else:
        _ninja_on_path()
        from torch.utils import cpp_extension

        if not cpp_extension.is_ninja_available():
            reason = "ninja is not installed (pip install ninja)"
    if reason is None:
        try:
            lib = _build()
            if int(lib.abi_version()) != _ABI_VERSION:
                raise RuntimeError("stale extension (ABI version mismatch)")
            _register_fakes()
            _state = "native"
            return lib
        except Exception as e:  # any failure means: the fallback kernels, said once
            reason = f"build or load failed: {str(e).strip()[-1500:]}"
    _state = f"unavailable: {reason}"
    warnings.warn(f"quanta: native integer-linear kernels {_state}; using torch's kernels and the reference "
                  "implementation instead (slower)", RuntimeWarning, stacklevel=3)
    return None


def _register_fakes() -> None:
    """Shape-only implementations of the kernels, so that ``torch.compile`` and ``torch.export`` trace them as
    opaque ops of the graph (without them, each call is a graph break)."""
    from torch.library import register_fake

    def rows_by_n(x, w):  # [M, K] x [N, ...] -> [M, N] in x's dtype
        return x.new_empty((x.shape[0], w.shape[0]))

    register_fake("quanta_cpu::int8_weight_only_linear")(lambda x, w, scale, bias: rows_by_n(x, w))
    register_fake("quanta_cpu::int4_weight_only_linear")(
        lambda x, packed, scale_and_zero, group_size, K, N, bias: x.new_empty((x.shape[0], N)))
    register_fake("quanta_cpu::int4_weight_only_linear_multi")(
        lambda x, packed, scale_and_zero, group_size, K, N, bias: x.new_empty((x.shape[0], sum(N))))
    register_fake("quanta_cpu::int8_dynamic_linear")(
        lambda qx, zx, sx, w, sw, colsum, bias, out_dtype: qx.new_empty((qx.shape[0], w.shape[0]), dtype=out_dtype))
    register_fake("quanta_cpu::decode_attention")(
        lambda q, k, v, scale, mask: q.new_empty((q.shape[0], 1, q.shape[1], q.shape[3])))
    register_fake("quanta_cpu::decode_attention_int8")(
        lambda q, kc, ks, vc, vs, scale, mask: q.new_empty((q.shape[0], 1, q.shape[1], q.shape[3])))


class _Depth(threading.local):
    depth = 0


_disabled = _Depth()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Inside the block (this thread only), :func:`ops` returns None: the fallback path runs."""
    _disabled.depth += 1
    try:
        yield
    finally:
        _disabled.depth -= 1


def ops():
    """``torch.ops.quanta_cpu`` (building the extension on first call), or None if unavailable or disabled."""
    global _ops
    if _disabled.depth:
        return None
    if _ops is None and _state == "not loaded yet":
        with _lock:
            if _state == "not loaded yet":
                _ops = _load()
    return _ops


def status() -> str:
    """``"native"``, ``"not loaded yet"``, or why the extension is not used."""
    return _state


def ready(load: bool = False) -> bool:
    """Whether the native kernels are loaded; with ``load``, a first attempt to load them is made now if none was.

    Callers tracing a graph (``torch.compile``) pass ``load=True``: a graph traced before any eager call would
    otherwise hold the Python ops, which check their arguments at every call, for as long as it is used.
    """
    if load and _state == "not loaded yet":
        ops()
    return _state == "native"


def cpu_isa() -> str:
    """The best instruction set this CPU gives the kernels: one of :data:`ISA_NAMES` (``"avx512_bf16"`` best)."""
    lib = ops()
    return "none" if lib is None else ISA_NAMES[int(lib.cpu_isa())]


def isa() -> str:
    """The instruction set the kernels use now (the CPU's best, unless :func:`force_isa` lowered it)."""
    lib = ops()
    return "none" if lib is None else ISA_NAMES[int(lib.current_isa())]


@contextlib.contextmanager
def force_isa(name: str) -> Iterator[None]:
    """Run the kernels on ``name`` (one of :data:`ISA_NAMES`) or lower inside the block.

    Process-wide (the kernels' dispatch switch), for tests and benchmarks:
    ``"portable"``, ``"avx2"`` and ``"avx512"`` give the same bits;
    ``"avx512_bf16"`` runs its own order on bfloat16 activations (see
    :mod:`quanta.kernels.int_linear`).
    """
    if name not in ISA_NAMES:
        raise ValueError(f"force_isa: name must be one of {ISA_NAMES}, got {name!r}")
    lib = ops()
    if lib is None:
        raise RuntimeError(f"force_isa: the native kernels are {status()}")
    lib.set_isa_limit(ISA_NAMES.index(name))
    try:
        yield
    finally:
        lib.set_isa_limit(len(ISA_NAMES) - 1)
