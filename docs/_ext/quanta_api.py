"""The API reference: one page per public module, every name of its ``__all__`` with its summary line.

``.. quanta-module:: quanta.nn`` (MyST: ```` ```{quanta-module} quanta.nn ```` ````) writes the module's
docstring, a table of its public names (each linked, with the first line of its docstring) and the full
documentation of the names whose home is this module. A name that several modules export (``quanta``,
``quanta.quantization`` and ``quanta.tensors`` all export ``DequantizedTensor``) is documented once, in its
*home*: the most specific documented module that both exports it and contains the module defining it, or
else the first module of :data:`MODULES` that exports it; the other tables link there.

Cross references in docstrings are checked: a quanta name must exist. One that names a public object by
another path (``quanta.quantization.affine.quantizer.Quantize``) links to its home; one that names an
internal module or object (``quanta.kernels.qparams``) that exists is set as code, without a link;
one that names nothing fails the strict build. Names outside quanta (torch, numpy, builtins) are set
as code: the site is built offline, without other projects' inventories.
"""

from __future__ import annotations

import builtins
import functools
import importlib
import inspect
import sys
import typing

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.domains.python import PythonDomain
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

#: The documented modules, in the order that decides a shared name's home when no module contains its
#: definition (and the order of the reference's table of contents).
MODULES: tuple[str, ...] = (
    "quanta",
    "quanta.quantization",
    "quanta.quantization.affine",
    "quanta.quantization.float",
    "quanta.quantization.encoding_analyzer",
    "quanta.quantization.quant_primitives",
    "quanta.dtypes",
    "quanta.tensor_quant",
    "quanta.modelopt",
    "quanta.nn",
    "quanta.quantsim",
    "quanta.adaround",
    "quanta.seq_mse",
    "quanta.cross_layer_equalization",
    "quanta.batch_norm_fold",
    "quanta.bn_reestimation",
    "quanta.mixed_precision",
    "quanta.quant_analyzer",
    "quanta.quantization.gptq",
    "quanta.quantization.awq",
    "quanta.quantization.smoothquant",
    "quanta.calibration",
    "quanta.export",
    "quanta.encodings",
    "quanta.grids",
    "quanta.tensors",
    "quanta.distributed",
)

_EXTERNAL_BARE = set(dir(builtins)) | set(typing.__all__) | {"Tensor", "Module", "Path", "PathLike", "Enum",
                                                             "dtype", "device", "Self"}


def public_names(modname: str) -> list[str]:
    """The names of ``modname.__all__`` (every documented module has one)."""
    mod = importlib.import_module(modname)
    names = getattr(mod, "__all__", None)
    if names is None:
        raise ValueError(f"documented module {modname} has no __all__")
    return list(names)


def _is_data(obj: object) -> bool:
    return not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj) or callable(obj))


def _key(modname: str, name: str, obj: object) -> tuple:
    # Constants are documented where each module exports them (an int or a dict has no identity worth following).
    return ("data", modname, name) if _is_data(obj) else ("object", id(obj))


@functools.cache
def homes() -> dict[tuple, str]:
    """key -> the dotted path where a public name of :data:`MODULES` is documented."""
    exporters: dict[tuple, list[str]] = {}
    defined_in: dict[tuple, str] = {}
    for modname in MODULES:
        mod = importlib.import_module(modname)
        for name in public_names(modname):
            obj = getattr(mod, name)
            key = _key(modname, name, obj)
            exporters.setdefault(key, []).append(f"{modname}.{name}")
            defined_in[key] = "" if _is_data(obj) else (getattr(obj, "__module__", None) or "")
    result = {}
    for key, paths in exporters.items():
        defined = defined_in[key]
        inside = [p for p in paths if defined == p.rpartition(".")[0]
                  or defined.startswith(p.rpartition(".")[0] + ".")]
        result[key] = max(inside, key=lambda p: p.count(".")) if inside else paths[0]
    return result


def home_of(modname: str, name: str) -> str:
    """Where ``modname.name`` (a public name) is documented."""
    return homes()[_key(modname, name, getattr(importlib.import_module(modname), name))]


