"""Error messages a Python user reads name Python things and say what to do (review of issues 11-14): C++ class
prefixes become tensorwire.<Class>.<method> or go, and metadata refusals name the type and the remedy."""

from __future__ import annotations

import datetime
import enum
import os

import numpy as np
import pytest

import tensorwire as tw


@pytest.fixture
def t():
    return tw.asarray(np.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize(
    "value, match",
    [
        (np.longdouble(1.5), r"is a NumPy float128 value, which has no metadata type; store float\(x\)"),
        (np.array(np.longdouble(1.5)), r"NumPy float128 value.*store float\(x\)"),
        (np.ma.masked_array([[1]]), r"is a NumPy array of shape \(1, 1\); store a.tolist\(\)"),
        (np.complex64(1j), r"store \[x.real, x.imag\]"),
        (np.datetime64("2024-01-01"), r"store str\(x\) or an int count of its unit"),
        (datetime.timedelta(seconds=3), r"is a datetime.timedelta.*x.total_seconds\(\)"),
        (enum.Enum("Color", "RED").RED, r"is an enum member \(<Color.RED: 1>\).*store its .value or .name"),
        (object(), r"is of type object; values must be None, bool, int"),
    ],
    ids=["longdouble", "longdouble-0d", "masked-array", "complex", "datetime64", "timedelta", "enum", "object"],
)
def test_metadata_refusals_name_the_type_and_the_remedy(t, value, match):
    with pytest.raises(TypeError, match=match):
        t.metadata["k"] = value
    assert "k" not in t.metadata


def test_metadata_refusals_see_subclasses_and_qualified_names(t):
    class Stamp(datetime.datetime):  # pandas.Timestamp is such a subclass
        pass

    class Point:
        pass

    with pytest.raises(TypeError, match=r"is a .*Stamp, which has no metadata type; store x.isoformat\(\)"):
        t.metadata["when"] = Stamp(2024, 1, 1)
    with pytest.raises(TypeError, match=r"is of type test_messages\..*Point; values must be"):
        t.metadata["p"] = Point()
    with pytest.raises(TypeError, match=r"has a key of type int; dict keys must be str"):
        t.metadata["d"] = {1: 2}
    with pytest.raises(ValueError, match=r"\['s'\] is a str that is not valid Unicode text.*store bytes instead"):
        t.metadata["s"] = os.fsdecode(b"\xff")
    t.metadata["ok"] = np.float32(1.5)  # NumPy scalars that have a Python type are stored as it
    assert t.metadata["ok"] == 1.5 and type(t.metadata["ok"]) is float


def test_errors_name_the_python_method_the_user_called(t):
    cases = [
        (lambda: t[5], IndexError, r"^tensorwire\.Tensor\.__getitem__: index 5 is out of range"),
        (lambda: t.expand(3, 3), ValueError, r"^tensorwire\.Tensor\.expand: cannot expand"),
        (lambda: t.reshape(5), ValueError, r"^tensorwire\.Tensor\.reshape: "),
    ]
    sub = tw.Subscriber(f"msg-{os.getpid()}")
    sub.close()
    cases.append((sub.fileno, ValueError, r"^tensorwire\.Subscriber\.fileno: the subscriber is closed"))
    for f, exc, msg in cases:
        with pytest.raises(exc, match=msg) as info:
            f()
        assert "::" not in str(info.value)


def test_internal_cpp_prefixes_are_dropped():
    # tw::copy (reached through a dtype-changing copy into an existing tensor) has no Python name.
    from tensorwire import _tensorwire as ext

    assert ext._python_message("tw::copy: shapes differ") == "shapes differ"
    assert ext._python_message("Buffer::allocate: out of memory") == "out of memory"
    assert ext._python_message("Tensor::make: bad") == "bad"
    assert ext._python_message("Tensor::select: x") == "tensorwire.Tensor.select: x"
    assert ext._python_message("Subscriber('a')::recv: x") == "tensorwire.Subscriber('a').recv: x"
    assert ext._python_message("Publisher::send on 'a' timed out") == "tensorwire.Publisher.send on 'a' timed out"
    assert ext._python_message("a plain message: with a colon") == "a plain message: with a colon"
