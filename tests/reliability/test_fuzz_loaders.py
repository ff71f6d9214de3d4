"""Fuzzed loaders: every file quanta reads either loads a valid object or raises its documented error.

Loaders under test, each fed (a) structurally mutated valid documents (keys dropped,
duplicated, renamed or retyped; numbers replaced by NaN/inf/huge/negative values,
strings or nested lists; lists truncated or extended; versions, dtypes and
``enc_type`` swapped for other words of the formats' vocabulary; siblings swapped),
(b) byte-level mutations of valid files (flips, inserts, deletes, truncation) and
(c) random bytes:

* :func:`quanta.export.encodings.read_encodings`: AIMET 0.6.1 / 1.0.0 / 2.0.0 documents;
* :meth:`QuantizationSimModel.load_encodings`: quanta's own format and the AIMET formats,
  applied to small sims (integer per tensor/channel, 4-bit per block, float8, float16);
* :func:`quanta.dtypes.load_quantized`: safetensors files written by ``save_quantized``;
* ``torch.load(..., weights_only=True)`` of a sim's ``state_dict`` / ``quantizer_state_dict``
  file, then ``load_quantizer_state_dict`` / ``load_state_dict``.

The contract checked on every example:

* the only exceptions are ``ValueError`` (malformed content; ``json``'s and
  ``UnicodeDecodeError`` are ValueErrors), ``FileNotFoundError`` and ``TypeError``
  (a wrong kind of argument) — never KeyError, IndexError, AttributeError,
  RuntimeError, OverflowError, MemoryError or RecursionError;
* each call returns within :data:`TIME_LIMIT` seconds;
* a rejected file changes nothing: the sim's quantizer state is bit-identical
  before and after;
* an accepted file gives a usable object (finite positive scales, a forward pass
  that runs; quantized tensors that dequantize);
* nothing in a file is executed (a pickle that would create a marker file, given to
  every loader, creates nothing) and a header claiming a 10^12-element tensor is
  rejected at once without allocating it.

``torch.load`` is PyTorch's own reader: on a corrupt archive it raises whatever
its zip and unpickling layers raise (RuntimeError, ``pickle.UnpicklingError``,
OSError, KeyError, ...). quanta cannot change that; for it the test checks only
time, no code execution, no memory blow-up, and quanta's part (what the loaded
dict does to a sim). What the fuzzers found is listed in FINDINGS at the end.
"""

from __future__ import annotations

import copy
import io
import json
import math
import os
import pickle
import resource
import shutil
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from torch import nn

from quantized_models import CONFIGS, make_model
from quantsim_models import W4_BLOCK_CONFIG

from quanta.dtypes import AffineQuantizedTensor, LinearActivationQuantizedTensor, load_quantized, save_quantized
from quanta.export.encodings import EncodingsFile, read_encodings
from quanta.export.sim_encodings import export_encodings
from quanta.quantization import quantize_
from quanta.quantsim import QuantizationSimModel

safetensors_torch = pytest.importorskip("safetensors.torch")

#: seconds one loader call may take (the real calls take milliseconds)
TIME_LIMIT = 5.0
#: what a loader may raise for bad content or a bad argument
LOADER_ERRORS = (ValueError, FileNotFoundError, TypeError)

# the fuzz tests share module-level sims and files: hypothesis's function-scoped-fixture check does not apply
FUZZ = settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


# ============================================================================ subjects


def _conv_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)).eval()
    return model, torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))


def _mlp_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    return model, torch.randn(3, 16, generator=torch.Generator().manual_seed(1))


# name -> (model factory, QuantizationSimModel kwargs, AIMET versions the sim can be written in)
SIM_RECIPES: dict[str, tuple[Callable[[], tuple[nn.Module, torch.Tensor]], dict[str, Any], tuple[str, ...]]] = {
    "int8": (_conv_model, {}, ("0.6.1", "1.0.0", "2.0.0")),
    "w4_block": (_mlp_model, {"config_file": W4_BLOCK_CONFIG, "default_output_bw": 16}, ("1.0.0", "2.0.0")),
    "float8": (_mlp_model, {"default_data_type": float, "default_output_bw": 8, "default_param_bw": 8}, ("2.0.0",)),
    "float16": (_mlp_model, {"default_data_type": float, "default_output_bw": 16, "default_param_bw": 16},
                ("0.6.1", "1.0.0")),
}


class Subject:
    """A calibrated sim, its input, and its valid encodings documents (quanta's format and AIMET's)."""

    def __init__(self, key: str) -> None:
        factory, kwargs, versions = SIM_RECIPES[key]
        model, self.x = factory()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.sim = QuantizationSimModel(model, self.x, **kwargs)
            self.sim.compute_encodings(lambda m: m(self.x), progress=False)
        self.state = _state(self.sim)
        self.docs: dict[str, dict[str, Any]] = {}
        for version in (None, *versions):
            path = _scratch(f"{key}-{version}.json")
            self.sim.save_encodings(path, version=version)  # 0.6.1, 1.0.0: AIMET's module-keyed layout
            with open(path, encoding="utf-8") as f:
                self.docs[version or "quanta"] = json.load(f)
            if version in ("0.6.1", "1.0.0"):  # and the tensor-keyed one (<prefix>.encodings)
                export_encodings(self.sim, path, version)
                with open(path, encoding="utf-8") as f:
                    self.docs[f"{version}-tensor"] = json.load(f)
            os.unlink(path)

    def restore(self) -> None:
        """Put the calibrated state back (after a fuzzed file was accepted)."""
        self.sim.load_quantizer_state_dict({k: v.clone() for k, v in self.state.items()})
        assert _same_state(self.state, _state(self.sim))