@functools.cache
def _attr_docs(modname: str) -> dict[str, str]:
    """name -> the ``#:`` comment or string literal that documents a constant assigned in ``modname``."""
    try:
        docs = ModuleAnalyzer.for_module(modname).find_attr_docs()
    except Exception:  # noqa: BLE001  (a module without Python source documents nothing)
        return {}
    return {name: "\n".join(lines).strip() for (cls, name), lines in docs.items() if cls == ""}


@functools.cache
def _all_quanta_modules() -> tuple[str, ...]:
    import pkgutil

    import quanta

    return tuple(m.name for m in pkgutil.walk_packages(quanta.__path__, "quanta."))


def _doc_of_data(modname: str, name: str) -> str:
    """The documentation of a public constant: from the module exporting it, else from where it is assigned."""
    value = getattr(importlib.import_module(modname), name)
    for m in (modname, *_all_quanta_modules()):
        # the value came from a module importing ``modname`` loaded; only those holding it are parsed
        if getattr(sys.modules.get(m), name, None) is value:
            doc = _attr_docs(m).get(name)
            if doc:
                return doc
    return ""


def summary_line(modname: str, name: str) -> str:
    """The first sentence-line of a public name's docstring ('' when it has none)."""
    obj = getattr(importlib.import_module(modname), name)
    doc = _doc_of_data(modname, name) if _is_data(obj) else (inspect.getdoc(obj) or "")
    return first_sentence(doc.strip().split("\n\n")[0].replace("\n", " ").strip())


def first_sentence(paragraph: str) -> str:
    """Up to the first full stop that ends a sentence (outside ``literals``, not in "e.g." / "i.e.")."""
    in_literal = False
    i = 0
    while i < len(paragraph):
        if paragraph.startswith("``", i):
            in_literal = not in_literal
            i += 2
            continue
        if (not in_literal and paragraph[i] == "." and (i + 1 == len(paragraph) or paragraph[i + 1] == " ")
                and not paragraph[max(0, i - 3):i + 1].endswith(("e.g.", "i.e.", "etc.", "vs."))):
            return paragraph[:i + 1]
        i += 1
    return paragraph


class QuantaModule(SphinxDirective):
    """``.. quanta-module:: dotted.name``: a module's reference page body."""

    required_arguments = 1
    has_content = False

    def run(self) -> list[nodes.Node]:
        modname = self.arguments[0]
        if modname not in MODULES:
            raise self.error(f"quanta-module: {modname} is not in quanta_api.MODULES")
        source = f"<quanta-module {modname}>"
        lines = StringList()
        for text in (f".. automodule:: {modname}", "   :no-members:", "",
                     ".. rubric:: Public names", "", ".. list-table::", "   :widths: 30 70", ""):
            lines.append(text, source)
        own = []
        mod = importlib.import_module(modname)
        for name in public_names(modname):
            obj = getattr(mod, name)
            summary = summary_line(modname, name)
            if not summary:
                raise self.error(f"{modname}.{name} has no docstring summary line")
            if inspect.ismodule(obj):  # a subpackage: its own page
                if obj.__name__ not in MODULES:
                    raise self.error(f"{modname}.{name} is a module missing from quanta_api.MODULES")
                lines.append(f"   * - :py:mod:`{name} <{obj.__name__}>`", source)
                lines.append(f"     - {summary}", f"docstring of {obj.__name__}")
                continue
            home = home_of(modname, name)
            lines.append(f"   * - :py:obj:`{name} <{home}>`", source)
            # The summary's references are relative to the module defining the object, as in its docstring.
            defined = f"{getattr(obj, '__module__', modname)}.{getattr(obj, '__qualname__', name)}"
            lines.append(f"     - {summary}", f"docstring of {defined}")
            if home == f"{modname}.{name}":
                own.append(name)
        lines.append("", source)
        rest: list[str] = []
        for name in own:
            obj = getattr(mod, name)
            if inspect.isclass(obj):
                rest += [f".. autoclass:: {name}", ""]
            elif inspect.isroutine(obj):
                rest += [f".. autofunction:: {name}", ""]
            elif _is_data(obj):
                rest += [f".. py:data:: {name}", f"   :type: {type(obj).__name__}", ""]
                rest += ["   " + ln for ln in _doc_of_data(modname, name).splitlines()] + [""]
            else:  # a callable object (e.g. a typing alias or a configured function object)
                rest += [f".. autodata:: {name}", "   :no-value:", ""]
        for text in rest:
            lines.append(text, source)
        self.state_machine.insert_input(lines, source)
        return []


