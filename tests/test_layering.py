"""quanta's layers (the design's "Layers"; README, "Layout"): every module imports only from its own
subpackage or from a lower layer, and no modules import each other in a cycle.

Every ``import`` statement of every module under ``src/quanta`` counts: at module level, inside functions (lazy
imports) and under ``if TYPE_CHECKING``. Two subpackages on the same layer (the two quantizer dialects, say) may
not import each other. ``ALLOWED`` lists the imports that break a rule for now, each with its reason; an entry
that no longer matches an import fails the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

#: Bottom up; a subpackage (or top-level module) imports only from its own subpackage and from the layers above it
#: in this list. The numbered layers are DESIGN.md's; the lettered ones split a layer into ordered parts.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("0 helpers (no quanta imports)", ("quanta._text", "quanta._files", "quanta._inputs", "quanta._snapshot",
                                     "quanta._progress")),
    ("1 grids and formats", ("quanta.grids",)),
    ("2 kernels", ("quanta.kernels",)),
    ("3 encodings", ("quanta.encodings",)),
    ("4 tensors", ("quanta.tensors", "quanta.dtypes")),
    ("5a collectives for calibration statistics", ("quanta.distributed",)),
    ("5b calibration statistics (encoding analyzers)", ("quanta.calibration",)),
    ("5c quantizers: the AIMET/torchao and TensorRT dialects", ("quanta.quantization", "quanta.tensor_quant")),
    ("6a quantized modules", ("quanta.nn",)),
    ("6b export", ("quanta.export",)),
    ("6c simulation (QuantizationSimModel)", ("quanta.quantsim",)),
    ("6c' ModelOpt's model-level API", ("quanta.modelopt",)),
    ("6d AIMET's import paths of the accuracy techniques",
     ("quanta.adaround", "quanta.batch_norm_fold", "quanta.bn_reestimation", "quanta.cross_layer_equalization",
      "quanta.mixed_precision", "quanta.quant_analyzer", "quanta.seq_mse")),
    ("7a tools", ("quanta.tools",)),
    ("7b command line", ("quanta.cli",)),
    ("8 the package's public surface", ("quanta",)),
]

#: (importing module, imported module) -> why the import stays for now.
ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted((SRC / "quanta").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _targets(module: str, is_pkg: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The quanta modules an import statement names (``from pkg import name`` names ``pkg.name`` if it is one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = module.split(".") if is_pkg else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:  # `import quanta.x.y` of a name inside quanta.x.y's package
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def _imports() -> list[tuple[str, str, int]]:
    """``(importer, imported, line)`` for every import of a quanta module by a quanta module."""
    edges = []
    for module, (path, is_pkg) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.extend((module, t, node.lineno) for t in _targets(module, is_pkg, node) if t != module)
    return edges


EDGES = _imports()


def _unit(module: str) -> str:
    """The subpackage or top-level module a module belongs to (``quanta.nn.base`` -> ``quanta.nn``)."""
    return ".".join(module.split(".")[:2])


def _layer(unit: str) -> int:
    for i, (_, units) in enumerate(LAYERS):
        if unit in units:
            return i
    raise KeyError(unit)


def _cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder():
    assert _cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")]) == [["a", "b", "c"]]
    assert _cycles([("a", "b"), ("b", "c")]) == []


def test_every_subpackage_has_a_layer():
    units = {_unit(m) for m in MODULES}
    named = [u for _, us in LAYERS for u in us]
    assert len(named) == len(set(named)), "a subpackage is listed on two layers"
    assert sorted(units - set(named)) == [], "add the new subpackage to LAYERS"
    assert sorted(set(named) - units) == [], "LAYERS names a subpackage that no longer exists"


def test_imports_go_down():
    upward = []
    for a, b, line in EDGES:
        if (a, b) in ALLOWED or _unit(a) == _unit(b):
            continue
        if _layer(_unit(b)) >= _layer(_unit(a)):
            upward.append(f"{a}:{line} imports {b} (layer {LAYERS[_layer(_unit(b))][0]!r}, "
                          f"not below {LAYERS[_layer(_unit(a))][0]!r})")
    assert upward == []


def test_no_import_cycles():
    edges = [(a, b, line) for a, b, line in EDGES if (a, b) not in ALLOWED]
    found = [[f"{a}:{line} imports {b}" for a, b, line in edges if a in cycle and b in cycle]
             for cycle in _cycles([(a, b) for a, b, _ in edges])]
    assert found == []


def test_allow_list_is_current():
    assert sorted(set(ALLOWED) - {(a, b) for a, b, _ in EDGES}) == []


@pytest.mark.parametrize("module", ["quanta.dtypes", "quanta.tensor_quant", "quanta.export.protocol"])
def test_lower_layers_load_without_the_upper_ones(module):
    """Importing a module loads no module of a higher layer (in a fresh interpreter; the root package ``quanta``,
    which Python imports first, aside)."""
    code = f"import sys, {module}\nprint('\\n'.join(m for m in sys.modules if m.startswith('quanta.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    here = _layer(_unit(module))
    assert sorted(m for m in loaded if m in MODULES and _layer(_unit(m)) > here) == []