_SCRATCH: list[str] = []


def _scratch(name: str) -> str:
    """A path in this module's scratch directory (the fuzz loops rewrite a few files many times)."""
    if not _SCRATCH:
        _SCRATCH.append(tempfile.mkdtemp(prefix="quanta-fuzz-"))
    return os.path.join(_SCRATCH[0], name)


@pytest.fixture(scope="module", autouse=True)
def _remove_scratch():
    yield
    if _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


def _state(sim: QuantizationSimModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in sim.quantizer_state_dict().items()}


def _same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a)


_SUBJECTS: dict[str, Subject] = {}


def subject(key: str) -> Subject:
    if key not in _SUBJECTS:
        _SUBJECTS[key] = Subject(key)
    return _SUBJECTS[key]


#: (sim key, document key) of every valid encodings document
DOC_KEYS = [(k, v) for k, (_, _, versions) in SIM_RECIPES.items() for v in ("quanta", *versions)]
AIMET_DOC_KEYS = [(k, v) for k, v in DOC_KEYS if v != "quanta"]


# ============================================================================ the contract
def _timed(fn: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    t0 = time.perf_counter()
    try:
        result, error = fn(), None
    except BaseException as e:  # noqa: BLE001 - classified by the caller
        result, error = None, e
    elapsed = time.perf_counter() - t0
    assert elapsed < TIME_LIMIT, f"loader took {elapsed:.1f} s (limit {TIME_LIMIT} s)"
    return result, error


def _check_error(error: BaseException | None, allowed: tuple[type[BaseException], ...] = LOADER_ERRORS) -> None:
    if currently_in_test_context():  # outcome counts for --hypothesis-show-statistics
        event(f"outcome: {type(error).__name__ if error is not None else 'accepted'}")
    if error is not None and not isinstance(error, allowed):
        raise AssertionError(f"leaked {type(error).__name__}: {error}") from error


def _allowed_for(source: Any) -> tuple[type[BaseException], ...]:
    """A mapping or an existing path is the right kind of argument: anything wrong with it is a ValueError
    (a TypeError there would be an internal one leaking, e.g. "unhashable type: 'list'")."""
    if isinstance(source, Mapping):
        return (ValueError,)
    if isinstance(source, (str, os.PathLike)):
        return (ValueError, FileNotFoundError)
    return LOADER_ERRORS


def _check_encodings_file(doc: EncodingsFile) -> None:
    assert isinstance(doc, EncodingsFile)
    for name, fe in doc.encodings.items():
        assert isinstance(name, str) and name
        if fe.scale is not None:
            assert fe.scale.dtype == torch.float32 and fe.scale.numel() >= 1
            assert bool(torch.isfinite(fe.scale).all()) and bool((fe.scale > 0).all()), name
        if fe.offset is not None:
            assert fe.offset.dtype == torch.int64 and fe.offset.numel() == fe.scale.numel()


def _check_sim_usable(s: Subject) -> None:
    """After an accepted file: every initialised quantizer has a finite positive scale and the sim runs."""
    for name, q in s.sim.named_quantizers():
        if not q.is_initialized():
            continue
        enc = q.get_encodings()
        assert bool(torch.isfinite(enc.scale).all()) and bool((enc.scale > 0).all()), name
        offset = getattr(enc, "offset", None)
        if offset is not None:
            assert bool(torch.isfinite(offset).all()), name
    with torch.no_grad():
        y = s.sim.model(s.x)
    assert not bool(torch.isnan(y).any())


def _load_into_sim(s: Subject, source: Any, strict: bool = False) -> None:
    """load_encodings on ``s.sim``: a rejection leaves the state bit-identical, an acceptance is usable."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, error = _timed(lambda: s.sim.load_encodings(source, strict=strict))
    _check_error(error, _allowed_for(source))
    try:
        if error is not None:
            assert _same_state(s.state, _state(s.sim)), f"rejected file ({error}) changed the sim"
        else:
            _check_sim_usable(s)
    finally:
        if error is None:
            s.restore()


# ============================================================================ mutations
ODD_VALUES: list[Any] = [
    math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-45, -1, 0, -0.0, 1.5, 2**31, 2**63, 2**64 + 1, 10**30,
    -(10**30), "", "x", "1.0", "NaN", None, True, False, [], {}, [[1.0]], [[[]]], [1, [2]], ["a"], {"a": 1},
    [math.nan], [1e-50], [[0.5, 0.25], [0.5]],
]
VOCABULARY = [
    "0.6.1", "1.0.0", "2.0.0", "1", "int", "float", "INT", "FLOAT", "PER_TENSOR", "PER_CHANNEL", "PER_BLOCK", "LPBQ",
    "int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32", "float16", "bfloat16",
    "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "float4e2m1", "affine", "ieee", "fn", "fnuz",
    "mx", "True", "False", "quanta.quantsim.encodings", "name", "scale", "offset", "shape", "block_size",
    "0.weight", "3.weight", "1.output.0", "0.param_quantizers.weight", "2.output_quantizers.0",
]
NEW_KEYS = ["scale", "offset", "shape", "qmin", "qmax", "block_size", "bw", "bitwidth", "is_sym", "axis", "y_scale",
            "y_zero_point", "enc_type", "dtype", "output_dtype", "name", "type", "special", "exponent_bits",
            "per_block_int_scale", "extra", "format", "version", "encodings", "quantizers", "param_encodings"]


def _paths(node: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, path + (i,))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def _odd(data: st.DataObject) -> Any:
    """An odd value, copied (later mutations must not change :data:`ODD_VALUES` itself)."""
    return copy.deepcopy(data.draw(st.sampled_from(ODD_VALUES), label="odd"))


def _perturb(data: st.DataObject, value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _odd(data)
    how = data.draw(st.sampled_from(["neg", "double", "half", "plus1", "minus1", "huge", "tiny", "float", "str"]))
    return {"neg": lambda v: -v, "double": lambda v: v * 2, "half": lambda v: v / 2, "plus1": lambda v: v + 1,
            "minus1": lambda v: v - 1, "huge": lambda v: v * 1e200 if isinstance(v, float) else v * 10**40,
            "tiny": lambda v: v * 1e-300, "float": lambda v: float(v) + 0.5, "str": lambda v: str(v)}[how](value)


def mutate_document(data: st.DataObject, doc: Any, max_mutations: int = 3) -> Any:
    """1 to ``max_mutations`` structural mutations of a JSON document (a deep copy is mutated)."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, max_mutations), label="mutations")):
        paths = _paths(doc)
        path = paths[data.draw(st.integers(0, len(paths) - 1), label="where")]
        node = _get(doc, path)
        op = data.draw(st.sampled_from(["odd", "vocab", "perturb", "drop", "duplicate", "rename", "truncate", "extend",
                                        "swap", "nest"]), label="op")
        if op == "odd":
            doc = _set(doc, path, _odd(data))
        elif op == "vocab":
            doc = _set(doc, path, data.draw(st.sampled_from(VOCABULARY)))
        elif op == "perturb":
            doc = _set(doc, path, _perturb(data, node))
        elif op == "nest":
            doc = _set(doc, path, [copy.deepcopy(node)])
        elif op == "drop" and path:
            parent = _get(doc, path[:-1])
            del parent[path[-1]]
        elif op == "duplicate" and isinstance(node, dict):
            if node:
                src = data.draw(st.sampled_from(sorted(node, key=str)))
                node[data.draw(st.sampled_from([*NEW_KEYS, *VOCABULARY]))] = copy.deepcopy(node[src])
            else:
                node[data.draw(st.sampled_from(NEW_KEYS))] = _odd(data)
        elif op == "duplicate" and isinstance(node, list) and node:
            source = copy.deepcopy(node[data.draw(st.integers(0, len(node) - 1))])
            node.insert(data.draw(st.integers(0, len(node))), source)
        elif op == "rename" and isinstance(node, dict) and node:
            src = data.draw(st.sampled_from(sorted(node, key=str)))
            node[data.draw(st.sampled_from([*NEW_KEYS, *VOCABULARY]))] = node.pop(src)
        elif op == "truncate" and isinstance(node, list):
            del node[data.draw(st.integers(0, len(node))):]
        elif op == "extend" and isinstance(node, list):
            node.extend(copy.deepcopy(node[: data.draw(st.integers(1, 3))]) or [_odd(data)])
        elif op == "swap" and isinstance(node, dict) and len(node) >= 2:
            a, b = data.draw(st.lists(st.sampled_from(sorted(node, key=str)), min_size=2, max_size=2, unique=True))
            node[a], node[b] = node[b], node[a]
        elif op == "swap" and isinstance(node, list) and len(node) >= 2:
            i, j = data.draw(st.lists(st.integers(0, len(node) - 1), min_size=2, max_size=2, unique=True))
            node[i], node[j] = node[j], node[i]
        else:  # the op does not apply to this node: replace it by an odd value instead
            doc = _set(doc, path, _odd(data))
    return doc


def mutate_bytes(data: st.DataObject, raw: bytes, max_mutations: int = 4) -> bytes:
    """1 to ``max_mutations`` byte-level mutations: bit flips, inserts, deletes, overwrites, truncation."""
    b = bytearray(raw)
    for _ in range(data.draw(st.integers(1, max_mutations), label="byte mutations")):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "overwrite", "truncate"]), label="byte op")
        i = data.draw(st.integers(0, max(len(b) - 1, 0)), label="at")
        if op == "flip" and b:
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del b[i:i + data.draw(st.integers(1, 16))]
        elif op == "overwrite":
            chunk = data.draw(st.binary(min_size=1, max_size=8))
            b[i:i + len(chunk)] = chunk
        else:
            del b[i:]
    return bytes(b)


