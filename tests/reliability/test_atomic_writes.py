"""Atomic writes: a writer that fails part-way leaves the previous file byte-identical and no temporary files.

Writers: :func:`quanta.export.encodings.write_encodings`, ``sim.save_encodings`` (quanta's
format and AIMET 0.6.1 / 1.0.0 / 2.0.0), ``sim.export`` (ONNX + encodings) and
:func:`quanta.dtypes.save_quantized`. Failures are injected where a real one could
happen: while serialising (``json.dumps``, ``safetensors.torch.save_file``,
``onnx.save_model`` raising at once), after part of the file is on disk (a write
that stores half its data and then fails with ENOSPC), at ``fsync``, at the final
``os.replace``, and as a ``KeyboardInterrupt`` in the middle of the write.
Every writer goes through :func:`quanta._files.atomic_write`; the tests call the
public writers so that a writer that stopped using it would fail here.

Findings: A1, every written file came out mode 0o600 (``tempfile.mkstemp``'s) and an
overwrite reset the file's mode: fixed in ``quanta/_files.py`` (the temporary file is
created 0o666 less the umask, or takes the existing file's mode; it is also fsync'ed
before the rename). A2, ``sim.export`` writes ``<prefix>.onnx`` (replacing the old one)
before ``<prefix>.encodings``, so a failure in the second write leaves a new graph beside
the old encodings: fixed (both files are renamed into place together), tested below.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import stat
import warnings

import pytest
import torch
from torch import nn

import quanta._files
import quanta.export.encodings as encodings_module
import quanta.quantsim.encodings_io as encodings_io_module
from quanta.encodings.affine import AffineEncoding
from quanta.export.encodings import read_encodings, write_encodings
from quanta.quantsim import QuantizationSimModel


class Injected(OSError):
    """The failure the tests inject (an OSError, like a full disk)."""


def _boom(*args, **kwargs):
    raise Injected(errno.EIO, "injected failure")


def _listing(directory) -> list[str]:
    return sorted(os.listdir(directory))


def _no_temporaries(directory, expected: list[str]) -> None:
    names = _listing(directory)
    assert names == sorted(expected), f"left behind: {sorted(set(names) - set(expected))}"


class _HalfWritten:
    """A text/binary file whose ``write`` stores half the data, flushes it to the file, then fails (ENOSPC)."""

    written: list[str] = []

    def __init__(self, path, mode="r", *args, **kwargs):
        self.path = os.fspath(path)
        self.f = builtins.open(path, mode, *args, **kwargs)

    def write(self, data):
        self.f.write(data[: max(1, len(data) // 2)])
        self.f.flush()
        assert os.path.getsize(self.path) > 0  # part of the new content really is on disk
        _HalfWritten.written.append(self.path)
        raise Injected(errno.ENOSPC, "No space left on device (injected)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()
        return False


def _half_open(monkeypatch, module) -> None:
    """Make the module's ``open`` (the built-in, looked up as a global) return :class:`_HalfWritten` files."""
    _HalfWritten.written = []
    monkeypatch.setattr(module, "open", _HalfWritten, raising=False)


