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

FUNCTIONS = ("asarray", "from_dlpack", "empty", "zeros", "set_num_threads", "get_num_threads",
             "set_buffer_cache_limit", "get_buffer_cache_limit", "buffer_cache_stats")
METHODS = {
    "Tensor": ("is_contiguous", "contiguous", "copy", "permute", "transpose", "view", "reshape", "expand", "select",
               "slice", "as_readonly"),
    "Publisher": ("__init__", "send", "loan", "close"),
    "Subscriber": ("__init__", "recv", "close"),
    "DType": ("__init__",),
    "Device": ("__init__",),
}


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
        if isinstance(node, ast.Name) and node.id.startswith("__d"):
            return repr(defaults[int(node.id[3:])])
        return ast.unparse(node)

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


def install(namespace: dict[str, Any]) -> None:
    for name in FUNCTIONS:
        f = getattr(_ext, name)
        signed = _ext._signed_function(f, name, f"{name}{text_signature(f, method=False)}\n--\n\n{f.__doc__ or ''}")
        signed.__module__ = "tensorwire"
        namespace[name] = signed
    for cls_name, names in METHODS.items():
        cls = getattr(_ext, cls_name)
        for name in names:
            f = cls.__dict__[name]
            doc = f.__doc__ or ""
            if name == "__init__":
                doc = doc.replace("__init__(self, ", f"{cls_name}(", 1)
            _ext._signed_method(cls, name, f"{name}{text_signature(f, method=True)}\n--\n\n{doc}")