#: random bytes, including shapes that stress parsers (deep nesting, huge length prefixes, magic numbers)
RANDOM_BYTES = st.one_of(
    st.binary(max_size=512),
    st.builds(lambda n, c: c * n, st.integers(500, 100_000), st.sampled_from([b"[", b"{\"a\":", b"[{\"x\":"])),
    st.builds(lambda n, rest: struct.pack("<Q", n) + rest, st.integers(0, 2**64 - 1), st.binary(max_size=64)),
    st.builds(lambda rest: b"PK\x03\x04" + rest, st.binary(max_size=256)),
    st.builds(lambda rest: b"\x80\x02" + rest, st.binary(max_size=64)),
    st.builds(lambda rest: b'{"version": "1.0.0", ' + rest, st.binary(max_size=64)),
)


def _write(name: str, raw: bytes) -> str:
    path = _scratch(name)
    with open(path, "wb") as f:
        f.write(raw)
    return path


# ============================================================================ (a) structural: encodings
@FUZZ
@given(data=st.data(), which=st.sampled_from(AIMET_DOC_KEYS))
def test_read_encodings_structural_mutations(data, which):
    doc = mutate_document(data, subject(which[0]).docs[which[1]])
    result, error = _timed(lambda: read_encodings(doc))
    _check_error(error, _allowed_for(doc))
    if error is None:
        _check_encodings_file(result)


