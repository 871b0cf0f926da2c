"""Arrow interop: tensors as Arrow arrays and back, zero-copy, through the Arrow PyCapsule interface.

- ``tw.to_arrow(x, *, copy=None, dim_names=None)`` -> ``tw.ArrowTensorArray`` (``pa.array()``, nanoarrow and any
  PyCapsule consumer take it): ``arrow.fixed_shape_tensor`` for rank >= 2 (rows first; dense permuted layouts are
  exported as they are, with ``permutation``), a primitive array for rank 1, ``arrow.bool8`` for bool, and
  ``arrow.variable_shape_tensor`` for a list of tensors.
- ``tw.from_arrow(obj, *, copy=None)`` -> a Tensor, a list of Tensors (variable shapes) or a dict of columns (record
  batches, tables).
- ``tw.asarray(obj)`` accepts Arrow arrays and chunked arrays of one column (a table or a record batch, even of one
  column, goes through ``tw.from_arrow``, which returns a dict of columns).
- ``Tensor.__arrow_c_array__`` exports a tensor directly; layouts Arrow cannot describe are copied (the protocol
  has no copy argument: use ``tw.to_arrow(t, copy=False)`` to refuse instead).

A tensor's metadata travels in the field metadata under the key ``"tensorwire.metadata"`` (``METADATA_KEY``).
"""

from __future__ import annotations

from ._tensorwire import ArrowTensorArray, from_arrow, to_arrow

#: Field-metadata key under which a tensor's metadata travels (tensorwire's binary metadata encoding).
METADATA_KEY = "tensorwire.metadata"

__all__ = ["ArrowTensorArray", "to_arrow", "from_arrow", "METADATA_KEY"]
