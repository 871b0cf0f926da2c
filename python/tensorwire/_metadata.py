"""The live metadata mapping of a tensor."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from ._tensorwire import Tensor as _Tensor


class Metadata(MutableMapping):
    """A live view of a tensor's metadata: writes go straight to the tensor.

    Keys are str; values are None, bool, int (64-bit), float, str, bytes, and lists, tuples and dicts of these
    (dict keys str). NumPy scalars and 0-d arrays are stored as the matching Python value (their .item()).
    Anything else raises TypeError on assignment, naming what to store instead (datetime: isoformat(); enums:
    .value or .name; arrays: tolist()). Reads return fresh Python objects, so mutate
    a nested value by assigning it back (``m["boxes"] = m["boxes"] + [b]``).
    """

    __slots__ = ("_t",)

    def __init__(self, tensor) -> None:
        """The metadata of `tensor` (normally reached as ``t.metadata``)."""
        if type(tensor) is not _Tensor and not isinstance(tensor, _Tensor):
            # (it failed later, at the first read, with "'int' object has no attribute '_meta_keys'")
            raise TypeError(
                f"tensorwire.Metadata(tensor) is the live metadata of a tensorwire.Tensor (reach it as t.metadata), "
                f"not of a {type(tensor).__name__}; to attach metadata, assign a dict: t.metadata = {{...}}"
            )
        self._t = tensor

    def __getitem__(self, key: str) -> Any:
        return self._t._meta_get(key) if isinstance(key, str) else self._missing(key)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key`, or `default` when the tensor's metadata has no such key."""
        return self._t._meta_get_or(key, default) if isinstance(key, str) else default

    def __setitem__(self, key: str, value: Any) -> None:
        self._t._meta_set(key, value)

    def __delitem__(self, key: str) -> None:
        if not isinstance(key, str):
            raise KeyError(key)
        self._t._meta_del(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._t._meta_keys())

    def __len__(self) -> int:
        return self._t._meta_len()

    def __contains__(self, key: object) -> bool:
        return self._t._meta_contains(key)

    def clear(self) -> None:
        """Remove every key from the tensor's metadata."""
        self._t._meta_clear()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Metadata):
            return dict(self.items()) == dict(other.items())
        if isinstance(other, dict):
            return dict(self.items()) == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"tensorwire.Metadata({dict(self.items())!r})"

    @staticmethod
    def _missing(key: object):
        raise KeyError(key)