@FUZZ
@given(data=st.data(), which=st.sampled_from(DOC_KEYS), via_file=st.booleans(), strict=st.booleans())
def test_load_encodings_structural_mutations(data, which, via_file, strict):
    s = subject(which[0])
    doc = mutate_document(data, s.docs[which[1]])
    source: Any = doc
    if via_file:  # through json: NaN/Infinity literals and all
        source = _write("structural.json", json.dumps(doc).encode())
    _load_into_sim(s, source, strict)


@pytest.mark.parametrize("which", DOC_KEYS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_every_valid_document_loads(which):
    """The fuzzers start from documents that really load (else every mutation would be 'rejected')."""
    s = subject(which[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.sim.load_encodings(s.docs[which[1]], partial=False)
    loaded = s.sim.get_encodings()
    s.restore()
    calibrated = s.sim.get_encodings()
    assert loaded.keys() == calibrated.keys()
    assert all(loaded[k] == calibrated[k] for k in loaded)  # the encodings, bit for bit (not the raw ranges)
    s.sim.load_encodings(s.docs[which[1]], partial=False)
    _check_sim_usable(s)
    if which[1] != "quanta":
        _check_encodings_file(read_encodings(s.docs[which[1]]))
    s.restore()


# ============================================================================ (b, c) bytes: encodings
@FUZZ
@given(data=st.data(), which=st.sampled_from(DOC_KEYS))
def test_encodings_files_byte_mutations(data, which):
    s = subject(which[0])
    raw = json.dumps(s.docs[which[1]], indent=1).encode()
    path = _write("bytes.json", mutate_bytes(data, raw))
    if which[1] != "quanta":
        result, error = _timed(lambda: read_encodings(path))
        _check_error(error, _allowed_for(path))
        if error is None:
            _check_encodings_file(result)
    _load_into_sim(s, path)


@FUZZ
@given(raw=RANDOM_BYTES, key=st.sampled_from(list(SIM_RECIPES)))
def test_encodings_loaders_random_bytes(raw, key):
    path = _write("random.json", raw)
    result, error = _timed(lambda: read_encodings(path))
    _check_error(error, _allowed_for(path))
    if error is None:
        _check_encodings_file(result)
    _load_into_sim(subject(key), path)


# ============================================================================ safetensors (load_quantized)
QUANTIZED_CONFIGS = ["int8_wo", "int4_cpu_g32", "int4_uintx_g32", "int8_dyn_asym", "float8", "fp6", "intx_uint3_g16"]
_FILES: dict[str, bytes] = {}


def quantized_file(name: str) -> bytes:
    """The bytes of a ``save_quantized`` file of a ``quantize_``d two-layer MLP."""
    if name not in _FILES:
        m = make_model(seed=0)
        quantize_(m, CONFIGS[name]())
        path = _scratch(f"{name}.safetensors")
        save_quantized(m.state_dict(), path)
        with open(path, "rb") as f:
            _FILES[name] = f.read()
        os.unlink(path)
    return _FILES[name]


def _split_safetensors(raw: bytes) -> tuple[dict[str, Any], bytes]:
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join_safetensors(header: Any, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def _check_state_dict(sd: Any) -> None:
    assert isinstance(sd, dict)
    for key, t in sd.items():
        assert isinstance(key, str) and isinstance(t, torch.Tensor)
        if isinstance(t, (AffineQuantizedTensor, LinearActivationQuantizedTensor)):
            w = t.original_weight_tensor if isinstance(t, LinearActivationQuantizedTensor) else t
            dq = w.dequantize()  # a described tensor that loaded must read in bounds
            assert tuple(dq.shape) == tuple(w.shape)


def _load_quantized_checked(path: str) -> None:
    result, error = _timed(lambda: load_quantized(path))
    _check_error(error, _allowed_for(path))
    if error is None:
        _, error = _timed(lambda: _check_state_dict(result))
        if error is not None:
            raise AssertionError(f"a loaded file gave an unusable tensor: {type(error).__name__}: {error}") from error


@FUZZ
@given(data=st.data(), name=st.sampled_from(QUANTIZED_CONFIGS), target=st.sampled_from(["quanta", "header"]))
def test_load_quantized_structural_mutations(data, name, target):
    """Mutations of the JSON quantization map (``target="quanta"``) or of the safetensors header itself."""
    header, body = _split_safetensors(quantized_file(name))
    if target == "quanta":
        meta = dict(header["__metadata__"])
        meta["quanta"] = json.dumps(mutate_document(data, json.loads(meta["quanta"])))
        header = {**header, "__metadata__": meta}
    else:
        header = mutate_document(data, header)
    _load_quantized_checked(_write("structural.safetensors", _join_safetensors(header, body)))


@FUZZ
@given(data=st.data(), name=st.sampled_from(QUANTIZED_CONFIGS))
def test_load_quantized_byte_mutations(data, name):
    _load_quantized_checked(_write("bytes.safetensors", mutate_bytes(data, quantized_file(name))))


@FUZZ
@given(raw=RANDOM_BYTES)
def test_load_quantized_random_bytes(raw):
    _load_quantized_checked(_write("random.safetensors", raw))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


@pytest.mark.parametrize("claim", ["safetensors_header", "quanta_shape", "quanta_sim_shape", "torch_zip"])
def test_huge_claims_rejected_fast_without_allocating(claim):
    """A header claiming a 10^12-element tensor (4 TB) is a ValueError within a second; nothing is allocated."""
    big = [1_000_000, 1_000_000]
    before = _peak_rss_bytes()
    t0 = time.perf_counter()
    if claim == "safetensors_header":
        header = {"w": {"dtype": "F32", "shape": big, "data_offsets": [0, 4 * 10**12]},
                  "__metadata__": {"format": "quanta", "version": "1", "quanta": "{}"}}
        with pytest.raises(ValueError):
            load_quantized(_write("huge.safetensors", _join_safetensors(header, b"\0" * 64)))
    elif claim == "quanta_shape":
        header, body = _split_safetensors(quantized_file("int8_wo"))
        desc = json.loads(header["__metadata__"]["quanta"])
        desc["0.weight"]["shape"] = big
        desc["0.weight"]["block_size"] = [1, 1_000_000]
        header["__metadata__"]["quanta"] = json.dumps(desc)
        with pytest.raises(ValueError):
            load_quantized(_write("huge.safetensors", _join_safetensors(header, body)))
    elif claim == "quanta_sim_shape":
        s = subject("int8")
        doc = copy.deepcopy(s.docs["quanta"])
        entry = doc["quantizers"]["3.param_quantizers.weight"]
        entry["shape"], entry["block_size"] = big, [1, 1]
        with pytest.raises(ValueError):
            s.sim.load_encodings(doc)
        assert _same_state(s.state, _state(s.sim))
    else:  # a torch.save archive whose tensor claims shape 10^6 x 10^6 over a 4-element storage
        with pytest.raises(RuntimeError):  # torch's own error (see the module docstring)
            torch.load(_write("huge.pt", _torch_archive_claiming(big)), weights_only=True)
    assert time.perf_counter() - t0 < 1.0 + TIME_LIMIT / 5
    assert _peak_rss_bytes() - before < 512 * 2**20  # far less than the 4 TB claimed


def _torch_archive_claiming(shape: list[int]) -> bytes:
    """A torch.save archive of ``{"w": t}`` whose ``t`` has ``shape`` (contiguous strides) but 4 stored elements."""
    import zipfile

    view = torch.zeros(4).as_strided(tuple(shape), (0, 0))  # a real 10^12-element zero-stride view
    buf = io.BytesIO()
    torch.save({"w": view}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                zero_strides = b"K\x00K\x00\x86"  # BININT1 0, BININT1 0, TUPLE2
                assert data.count(zero_strides) == 1
                data = data.replace(zero_strides, b"J" + struct.pack("<i", shape[1]) + b"K\x01\x86")
            dst.writestr(info.filename, data)
    return out.getvalue()


# ============================================================================ torch.load of state dicts
def _state_dict_bytes(which: str) -> bytes:
    s = subject("int8")
    sd = s.sim.quantizer_state_dict() if which == "quantizer_state_dict" else s.sim.model.state_dict()
    buf = io.BytesIO()
    torch.save(sd, buf)
    return buf.getvalue()


#: what torch.load raises on a corrupt archive (PyTorch's zip reader and weights-only unpickler, not quanta)
TORCH_LOAD_ERRORS = (RuntimeError, pickle.UnpicklingError, EOFError, OSError, ValueError, KeyError, IndexError,
                     AttributeError, TypeError, UnicodeDecodeError, struct.error, AssertionError)


def _load_state_dict_checked(loaded: Any, which: str) -> None:
    """Give what torch.load returned to the sim: quanta's part of the contract (see FINDINGS 1-2)."""
    s = subject("int8")
    if which == "quantizer_state_dict":
        _, error = _timed(lambda: s.sim.load_quantizer_state_dict(loaded))
        # every value is checked before nn.Module.load_state_dict sees it (FINDINGS 1-2): only the documented errors
        allowed: tuple[type[BaseException], ...] = LOADER_ERRORS
    else:
        _, error = _timed(lambda: s.sim.model.load_state_dict(loaded))
        allowed = (RuntimeError, TypeError, ValueError)
    try:
        _check_error(error, allowed)
        if isinstance(error, RuntimeError):
            assert str(error).startswith("Error(s) in loading state_dict"), error
    finally:
        s.restore()


@FUZZ
@given(data=st.data(), which=st.sampled_from(["quantizer_state_dict", "state_dict"]))
def test_state_dict_files_byte_mutations(data, which):
    path = _write("state.pt", mutate_bytes(data, _state_dict_bytes(which)))
    loaded, error = _timed(lambda: torch.load(path, weights_only=True))
    _check_error(error, TORCH_LOAD_ERRORS)
    if error is None:
        _load_state_dict_checked(loaded, which)


@FUZZ
@given(raw=RANDOM_BYTES)
def test_state_dict_files_random_bytes(raw):
    path = _write("random.pt", raw)
    loaded, error = _timed(lambda: torch.load(path, weights_only=True))
    _check_error(error, TORCH_LOAD_ERRORS)
    if error is None:
        _load_state_dict_checked(loaded, "quantizer_state_dict")


def _mutate_state_dict(data: st.DataObject, sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    sd = {k: v.clone() for k, v in sd.items()}
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(sd)))
        op = data.draw(st.sampled_from(["drop", "rename", "shape", "dtype", "nonfinite", "swap", "nontensor",
                                        "negate", "scale"]))
        v = sd[key]
        if not isinstance(v, torch.Tensor) and op not in ("drop", "rename", "swap"):
            continue  # already replaced by a non-tensor: nothing tensor-shaped left to mutate
        if op == "drop":
            del sd[key]
        elif op == "rename":
            sd[key + data.draw(st.sampled_from(["", "x", ".min"]))] = sd.pop(key)
        elif op == "shape":
            sd[key] = torch.zeros(data.draw(st.sampled_from([(0,), (3,), (1, 1), (7, 1), (4, 1, 1)])), dtype=v.dtype)
        elif op == "dtype":
            sd[key] = v.to(data.draw(st.sampled_from([torch.float16, torch.float64, torch.int32, torch.bool,
                                                      torch.complex64, torch.uint8])))
        elif op == "nonfinite" and v.is_floating_point():
            sd[key] = torch.full_like(v, data.draw(st.sampled_from([math.nan, math.inf, -math.inf])))
        elif op == "swap":
            other = data.draw(st.sampled_from(sorted(sd)))
            sd[key], sd[other] = sd[other], sd[key]
        elif op == "nontensor":
            sd[key] = _odd(data)
        elif op == "negate" and v.is_floating_point():
            sd[key] = -v * 3
        elif v.is_floating_point():
            sd[key] = v * data.draw(st.sampled_from([0.0, 1e30, 1e-30, -1.0]))
    return sd


@settings(FUZZ, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # a known failure: no time spent shrinking
@given(data=st.data())
def test_load_quantizer_state_dict_structural_mutations(data):
    """The full contract for quanta's own state-dict loader: a valid state or ValueError/TypeError, atomically."""
    s = subject("int8")
    sd = _mutate_state_dict(data, s.state)
    buf = io.BytesIO()
    try:
        torch.save(sd, buf)
    except Exception:  # noqa: BLE001 - an unsaveable dict cannot be a file; give it to the loader directly
        loaded: Any = sd
    else:
        buf.seek(0)
        loaded = torch.load(buf, weights_only=True)
    _, error = _timed(lambda: s.sim.load_quantizer_state_dict(loaded))
    try:
        _check_error(error)
        if error is not None:
            assert _same_state(s.state, _state(s.sim)), "a rejected state dict changed the sim"
        else:
            _check_sim_usable(s)
    finally:
        s.restore()


# ---------------------------------------------------------------------------- FINDINGS 1-2, one case each
BAD_QUANTIZER_STATES: dict[str, Callable[[dict[str, torch.Tensor]], None]] = {
    "nan_min": lambda sd: sd.__setitem__("3.output_quantizers.0.min", torch.tensor(math.nan)),
    "inf_max": lambda sd: sd.__setitem__("3.output_quantizers.0.max", torch.tensor(math.inf)),
    "min_above_max": lambda sd: sd.__setitem__("3.output_quantizers.0.min", torch.tensor(5.0)),
    "shape_mismatch": lambda sd: sd.__setitem__("3.param_quantizers.weight.max", torch.zeros(7)),
    "not_a_tensor": lambda sd: sd.__setitem__("3.output_quantizers.0.min", [1.0]),
}


@pytest.mark.parametrize("case", list(BAD_QUANTIZER_STATES))
def test_load_quantizer_state_dict_rejects_invalid_state_atomically(case):
    s = subject("int8")
    sd = {k: v.clone() + (1 if v.is_floating_point() else 0) for k, v in s.state.items()}  # every range changed
    BAD_QUANTIZER_STATES[case](sd)
    try:
        with pytest.raises((ValueError, TypeError)):
            s.sim.load_quantizer_state_dict(sd)
        assert _same_state(s.state, _state(s.sim)), "a rejected state dict changed the sim"
    finally:
        s.restore()


def test_load_quantizer_state_dict_valid_round_trip_through_a_file():
    s = subject("int8")
    buf = io.BytesIO()
    torch.save(s.sim.quantizer_state_dict(), buf)
    buf.seek(0)
    s.sim.load_quantizer_state_dict(torch.load(buf, weights_only=True))
    assert _same_state(s.state, _state(s.sim))


# ============================================================================ no code execution
class _WritesMarker:
    """Unpickling this calls ``open(marker, "w")``: the marker file appears if anything unpickles it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payloads(marker: str) -> dict[str, bytes]:
    evil = _WritesMarker(marker)
    pickled = {f"protocol{p}": pickle.dumps(evil, protocol=p) for p in (0, 2, 4, 5)}
    buf = io.BytesIO()
    torch.save({"x": evil}, buf)  # a torch archive whose data.pkl calls open()
    pickled["torch_archive"] = buf.getvalue()
    # the pickle inside the JSON formats' string fields and a safetensors header
    text = pickle.dumps(evil, protocol=0).decode("latin-1")
    pickled["json_string"] = json.dumps({"version": "1.0.0", "activation_encodings": text,
                                         "param_encodings": [], "format": text}).encode()
    pickled["safetensors_metadata"] = _join_safetensors(
        {"__metadata__": {"format": "quanta", "version": "1", "quanta": json.dumps({"w": text})}}, b"")
    return pickled


@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")  # torch, on the protocol 4/5 payloads
def test_no_loader_executes_a_pickle(tmp_path):
    marker = str(tmp_path / "PWNED")
    sim = subject("int8")
    for name, raw in _payloads(marker).items():
        path = tmp_path / f"{name}.bin"
        path.write_bytes(raw)
        p = str(path)
        calls = {
            "read_encodings": (lambda: read_encodings(p), LOADER_ERRORS),
            "load_encodings": (lambda: sim.sim.load_encodings(p), LOADER_ERRORS),
            "load_quantized": (lambda: load_quantized(p), LOADER_ERRORS),
            "torch.load": (lambda: torch.load(p, weights_only=True), TORCH_LOAD_ERRORS),
        }
        for loader, (call, allowed) in calls.items():
            _, error = _timed(call)
            assert error is not None, f"{loader} accepted the {name} payload"
            _check_error(error, allowed)
            assert not os.path.exists(marker), f"{loader} executed the {name} payload"
        assert _same_state(sim.state, _state(sim.sim))
    # sanity: the payload really does write the marker when unpickled without protection
    pickle.loads(pickle.dumps(_WritesMarker(marker))).close()
    assert os.path.exists(marker)


# ============================================================================ regressions for FINDINGS 3-8
def test_deeply_nested_json_is_a_value_error(tmp_path):
    """FINDING 3: ``[[[[...`` 100k deep raised RecursionError from json (quanta/_files.py read_json; the
    format sniffing of QuantizationSimModel.load_encodings)."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    with pytest.raises(ValueError, match="JSON"):
        read_encodings(path)
    s = subject("int8")
    with pytest.raises(ValueError, match="JSON"):
        s.sim.load_encodings(path)
    assert _same_state(s.state, _state(s.sim))


def test_quanta_format_infinite_shape_is_a_value_error():
    """FINDING 4: ``"shape": [Infinity]`` leaked OverflowError from ``int(inf)`` (quantsim.py _parse_entry)."""
    s = subject("int8")
    doc = copy.deepcopy(s.docs["quanta"])
    doc["quantizers"]["3.output_quantizers.0"]["shape"] = [math.inf]
    with pytest.raises(ValueError, match="3.output_quantizers.0"):
        s.sim.load_encodings(doc)
    assert _same_state(s.state, _state(s.sim))


def test_quanta_format_non_string_quantizer_name_is_a_type_error():
    """FINDING 5: a dict with a non-str quantizer name failed inside the error message itself."""
    s = subject("int8")
    doc = copy.deepcopy(s.docs["quanta"])
    doc["quantizers"][5] = doc["quantizers"]["3.output_quantizers.0"]
    with pytest.raises(TypeError, match="quantizer names must be strings"):
        s.sim.load_encodings(doc)


@pytest.mark.parametrize("name, qmin, qmax", [("int8_dyn_asym", -256, 127), ("int8_wo", -128, 1000),
                                              ("int4_uintx_g32", -1, 15), ("int4_cpu_g32", 0, 2**40)])
def test_code_range_outside_the_code_dtype_is_rejected_at_load(name, qmin, qmax):
    """FINDING 6: quant_min -256 for int8 codes loaded, and only ``dequantize()`` raised (serialization.py)."""
    header, body = _split_safetensors(quantized_file(name))
    desc = json.loads(header["__metadata__"]["quanta"])
    entry = desc["0.weight"]
    entry = entry["weight"] if entry["type"] == "LinearActivationQuantizedTensor" else entry
    entry["quant_min"], entry["quant_max"] = qmin, qmax
    header["__metadata__"]["quanta"] = json.dumps(desc)
    with pytest.raises(ValueError, match="quant_min"):
        load_quantized(_write("range.safetensors", _join_safetensors(header, body)))


@pytest.mark.parametrize("name, tensor, value", [("int8_wo", "0.weight::scale", math.nan),
                                                  ("int4_cpu_g32", "0.weight::scale", -1.0),
                                                  ("int4_uintx_g32", "0.weight::zero_point", math.inf),
                                                  ("float8", "0.weight::scale", math.inf),
                                                  ("fp6", "0.weight::scale", 0.0)])
def test_non_finite_or_negative_qparams_are_rejected_at_load(name, tensor, value):
    """FINDING 7: a byte flip that made one scale NaN/negative loaded; only ``dequantize()`` raised
    (serialization.py _check_qparam_values)."""
    header, _ = _split_safetensors(quantized_file(name))
    tensors = safetensors_torch.load(quantized_file(name))
    tensors[tensor] = tensors[tensor].clone()
    tensors[tensor].view(-1)[0] = value
    path = _scratch("qparams.safetensors")
    safetensors_torch.save_file(tensors, path, metadata=header["__metadata__"])
    with pytest.raises(ValueError, match="scale|zero"):
        load_quantized(path)


@pytest.mark.parametrize("version, path", [("0.6.1", ("param_encodings", "0.weight", 0, "dtype")),
                                           ("0.6.1-tensor", ("param_encodings", "0.weight", 0, "dtype")),
                                           ("1.0.0", ("param_encodings", "0.weight", 0, "dtype")),
                                           ("1.0.0-tensor", ("param_encodings", 0, "dtype")),
                                           ("1.0.0-tensor", ("param_encodings", 0, "enc_type")),
                                           ("2.0.0", ("encodings", 0, "output_dtype"))])
def test_unhashable_vocabulary_values_are_value_errors(version, path):
    """FINDING 8: ``"dtype": ["int"]`` (or a list/dict enc_type/output_dtype) raised TypeError("unhashable type")
    from a dict lookup (encodings.py _dtype, _parse_1_0_0, _parse_2_0_0)."""
    s = subject("int8")
    for bad in (["int"], {"INT": 1}):
        doc = copy.deepcopy(s.docs[version])
        _set(doc, path, bad)
        with pytest.raises(ValueError, match=path[-1]):
            read_encodings(doc)
        with pytest.raises(ValueError, match=path[-1]):
            s.sim.load_encodings(doc)
        assert _same_state(s.state, _state(s.sim))


FINDINGS = """
1. load_quantizer_state_dict / load_state_dict accept NaN, inf and inverted (min > max) ranges: the quantizer
   then has a NaN/inf scale and the sim outputs NaN. Fixed: QuantizerBase.check_state, run by every
   _load_from_state_dict (ValueError naming the quantizer).
2. load_quantizer_state_dict was not atomic: a shape mismatch raised torch's RuntimeError after the keys before
   it were already copied. Fixed: every quantizer's new state is checked before anything is loaded.
3. Deeply nested JSON raised RecursionError (read_json; load_encodings' format sniffing). Fixed.
4. quanta-format "shape": [Infinity] raised OverflowError (_parse_entry). Fixed.
5. A non-str quantizer name in a load_encodings dict raised an unhelpful TypeError from the error message. Fixed.
6. load_quantized accepted quant_min/quant_max outside the codes' dtype (-256 for int8): the tensor loaded and
   only dequantize() raised. Fixed (serialization.py _aqt_from/_code_dtype).
7. load_quantized accepted NaN/inf/negative scales and non-finite zero points from the file; only dequantize()
   raised. Fixed (serialization.py _check_qparam_values).
8. read_encodings / load_encodings: a list or dict where a vocabulary word belongs (dtype, enc_type,
   output_dtype) raised TypeError("unhashable type: 'list'"). Fixed (encodings.py _dtype, _parse_1_0_0,
   _parse_2_0_0).
9. (PyTorch, not quanta) torch.load(weights_only=True) of a corrupt archive raises RuntimeError, UnpicklingError,
   EOFError, OSError, UnicodeDecodeError, IndexError, KeyError, struct.error, even AssertionError: listed in
   TORCH_LOAD_ERRORS. It never executed a payload and rejected a 10^12-element claim at once.
"""
