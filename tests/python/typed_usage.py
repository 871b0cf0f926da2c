"""Ordinary user code that must pass `mypy --strict` against tensorwire's stub AND run: the stub's claims checked by
executing them (test_readme.py type-checks this file; test_signatures.py runs it)."""

from __future__ import annotations

import os

import numpy as np

import tensorwire as tw


def main() -> None:
    t = tw.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    rows = [row.shape for row in t]  # Tensor.__iter__
    assert rows == [(4,)] * 3
    a = tw.to_arrow(t, dim_names=("w",))
    n: int = len(a)
    names = a.dim_names
    assert names is not None and names + ("extra",) == ("w", "extra") and n == 3
    assert a.dtype == tw.float32 and a.device == tw.Device("cpu") and a.type_name == "arrow.fixed_shape_tensor"
    assert a.data.shape == (3, 4)
    schema, array = t.__arrow_c_array__()
    assert schema is not None and array is not None
    assert "asarray" in tw.__all__
    u = tw.asarray(np.zeros(3), stream=None)
    assert u.shape == (3,)
    name = f"typed-usage-{os.getpid()}"
    with tw.Publisher(name) as pub:
        one: tw.Tensor = pub.loan([2, 3], "uint8")  # a list of ints is one shape
        assert one.shape == (2, 3)
        several: list[tw.Tensor] = pub.loan([(2,), (3,)], "uint8")
        assert [x.shape for x in several] == [(2,), (3,)]
        pair: tuple[tw.Tensor, ...] = pub.loan(((2,), ((4,), "int16")))
        assert [x.shape for x in pair] == [(2,), (4,)] and pair[1].dtype == tw.int16
        named: dict[str, tw.Tensor] = pub.loan({"a": 2, "b": ((1, 2), "float64")})
        assert named["b"].dtype == tw.float64


if __name__ == "__main__":
    main()
    print("typed usage ok")