def _resolve_quanta_object(target: str, context: list[str]) -> tuple[bool, object | None]:
    """Import ``target`` (dotted, or relative to a context module/class); (found, object)."""
    for base in [*context, ""]:
        path = f"{base}.{target}" if base else target
        parts = path.split(".")
        if parts[0] != "quanta":
            continue
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                break
            return True, obj
    return False, None


def _missing_reference(app: Sphinx, env, node, contnode):  # noqa: ANN001  (Sphinx's event signature)
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    root = target.split(".")[0]
    if root != "quanta" and ("." in target or "[" in target or target in _EXTERNAL_BARE):
        return contnode  # another project's name: text
    context = [c for c in (node.get("py:class") and f"{node.get('py:module')}.{node.get('py:class')}",
                           node.get("py:module")) if c]
    # A docstring shown under a re-exported path still names things relative to the module that defines it.
    source = node.source or ""
    if "docstring of " in source:
        parts = source.rpartition("docstring of ")[2].split(".")
        context += [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    found, obj = _resolve_quanta_object(target, context)
    if not found:
        # A bare name used inside its own module's docstrings: look in every documented module.
        for modname in MODULES:
            mod = importlib.import_module(modname)
            if target in public_names(modname):
                found, obj = True, getattr(mod, target)
                break
    if not found:
        return None  # names nothing: Sphinx warns, the strict build fails
    home = None if _is_data(obj) else homes().get(("object", id(obj)))
    if home is None and inspect.ismodule(obj) and obj.__name__ in MODULES:
        home = obj.__name__
    if home is None:
        return contnode  # an internal module or object that exists: code, no link
    py = env.get_domain("py")
    for role in ("obj", "mod"):
        ref = py.resolve_xref(env, node["refdoc"], app.builder, role, home, node, contnode)
        if ref is not None:
            return ref
    return contnode


def _napoleon_only_for_callables(app: Sphinx) -> None:
    """Napoleon reads the first line of an attribute's or property's docstring as ``type: text``; quanta's
    say ``what: more`` in prose ("how the model was captured: ..."), so napoleon sees only the docstrings
    with sections (classes, functions, methods, modules)."""
    from sphinx.ext import napoleon

    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)

            def process(app, what, name, obj, options, lines, _inner=listener.handler):  # noqa: ANN001
                if what not in ("attribute", "property", "data"):
                    _inner(app, what, name, obj, options, lines)

            app.connect("autodoc-process-docstring", process, priority=listener.priority)


class _PythonDomain(PythonDomain):
    """Python's domain, except that a builtin type in an annotation (``float``) is never matched by its
    fuzzy search to a quanta object that ends with the same name (the ``quanta.quantization.float`` module)."""

    def resolve_xref(self, env, fromdocname, builder, typ, target, node, contnode):  # noqa: ANN001,ANN201
        if typ in ("class", "obj") and target in _BUILTIN_NAMES:
            return None  # -> _missing_reference: set as text
        return super().resolve_xref(env, fromdocname, builder, typ, target, node, contnode)


_BUILTIN_NAMES = frozenset(dir(builtins))


def setup(app: Sphinx) -> dict:
    app.add_domain(_PythonDomain, override=True)
    app.setup_extension("sphinx.ext.napoleon")
    _napoleon_only_for_callables(app)
    app.add_directive("quanta-module", QuantaModule)
    app.connect("missing-reference", _missing_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
