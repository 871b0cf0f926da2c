"""Runtime signatures (inspect.signature, help) of the native functions and methods match the stubs (issue 14)."""

from __future__ import annotations

import ast
import inspect
import os
import pickle
import pydoc
import re

import numpy as np
import pytest

import tensorwire as tw
from tensorwire import _signatures

STUB = os.path.join(os.path.dirname(tw.__file__), "__init__.pyi")


def _stub_defs() -> dict[str, list[ast.FunctionDef]]:
    tree = ast.parse(open(STUB).read())
    defs: dict[str, list[ast.FunctionDef]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            defs.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef):
                    defs.setdefault(f"{node.name}.{sub.name}", []).append(sub)
    return defs


def _shape(sig_params) -> list[tuple[str, str, object]]:
    return [(p.name, p.kind.name, p.default) for p in sig_params if p.name != "self"]


def _stub_shape(fn: ast.FunctionDef) -> list[tuple[str, str, object]]:
    a = fn.args
    out: list[tuple[str, str, object]] = []
    positional = a.posonlyargs + a.args
    first_default = len(positional) - len(a.defaults)
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if arg in a.posonlyargs else "POSITIONAL_OR_KEYWORD"
        d = ast.literal_eval(a.defaults[i - first_default]) if i >= first_default else inspect.Parameter.empty
        out.append((arg.arg, kind, d))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", inspect.Parameter.empty))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", inspect.Parameter.empty if d is None else ast.literal_eval(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", inspect.Parameter.empty))
    return [x for x in out if x[0] != "self"]


def _public():
    for name in _signatures.FUNCTIONS:
        yield name, getattr(tw, name)
    for cls, names in _signatures.METHODS.items():
        for name in names:
            yield f"{cls}.{name}", getattr(getattr(tw, cls), name)


def test_every_public_callable_has_a_runtime_signature():
    assert {"asarray", "empty", "zeros", "from_dlpack", "to_arrow", "from_arrow"} <= set(_signatures.FUNCTIONS)
    missing = []
    for n in tw.__all__:
        o = getattr(tw, n)
        if inspect.isclass(o):
            members = [(f"{n}.{a}", v) for a, v in vars(o).items() if callable(v) and not a.startswith("_")]
            if f"{n}.__init__" in _stub_defs():  # constructible from Python (Tensor is not: use tw.asarray)
                members.append((n, o))
        elif callable(o):
            members = [(n, o)]
        else:
            continue
        for qual, f in members:
            try:
                inspect.signature(f)
            except (ValueError, TypeError) as e:
                missing.append(f"{qual}: {e}")
    assert not missing, missing


@pytest.mark.parametrize("qualname,obj", list(_public()), ids=lambda x: x if isinstance(x, str) else "")
def test_runtime_signature_matches_the_stub(qualname, obj):
    sig = inspect.signature(obj)  # raised ValueError for every nanobind function before
    stubs = _stub_defs()[qualname]
    runtime = _shape(sig.parameters.values())
    if qualname.endswith("__init__"):  # positional-only self in the text signature; the same parameters otherwise
        runtime = [p for p in runtime if p[0] != "self"]
    stub_shapes = [_stub_shape(s) for s in stubs]
    if len(stubs) == 1:
        assert runtime == stub_shapes[0], (qualname, runtime, stub_shapes[0])
    else:  # overloads: the runtime's parameters are one overload's, or their names are a superset of all of them
        names = {n for n, _, _ in runtime}
        assert runtime in stub_shapes or all({n for n, _, _ in s} <= names for s in stub_shapes), (qualname, runtime)


def test_the_stub_declares_every_public_member_and_protocol_the_runtime_has():
    # A member the runtime has and the stub lacks is a type error in user code that runs (`for row in t`,
    # `len(arrow_array)`): mypy --strict users see tensorwire as broken.
    tree = ast.parse(open(STUB).read())
    top, members = set(), {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            top.add(node.name)
            members[node.name] = {m.name for m in node.body if isinstance(m, ast.FunctionDef)} | {
                m.target.id for m in node.body if isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name)}
        elif isinstance(node, ast.FunctionDef):
            top.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            top.add(node.target.id)
        elif isinstance(node, ast.Assign):
            top |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):
            top |= {a.asname or a.name for a in node.names}
    assert "__all__" in top and set(tw.__all__) <= top, set(tw.__all__) - top
    inherited = set(dir(object)) | set(dir(BaseException)) | {"__dict__", "__module__", "__weakref__", "__slots__",
                                                              "__abstractmethods__", "_abc_impl", "__nb_signature__"}
    missing = []
    for cls, declared in members.items():
        rt = getattr(tw, cls)
        if cls == "Metadata":  # a MutableMapping: the mixin methods come with the base class in the stub too
            declared = declared | set(dir(tw.Metadata.__mro__[1]))
        for a in dir(rt):
            if a in inherited or (a.startswith("_") and not a.startswith("__")):
                continue
            if a not in declared:
                missing.append(f"{cls}.{a}")
    assert not missing, missing
    assert isinstance(tw.to_arrow(np.zeros((2, 3, 4), np.float32), dim_names=("h", "w")).dim_names, tuple)


