"""Runtime signatures: inspect.signature() and help() for tensorwire's native functions and methods.

nanobind's function objects carry their signature only as text (``__nb_signature__``) and cannot be given a
``__text_signature__``, so inspect.signature() refuses them. Each public native function is re-exported as a CPython
builtin that forwards its arguments unchanged (one vectorcall, ~20 ns) and whose docstring begins with the text
signature inspect reads; nanobind's own docstring, with annotations, follows. tests/python/test_signatures.py checks
that every one matches the stubs (__init__.pyi).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from . import _tensorwire as _ext

# The native classes whose public methods (and __init__) get signatures; module functions are found in _ext.
CLASSES = ("Tensor", "DType", "Device", "Publisher", "Subscriber", "ArrowTensorArray")
FUNCTIONS: list[str] = []  # filled by install(): the names it wrapped
METHODS: dict[str, list[str]] = {}


def _is_native(f: Any) -> bool:
    return type(f).__name__ in ("nb_func", "nb_method") and hasattr(f, "__nb_signature__")


def text_signature(f: Any, *, method: bool) -> str:
    """The text signature, "(a, b='x', *, c=None)", of a nanobind function (its first overload)."""
    sig, _doc, defaults = f.__nb_signature__[0]
    defaults = defaults or ()
    src = re.sub(r"\\(\d+)", lambda m: f"__d{m.group(1)}", sig)
    src = re.sub(r"^def \w*\(", "def f(", src)
    fn = ast.parse(src + ": pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    a = fn.args

    def default(node: ast.expr) -> str:
        text = repr(defaults[int(node.id[3:])]) if isinstance(node, ast.Name) and node.id.startswith("__d") \
            else ast.unparse(node)
        try:  # inspect accepts literals only; anything else (an object's repr, inf) is shown as "..."
            ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return "..."
        return text

    parts: list[str] = []
    positional = a.posonlyargs + a.args
    first_default = len(positional) - len(a.defaults)
    for i, arg in enumerate(positional):
        name = arg.arg
        if method and i == 0:
            parts += ["$self", "/"] if not a.posonlyargs[1:] else ["$self"]
            continue
        parts.append(name if i < first_default else f"{name}={default(a.defaults[i - first_default])}")
        if a.posonlyargs and arg is a.posonlyargs[-1] and not (method and i == 0):
            parts.append("/")
    if a.vararg:
        parts.append(f"*{a.vararg.arg}")
    elif a.kwonlyargs:
        parts.append("*")
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        parts.append(arg.arg if d is None else f"{arg.arg}={default(d)}")
    if a.kwarg:
        parts.append(f"**{a.kwarg.arg}")
    return "(" + ", ".join(parts) + ")"


def _doc(name: str, textsig: str, doc: str) -> str:
    return f"{name}{textsig}\n--\n\n{doc}"


def install(namespace: dict[str, Any]) -> None:
    """Wrap every public native function of _ext (exported into `namespace`) and every public method of CLASSES.

    Idempotent (an already wrapped name is no longer a nanobind object), and never fatal: a signature that cannot
    be derived leaves that nanobind object as it is, so importing tensorwire cannot fail here.
    """
    for name, f in list(vars(_ext).items()):
        if name.startswith("_") or not _is_native(f) or namespace.get(name) is not f:
            continue
        try:
            signed = _ext._signed_function(f, name, _doc(name, text_signature(f, method=False), f.__doc__ or ""))
        except Exception:  # pragma: no cover - a signature nanobind describes in a way this parser does not know
            continue
        signed.__module__ = "tensorwire"
        namespace[name] = signed
        FUNCTIONS.append(name)
    for cls_name in CLASSES:
        cls = getattr(_ext, cls_name, None)
        if cls is None:
            continue
        for name, f in list(vars(cls).items()):
            if (name.startswith("_") and name != "__init__") or not _is_native(f):
                continue
            doc = f.__doc__ or ""
            if name == "__init__":
                doc = doc.replace("__init__(self, ", f"{cls_name}(", 1)
            try:
                _ext._signed_method(cls, name, _doc(name, text_signature(f, method=True), doc))
            except Exception:  # pragma: no cover - as above
                continue
            METHODS.setdefault(cls_name, []).append(name)