def _interrupt_after_partial_write(monkeypatch, module) -> None:
    class Interrupted(_HalfWritten):
        def write(self, data):
            self.f.write(data[: max(1, len(data) // 2)])
            self.f.flush()
            raise KeyboardInterrupt

    monkeypatch.setattr(module, "open", Interrupted, raising=False)


def _fail_fsync(monkeypatch) -> None:
    monkeypatch.setattr(quanta._files.os, "fsync", _boom)


def _fail_replace(monkeypatch) -> None:
    monkeypatch.setattr(quanta._files.os, "replace", _boom)


# ============================================================================ write_encodings
def _encodings(seed: int) -> dict[str, AffineEncoding]:
    g = torch.Generator().manual_seed(seed)
    return {"fc.output.0": AffineEncoding(torch.rand((), generator=g) + 0.01, torch.tensor(-3.0), 8),
            "fc.weight": AffineEncoding((torch.rand(4, 1, generator=g) + 0.01), torch.zeros(4, 1), 8, signed=True)}


JSON_INJECTIONS = ["json_dumps", "partial_write", "interrupt", "fsync", "replace"]


def _inject_json(monkeypatch, how: str, module) -> type[BaseException]:
    if how == "json_dumps":
        monkeypatch.setattr(json, "dumps", _boom)
    elif how == "partial_write":
        _half_open(monkeypatch, module)
    elif how == "interrupt":
        _interrupt_after_partial_write(monkeypatch, module)
        return KeyboardInterrupt
    elif how == "fsync":
        _fail_fsync(monkeypatch)
    else:
        _fail_replace(monkeypatch)
    return Injected


@pytest.mark.parametrize("how", JSON_INJECTIONS)
@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
def test_write_encodings_failure_keeps_previous_file(tmp_path, monkeypatch, version, how):
    path = tmp_path / "model.encodings"
    first = _encodings(0)
    write_encodings(path, {"fc.output.0": first["fc.output.0"]}, {"fc.weight": first["fc.weight"]}, version)
    before = path.read_bytes()
    second = _encodings(1)
    error = _inject_json(monkeypatch, how, encodings_module)
    with pytest.raises(error):
        write_encodings(path, {"fc.output.0": second["fc.output.0"]}, {"fc.weight": second["fc.weight"]}, version)
    monkeypatch.undo()
    assert path.read_bytes() == before
    _no_temporaries(tmp_path, ["model.encodings"])
    assert read_encodings(path).version.value == version
    if how == "partial_write":
        assert _HalfWritten.written and not os.path.exists(_HalfWritten.written[0])  # the half file was removed


def test_write_encodings_without_previous_file_leaves_nothing(tmp_path, monkeypatch):
    _half_open(monkeypatch, encodings_module)
    enc = _encodings(0)
    with pytest.raises(Injected):
        write_encodings(tmp_path / "model.encodings", enc, {}, "1.0.0")
    _no_temporaries(tmp_path, [])


# ============================================================================ sim.save_encodings
def _sim(seed: int) -> tuple[QuantizationSimModel, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)).eval()
    x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, x)
        sim.compute_encodings(lambda m: m(x), progress=False)
    return sim, x


@pytest.fixture(scope="module")
def sims():
    return _sim(1), _sim(2)  # the same model calibrated on different data: different encodings


@pytest.mark.parametrize("how", JSON_INJECTIONS)
@pytest.mark.parametrize("version", [None, "0.6.1", "1.0.0", "2.0.0"], ids=lambda v: v or "quanta")
def test_save_encodings_failure_keeps_previous_file(tmp_path, monkeypatch, sims, version, how):
    (old, _), (new, _) = sims
    path = tmp_path / "sim.encodings"
    old.save_encodings(path, version=version)
    before = path.read_bytes()
    module = encodings_io_module if version is None else encodings_module
    error = _inject_json(monkeypatch, how, module)
    with pytest.raises(error):
        new.save_encodings(path, version=version)
    monkeypatch.undo()
    assert path.read_bytes() == before
    _no_temporaries(tmp_path, ["sim.encodings"])
    new.save_encodings(path, version=version)  # and without the failure it does change
    assert path.read_bytes() != before


# ============================================================================ sim.export
def _onnx_injection(monkeypatch, how: str) -> None:
    onnx = pytest.importorskip("onnx")
    real = onnx.save_model

    if how == "onnx_save":
        monkeypatch.setattr(onnx, "save_model", _boom)
    elif how == "onnx_partial":
        def half(proto, f, *args, **kwargs):
            real(proto, f, *args, **kwargs)
            size = os.path.getsize(f)
            with open(f, "r+b") as fh:
                fh.truncate(size // 2)
            raise Injected(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(onnx, "save_model", half)
    elif how == "replace":
        _fail_replace(monkeypatch)
    elif how == "encodings_json":  # the ONNX file is written, the encodings file fails
        monkeypatch.setattr(json, "dumps", _boom)


def _export(sim, x, directory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sim.export(directory, "model", x)


@pytest.mark.parametrize("how", ["onnx_save", "onnx_partial", "replace"])
def test_export_failure_keeps_previous_files(tmp_path, monkeypatch, sims, how):
    pytest.importorskip("onnx")
    (old, x), (new, _) = sims
    _export(old, x, tmp_path)
    files = ["model.encodings", "model.onnx", "model_torch.encodings"]
    before = {f: (tmp_path / f).read_bytes() for f in files}
    _onnx_injection(monkeypatch, how)
    with pytest.raises(Injected):
        _export(new, x, tmp_path)
    monkeypatch.undo()
    assert {f: (tmp_path / f).read_bytes() for f in files} == before
    _no_temporaries(tmp_path, files)


def test_export_failure_in_the_encodings_keeps_the_previous_pair(tmp_path, monkeypatch, sims):
    pytest.importorskip("onnx")
    (old, x), (new, _) = sims
    _export(old, x, tmp_path)
    files = ["model.encodings", "model.onnx", "model_torch.encodings"]
    before = {f: (tmp_path / f).read_bytes() for f in files}
    _onnx_injection(monkeypatch, "encodings_json")
    with pytest.raises(Injected):
        _export(new, x, tmp_path)
    monkeypatch.undo()
    _no_temporaries(tmp_path, files)
    assert {f: (tmp_path / f).read_bytes() for f in files} == before


# ============================================================================ save_quantized
@pytest.mark.parametrize("how", ["save_file", "partial", "interrupt", "fsync", "replace"])
def test_save_quantized_failure_keeps_previous_file(tmp_path, monkeypatch, how):
    st = pytest.importorskip("safetensors.torch")
    from quantized_models import quantized_model

    from quanta.dtypes import load_quantized, save_quantized

    path = tmp_path / "model.safetensors"
    save_quantized(quantized_model("int8_wo").state_dict(), path)
    before = path.read_bytes()
    real = st.save_file
    if how == "save_file":
        monkeypatch.setattr(st, "save_file", _boom)
    elif how in ("partial", "interrupt"):
        def half(tensors, filename, metadata=None):
            real(tensors, filename, metadata=metadata)
            size = os.path.getsize(filename)
            with open(filename, "r+b") as fh:
                fh.truncate(size // 2)
            if how == "interrupt":
                raise KeyboardInterrupt
            raise Injected(errno.ENOSPC, "No space left on device (injected)")

        monkeypatch.setattr(st, "save_file", half)
    elif how == "fsync":
        _fail_fsync(monkeypatch)
    else:
        _fail_replace(monkeypatch)
    with pytest.raises(KeyboardInterrupt if how == "interrupt" else Injected):
        save_quantized(quantized_model("int4_cpu_g32").state_dict(), path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    _no_temporaries(tmp_path, ["model.safetensors"])
    assert set(load_quantized(path)) == set(quantized_model("int8_wo").state_dict())


# ============================================================================ what a successful write looks like
def test_written_files_get_ordinary_permissions(tmp_path, sims):
    """FINDING A1: files came out 0o600 whatever the umask (tempfile.mkstemp's mode, passed on by the rename),
    and an overwrite reset an existing file's mode; now 0o666 less the umask, or the existing file's mode."""
    (sim, _), _ = sims
    umask = os.umask(0o022)
    try:
        path = tmp_path / "sim.encodings"
        sim.save_encodings(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
        os.chmod(path, 0o640)
        sim.save_encodings(path, version="1.0.0")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    finally:
        os.umask(umask)


def test_data_is_flushed_before_the_rename(tmp_path, monkeypatch):
    """The temporary file is fsync'ed before os.replace, so a crash cannot leave a short file under the name."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(quanta._files.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(quanta._files.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    write_encodings(tmp_path / "e.json", _encodings(0), {}, "1.0.0")
    assert events[:2] == ["fsync", "replace"]