def test_classes_have_signatures_and_help_shows_them():
    assert str(inspect.signature(tw.Publisher)).startswith("(name, *, depth=8, on_full='block'")
    assert str(inspect.signature(tw.Subscriber)) == (
        "(name, *, connect=None, token=None, keepalive=10.0, max_message_bytes=17179869184, device=None)")
    assert str(inspect.signature(tw.empty)) == "(shape, dtype='float32', order='C', *, device=None, pinned=False)"
    assert str(inspect.signature(tw.Tensor.slice)) == "(self, /, dim, start=None, stop=None, step=1)"
    text = pydoc.render_doc(tw.empty, renderer=pydoc.plaintext)
    assert "empty(shape, dtype='float32', order='C', *, device=None, pinned=False)" in text
    assert "uninitialised tensor" in text


def test_signed_wrappers_forward_arguments_and_errors_unchanged():
    t = tw.asarray(np.arange(12.0).reshape(3, 4))
    assert t.reshape(4, 3).shape == (4, 3) and t.reshape((2, 6)).shape == (2, 6)
    assert t.slice(1, 1, None, 2).shape == (3, 2) and t.slice(dim=0, start=1).shape == (2, 4)
    assert t.permute(1, 0).shape == (4, 3) and t.permute((1, 0)).strides == (1, 4)
    assert tw.empty(shape=(2, 3), dtype="int8", order="F").strides == (1, 2)
    assert tw.zeros((2,), tw.float64).tolist() == [0.0, 0.0]
    with pytest.raises(TypeError, match="unexpected keyword|incompatible"):
        t.reshape(shape=(4, 3))
    with pytest.raises(ValueError, match=r"tensorwire\.Tensor\.reshape"):
        t.reshape(5)
    with pytest.raises(TypeError):
        tw.empty()
    # many arguments: more than the trampoline's on-stack buffer
    with pytest.raises((TypeError, ValueError)):
        t.reshape(*([1] * 40))
    assert t.view(*([1] * 20), 12).ndim == 21


def test_every_public_function_method_and_property_has_a_docstring():
    missing = []
    for n in tw.__all__:
        o = getattr(tw, n)
        if inspect.isclass(o):
            if len((o.__doc__ or "").strip()) < 20:
                missing.append(n)
            for a, v in vars(o).items():
                if a.startswith("_") and a != "__init__":
                    continue
                if isinstance(v, property) or callable(v) or hasattr(v, "__get__"):
                    # a leading signature line ("close(self) -> None", nanobind's "(self) -> int") is not documentation
                    d = re.sub(r"^\w*\(.*?\)( -> [^\n]*)?\n*", "", (v.__doc__ or "").strip(), count=1).strip()
                    if len(d) < 10:
                        missing.append(f"{n}.{a}")
        elif callable(o) and len((o.__doc__ or "").strip()) < 20:
            missing.append(n)
    assert not missing, f"public names without a docstring: {missing}"


def test_wrapped_functions_are_builtin_functions_of_the_package():
    assert repr(tw.asarray) == "<built-in function asarray>"
    assert tw.asarray.__module__ == "tensorwire" and tw.asarray.__qualname__ == "asarray"
    assert pickle.loads(pickle.dumps(tw.empty)) is tw.empty
    assert "built-in function" in pydoc.render_doc(tw.empty, renderer=pydoc.plaintext)


def test_install_is_idempotent():
    before = (tw.asarray, tw.Tensor.reshape, len(_signatures.FUNCTIONS))
    _signatures.install(vars(tw))
    assert (tw.asarray, tw.Tensor.reshape, len(_signatures.FUNCTIONS)) == before


def test_text_signatures_show_non_literal_defaults_as_ellipsis():
    class Fake:
        __nb_signature__ = (("def f(a: int = \\0, b: object = \\1, *, c: float = \\2) -> None", None,
                             (3, object(), float("inf"))),)
    assert _signatures.text_signature(Fake(), method=False) == "(a=3, b=..., *, c=...)"


def test_the_typed_usage_example_runs():
    # test_readme.py type-checks typed_usage.py with mypy --strict; running it proves the stub's claims are true.
    import runpy
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "typed_usage.py"))["main"]()


def test_the_future_import_leaves_no_public_name():
    # (tw.annotations, tw.cuda.annotations, tensorwire.torch.annotations: __future__'s feature object)
    import tensorwire.cuda
    import tensorwire.torch

    for mod in (tw, tensorwire.cuda, tensorwire.torch):
        assert not hasattr(mod, "annotations"), mod.__name__
