"""tensorwire.torch — the PyTorch adapter.

Tensor subclasses (torchvision's TVTensors, users' own) and their attributes survive pinning, collation, DataLoader
workers and tensorwire's transports; custom ops get C-contiguous inputs from tensorwire's copy engine.

    import tensorwire.torch as twt
    batch = twt.pin(batch)                         # nested containers; subclasses and attributes kept
    loader = twt.DataLoader(ds, batch_size=32, num_workers=2, pin_memory=True)
    pub.send(boxes); twt.to_torch(sub.recv())      # a BoundingBoxes arrives as a BoundingBoxes
    @twt.contiguous_inputs
    def my_op(x, w): ...

How a subclass is described
---------------------------
Inside one program (pin, collate, the DataLoader's own workers) a subclass instance is rebuilt from its class and a
shallow copy of its ``__dict__``: no registration needed. Across a transport (``tw.asarray`` of a subclass instance,
hence ``Publisher.send``, pickling a ``tw.Tensor``) the description travels in the tensor's metadata under
``METADATA_KEY`` (``"tensorwire.torch"``)::

    {"type": "torchvision.tv_tensors._bounding_boxes.BoundingBoxes",   # the registered name
     "attrs": {"format": "XYXY", "canvas_size": [480, 640], "clamping_mode": "soft"},
     "registered": True,
     "shape": [3, 4],                   # a view of another shape converts to a plain tensor
     "order": [0, 1],                   # dimensions by stride: a transposed or flipped view converts to plain too
     "unencoded": ["source"]}           # only when some attribute could not travel (below)

``to_torch`` rebuilds only registered types (``register_subclass``): a peer's message never makes tensorwire import
or construct anything else. An unknown type arrives as a plain ``torch.Tensor``, and the tensorwire tensor keeps
the description in ``t.metadata[METADATA_KEY]``.

Describing never makes ``tw.asarray`` fail. An attribute that cannot travel (not JSON-like; one a TVTensor's codec
does not know; past the first 16 KiB of encoded attributes; or every attribute, when a registered
``encode`` raises) is sent as its ``repr`` (cut to 200 characters), its name listed under ``"unencoded"``; for a
registered type a warning names it and the remedy (``register_subclass(cls, encode=..., decode=...)``). A receiver
never passes those placeholders to ``decode``: the instance is rebuilt without them, or, when ``decode`` needs one,
``to_torch`` raises a ValueError naming the type and the attribute.
"""

from __future__ import annotations

import collections.abc
import copy as _copy
import dataclasses
import enum
import functools
import inspect
import sys
import threading
import warnings
from typing import Any, Callable, TypeVar

import torch
import torch.autograd.forward_ad as _fw_ad
import torch.utils.data
from torch.utils.data._utils.collate import collate as _torch_collate
from torch.utils.data._utils.collate import default_collate_fn_map as _default_collate_fn_map

from . import _tensorwire as _ext
from ._tensorwire import CopyError, asarray
from ._exporters import check_copy, check_torch_device, torch_from_dlpack as _torch_from_dlpack

_is_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor",
                                lambda x: False)

__all__ = [
    "METADATA_KEY",
    "register_subclass",
    "unregister_subclass",
    "registered_subclasses",
    "describe",
    "to_torch",
    "from_torch",
    "pin",
    "collate",
    "contiguous",
    "contiguous_inputs",
    "DataLoader",
]

METADATA_KEY = "tensorwire.torch"
_MAX_ATTRS_BYTES = 16 * 1024  # a description's encoded attributes: the rest travel as "unencoded" (see the module doc)

# ---- the registry -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Codec:
    cls: type
    name: str
    encode: Callable[[torch.Tensor], dict]
    decode: Callable[[torch.Tensor, dict], torch.Tensor]
    # True when encode returns the attributes it knows and the instance's other __dict__ entries are to be listed
    # under "unencoded" (TVTensors); a user's encode may rename attributes, so nothing is inferred for it.
    lists_others: bool = False


_lock = threading.RLock()
_by_cls: dict[type, _Codec] = {}
_by_name: dict[str, _Codec] = {}
_builtins_done = False


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_subclass(cls: object, what: str) -> type:
    if not isinstance(cls, type) or not issubclass(cls, torch.Tensor) or cls is torch.Tensor:
        raise TypeError(f"{what}: expected a subclass of torch.Tensor, got {cls!r}")
    return cls


_Sub = TypeVar("_Sub", bound=torch.Tensor)


def register_subclass(
    cls: type[_Sub],
    encode: Callable[[_Sub], dict[str, Any]] | None = None,
    decode: Callable[[torch.Tensor, dict[str, Any]], _Sub] | None = None,
    *,
    name: str | None = None,
) -> type[_Sub]:
    """Register a torch.Tensor subclass so that it crosses tensorwire's transports as itself.

    ``encode(x) -> dict`` returns x's attributes as JSON-like values (None, bool, int, float, str, bytes, lists and
    str-keyed dicts of these); ``decode(plain_tensor, attrs) -> instance`` rebuilds it without copying the data.
    Both default to the instance's ``__dict__`` (``plain.as_subclass(cls)`` plus the attributes). ``name`` is what
    travels (default ``module.qualname``); a receiver rebuilds only names registered in its own process. Registering
    a class again replaces its codec; another class under a taken name raises ValueError. Returns cls (so it works
    as a class decorator).
    """
    _check_subclass(cls, "register_subclass")
    for f, what in ((encode, "encode"), (decode, "decode")):
        if f is not None and not callable(f):
            raise TypeError(f"register_subclass: {what} must be callable, not {type(f).__name__}")
    n = _type_name(cls) if name is None else name
    if not isinstance(n, str):
        raise TypeError(f"register_subclass: name must be a str, not {type(n).__name__}")
    if not n:
        raise ValueError(f"register_subclass: the name of {cls.__qualname__} must be a non-empty str")
    codec = _Codec(cls, n, encode or _encode_dict, decode or functools.partial(_decode_dict, cls))
    with _lock:
        other = _by_name.get(n)
        if other is not None and other.cls is not cls:
            raise ValueError(f"register_subclass: the name {n!r} is taken by {other.cls!r}")
        old = _by_cls.pop(cls, None)
        if old is not None:
            _by_name.pop(old.name, None)
        _by_cls[cls] = codec
        _by_name[n] = codec
    return cls


def unregister_subclass(cls: type) -> None:
    """Forget cls (KeyError when it is not registered)."""
    with _lock:
        _ensure_builtins()
        codec = _by_cls.pop(cls, None)
        if codec is None:
            raise KeyError(f"unregister_subclass: {cls!r} is not registered")
        _by_name.pop(codec.name, None)


def registered_subclasses() -> dict[str, type]:
    """The registered names and their classes (torchvision's TVTensors among them once torchvision is imported)."""
    with _lock:
        _ensure_builtins()
        return {n: c.cls for n, c in _by_name.items()}


def _lookup_cls(cls: type) -> _Codec | None:
    if not _builtins_done:
        _ensure_builtins()
    return _by_cls.get(cls)


def _lookup_name(name: str) -> _Codec | None:
    if not _builtins_done:
        _ensure_builtins()
    return _by_name.get(name)


# ---- JSON-like checks and the default codec -----------------------------------------------------------------------

_MAX_DEPTH = 32
_MAX_REPR = 200  # an unencodable attribute travels as its repr, cut to this many characters


def _wire_size(v: Any, limit: float = float("inf"), depth: int = 0) -> int | None:
    """The bytes v takes in tensorwire's metadata encoding (a tag, 8-byte scalars, 4-byte lengths), or None when it
    is not JSON-like (or is a str that is not valid UTF-8, which the encoding refuses). Stops counting, returning a
    number above limit, once limit is passed."""
    t = type(v)
    if v is None or t is bool:
        return 1
    if t is int:
        return 9 if -(2**63) <= v < 2**63 else None
    if t is float:
        return 9
    if t is str:
        try:
            return 5 + len(v.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate
            return None
    if t is bytes:
        return 5 + len(v)
    if depth >= _MAX_DEPTH or not isinstance(v, (list, tuple, dict)):
        return None
    n = 5
    pairs = v.items() if isinstance(v, dict) else ((None, x) for x in v)
    for k, x in pairs:
        if k is not None:
            ks = _key_size(k)
            if ks is None:
                return None
            n += ks
        m = _wire_size(x, limit - n, depth + 1)
        if m is None:
            return None
        n += m
        if n > limit:
            return n
    return n


def _key_size(k: Any) -> int | None:
    """A dict key's bytes in the encoding (a 4-byte length and UTF-8, no tag), or None when it cannot be one."""
    if not isinstance(k, str):
        return None
    try:
        return 4 + len(k.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _encode_dict(x: torch.Tensor) -> dict:
    """The default encode: the instance's __dict__ (describe lists what cannot travel under "unencoded")."""
    return {k: v for k, v in (getattr(x, "__dict__", None) or {}).items() if isinstance(k, str)}


def _decode_dict(cls: type, plain: torch.Tensor, attrs: dict) -> torch.Tensor:
    if not isinstance(attrs, dict):
        raise TypeError(f"attributes of a {_type_name(cls)} must be a dict, not {type(attrs).__name__}")
    for k in attrs:
        # a peer chooses these names: never let one shadow a method or a special attribute
        if not isinstance(k, str) or k.startswith("__") or hasattr(cls, k):
            raise ValueError(f"{_type_name(cls)}: attribute name {k!r} in a message is not allowed")
    y = plain.as_subclass(cls)
    y.__dict__.update(attrs)
    return y


def _short_repr(v: Any) -> str:
    try:
        r = repr(v)
    except Exception as e:  # a broken __repr__ must not break a send
        r = f"<unrepresentable: {type(e).__name__}>"
    if len(r) > _MAX_REPR:
        r = r[: _MAX_REPR - 3] + "..."
    return r.encode("utf-8", "backslashreplace").decode("utf-8")  # a repr may hold lone surrogates


def _fit(items: list[tuple[Any, Any]], forced: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """Splits (name, value) pairs into the attributes that travel encoded (JSON-like, within _MAX_ATTRS_BYTES) and
    the unencoded ones, name -> why; an unencoded attribute travels as its repr while the budget lasts."""
    attrs: dict = {}
    why: dict[str, str] = {}
    rest: list[tuple[str, Any, int]] = []
    used = 5
    for k, v in items:
        ks = _key_size(k)
        if ks is None:
            continue  # no name to list it under
        if isinstance(v, enum.Enum):
            v = v.name
        if k in forced:
            why[k] = forced[k]
            rest.append((k, v, ks))
            continue
        size = _wire_size(v, _MAX_ATTRS_BYTES - used)
        if size is None:
            why[k] = "not JSON-like"
        elif used + size + ks > _MAX_ATTRS_BYTES:
            why[k] = f"past the {_MAX_ATTRS_BYTES // 1024} KiB a description's attributes may take"
        else:
            attrs[k] = v
            used += size + ks
            continue
        rest.append((k, v, ks))
    for k, v, ks in rest:
        r = _short_repr(v)
        size = 5 + len(r.encode("utf-8")) + ks
        if used + size <= _MAX_ATTRS_BYTES:  # else only the name travels
            attrs[k] = r
            used += size
    return attrs, why


def describe(x: torch.Tensor) -> dict | None:
    """The description of x's subclass that tensorwire's transports carry (see the module doc), or None for a plain
    torch.Tensor or a torch.nn.Parameter. It records x's shape: a view of a different shape (which carries a copy of
    the metadata) converts back to a plain tensor, never to a subclass instance of the wrong shape. It never raises
    for an attribute: what cannot travel is listed under "unencoded" (with a warning for a registered type)."""
    cls = type(x)
    if cls is torch.Tensor or not isinstance(x, torch.Tensor) or issubclass(cls, torch.nn.Parameter):
        return None
    d = {k: v for k, v in (getattr(x, "__dict__", None) or {}).items() if isinstance(k, str)}
    codec = _lookup_cls(cls)
    if codec is None:
        attrs, why = _fit(list(d.items()), {})
        desc: dict = {"type": _type_name(cls), "attrs": attrs, "registered": False, "shape": list(x.shape)}
    else:
        forced: dict[str, str] = {}
        failed = ""
        try:
            enc = codec.encode(x)
            if not isinstance(enc, dict):
                raise TypeError(f"it returned {type(enc).__name__}, not a dict")
            items = list(enc.items())
            if codec.lists_others:
                forced = {k: "not carried by its codec" for k in d if k not in enc}
                items += [(k, d[k]) for k in forced]
        except Exception as e:  # the user's encode: its failure must not fail the send
            failed = f"its encode function failed: {type(e).__name__}: {e}"
            items = list(d.items())
            forced = {k: failed for k in d}
        attrs, why = _fit(items, forced)
        desc = {"type": codec.name, "attrs": attrs, "registered": True, "shape": list(x.shape)}
        if why or failed:
            reasons = failed or "; ".join(f"{k}: {w}" for k, w in why.items())
            warnings.warn(
                f"tensorwire.torch: {codec.name}: attribute(s) {', '.join(sorted(why)) or '(none)'} cannot travel in "
                f"the tensor's metadata ({reasons}); they are sent as their repr, listed under \"unencoded\", and a "
                f"receiver rebuilds the instance without them. To carry them, register_subclass({cls.__name__}, "
                f"encode=..., decode=...) with an encode that returns them as small JSON-like values.",
                stacklevel=2,
            )
    if x.ndim >= 2:
        desc["order"] = _dim_order(x.shape, x.stride())
    if why:
        desc["unencoded"] = sorted(why)
    return desc


def _dim_order(shape: Any, strides: Any) -> list[int]:
    """The dimensions of extent > 1 from the largest stride to the smallest (ties by index): what a transposed view
    of the same shape (a square box tensor's .T) changes."""
    dims = [d for d in range(len(shape)) if shape[d] > 1]
    return sorted(dims, key=lambda d: (-strides[d], d))


def _same_view(desc: dict, t: Any) -> bool:
    """Whether t (carrying desc in its metadata) shows the described tensor as it was, not a view of it that means
    something else: the same shape, no reversed dimension (the producer's torch tensor had none), and, unless t is a
    dense copy in C order (a packing transport, which keeps values in logical order), the same dimension order."""
    if desc.get("shape", list(t.shape)) != list(t.shape):
        return False
    if any(s < 0 for s, n in zip(t.strides, t.shape) if n > 1):
        return False
    order = desc.get("order")
    return order is None or t.is_contiguous() or order == _dim_order(t.shape, t.strides)


def _describe_for_transport(x: torch.Tensor) -> dict | None:
    """The hook tw.asarray calls for a torch.Tensor subclass instance: describe(x), and never an exception (tw.asarray
    must not fail because a description did)."""
    try:
        return describe(x)
    except Exception as e:
        warnings.warn(
            f"tensorwire.torch: describing a {_type_name(type(x))} failed ({type(e).__name__}: {e}); it travels as a "
            f"plain tensor. register_subclass({type(x).__name__}, encode=..., decode=...) to control what travels.",
            stacklevel=2,
        )
        return None


# ---- in-process state: class + attributes, no encoding -------------------------------------------------------------


def _plain(x: torch.Tensor) -> torch.Tensor:
    if type(x) is torch.Tensor:
        return x
    # The default __torch_function__ re-wraps results as the subclass; as_subclass with it disabled does not.
    with torch._C.DisableTorchFunctionSubclass():
        return x.as_subclass(torch.Tensor)


def _state(x: torch.Tensor) -> tuple[type, Any]:
    cls = type(x)
    if cls is torch.Tensor:
        return cls, None
    d = getattr(x, "__dict__", None)
    attrs = dict(d) if d else {}
    if not attrs:  # state outside __dict__ (or none): a registered codec knows how to carry it
        codec = _lookup_cls(cls)
        if codec is not None:
            return cls, ("codec", codec.encode(x), attrs)
    return cls, ("dict", attrs)


def _rewrap(plain: torch.Tensor, cls: type, state: Any) -> torch.Tensor:
    if cls is torch.Tensor or state is None:
        return plain
    if state[0] == "codec":
        codec = _lookup_cls(cls)
        if codec is not None:
            return codec.decode(plain, state[1])
    attrs = state[-1]  # no codec here (a worker registered it, this process did not): the instance's __dict__
    y = plain.as_subclass(cls)
    if attrs:
        y.__dict__.update(attrs)
    return y


def _same_state(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # attributes whose == is not a bool (tensors): not provably equal
        return False


# ---- torchvision ---------------------------------------------------------------------------------------------------


def _ensure_builtins() -> None:
    """Registers torchvision's TVTensors once torchvision.tv_tensors has been imported (never imports it)."""
    global _builtins_done
    if _builtins_done:
        return
    tv = sys.modules.get("torchvision.tv_tensors")
    if tv is None or not hasattr(tv, "TVTensor"):
        return
    with _lock:
        if _builtins_done:
            return
        for cls_name in ("Image", "Video", "Mask", "BoundingBoxes", "KeyPoints"):
            cls = getattr(tv, cls_name, None)
            if isinstance(cls, type) and cls not in _by_cls:
                codec = _Codec(cls, _type_name(cls), _tv_encode, functools.partial(_tv_decode, tv, cls), True)
                _by_cls[cls] = codec
                _by_name.setdefault(codec.name, codec)
        _builtins_done = True


_TV_ATTRS = ("format", "canvas_size", "clamping_mode")  # what _tv_decode validates; nothing else travels


def _tv_encode(x: torch.Tensor) -> dict:
    """The TVTensor attributes _tv_decode knows, as JSON-like values where they are the expected kinds (describe
    lists the rest, and any that is not JSON-like, under "unencoded")."""
    d = getattr(x, "__dict__", None) or {}
    out: dict = {}
    for k in _TV_ATTRS:
        if k in d:
            v = d[k]
            out[k] = v.name if isinstance(v, enum.Enum) else list(v) if isinstance(v, tuple) else v
    return out


# Coordinates per box of torchvision's BoundingBoxFormat members other than the 4 of XYXY, XYWH and CXCYWH.
_BOX_COORDINATES = {"XYWHR": 5, "CXCYWHR": 5, "XYXYXYXY": 8}


def _tv_decode(tv: Any, cls: type, plain: torch.Tensor, attrs: dict) -> torch.Tensor:
    """Rebuilds a TVTensor from a message's attributes, validating each: a peer chooses these values."""
    if not isinstance(attrs, dict):
        raise TypeError(f"attributes of a {cls.__name__} must be a dict, not {type(attrs).__name__}")
    name = cls.__name__
    required = {"BoundingBoxes": ("format", "canvas_size"), "KeyPoints": ("canvas_size",)}.get(name, ())
    missing = [k for k in required if k not in attrs]
    if missing:
        raise ValueError(f"{name}: the message lacks {', '.join(missing)}")
    last = {"BoundingBoxes": 4, "KeyPoints": 2}.get(name)
    if name == "BoundingBoxes" and isinstance(attrs.get("format"), str):  # rotated formats have 5 or 8 coordinates
        last = _BOX_COORDINATES.get(attrs["format"], 4)
    if last is not None and (plain.ndim < 1 or plain.shape[-1] != last):
        raise ValueError(f"{name}: a tensor of shape {tuple(plain.shape)} (the last dimension must be {last})")
    y = plain.as_subclass(cls)
    for k, v in attrs.items():
        if k == "format":
            fmt = getattr(tv, "BoundingBoxFormat", None)
            if fmt is None or not isinstance(v, str) or v not in fmt.__members__:
                raise ValueError(f"{cls.__name__}.format: {v!r} is not a BoundingBoxFormat")
            y.format = fmt[v]
        elif k == "canvas_size":
            if (
                not isinstance(v, (list, tuple))
                or len(v) != 2
                or not all(type(i) is int and 0 <= i < 2**31 for i in v)
            ):
                raise ValueError(f"{cls.__name__}.canvas_size: {v!r} is not a pair of non-negative ints")
            y.canvas_size = (v[0], v[1])
        elif k == "clamping_mode":
            if v not in (None, "soft", "hard"):
                raise ValueError(f"{cls.__name__}.clamping_mode: {v!r} is not 'soft', 'hard' or None")
            y.clamping_mode = v
        else:
            raise ValueError(f"{cls.__name__}: unknown attribute {k!r} in a message")
    # An attribute this torchvision has and the sender's did not send (clamping_mode, new in 0.23): the value its
    # constructor gives by default, as it would have here; without it the object breaks at its first use.
    for k, default in _tv_defaults(cls).items():
        if k not in attrs:
            setattr(y, k, default)
    return y


@functools.lru_cache(maxsize=None)
def _tv_defaults(cls: type) -> dict:
    """The defaults of cls's constructor for the attributes _tv_decode knows."""
    try:
        params = inspect.signature(cls.__new__).parameters
    except (TypeError, ValueError):
        return {}
    return {k: p.default for k, p in params.items() if k in _TV_ATTRS and p.default is not inspect.Parameter.empty}


# ---- conversions ---------------------------------------------------------------------------------------------------

_readonly_warned = False


def _tree_map(obj: Any, leaf: Callable[[Any], Any], is_leaf: Callable[[Any], bool]) -> Any:
    if is_leaf(obj):
        return leaf(obj)
    if isinstance(obj, (str, bytes, bytearray)):
        return obj
    if isinstance(obj, collections.abc.Mapping):
        items = {k: _tree_map(v, leaf, is_leaf) for k, v in obj.items()}
        if type(obj) is dict:
            return items
        try:
            new = _copy.copy(obj)
            new.update(items)  # keeps OrderedDict / defaultdict / user mappings' own type and state
            return new
        except Exception:
            return items
    if isinstance(obj, tuple):
        vals = [_tree_map(v, leaf, is_leaf) for v in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*vals)
        if type(obj) is tuple:
            return tuple(vals)
        for build in (lambda: type(obj)(vals), lambda: type(obj)(*vals)):  # (a tuple subclass's own constructor)
            try:
                new = build()
            except TypeError:
                continue
            # (a constructor taking *items accepts the list too, as its one item: that is not the tuple)
            if len(new) == len(vals) and not (len(new) == 1 and new[0] is vals):
                return new
        return vals  # neither: a list, as torch's default_collate falls back to
    if isinstance(obj, list):
        vals = [_tree_map(v, leaf, is_leaf) for v in obj]
        if type(obj) is list:
            return vals
        try:
            new = _copy.copy(obj)
            new[:] = vals
            return new
        except Exception:
            return vals
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = _copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(new, f.name, _tree_map(getattr(obj, f.name), leaf, is_leaf))
        return new
    return obj


def _to_torch_one(t: Any, copy: bool | None) -> torch.Tensor:
    global _readonly_warned
    if isinstance(t, torch.Tensor):
        if copy:
            cls, state = _state(t)
            return _rewrap(_plain(t).clone(), cls, state)
        return t
    t = asarray(t, copy=False if copy is False else None)  # (copy=False forbids a copy on the way in too)
    check_torch_device(t, "tensorwire.torch.to_torch")
    desc = t.metadata[METADATA_KEY] if METADATA_KEY in t.metadata else None
    shape_ok = isinstance(desc, dict) and _same_view(desc, t)  # (t before a copy PyTorch's strides may need)
    needs = None
    if any(s < 0 for s, n in zip(t.strides, t.shape) if n > 1):
        needs = f"negative strides {t.strides} (PyTorch refuses them)"
    if copy is True or needs is not None:
        if copy is False:
            raise CopyError(f"to_torch: PyTorch cannot take this layout ({needs}) and copy=False forbids the copy")
        t = t.copy(order="any")  # (a dense layout's order kept, as torch's clone() keeps a memory format)
    elif t.readonly and not _readonly_warned:
        _readonly_warned = True
        warnings.warn(
            "tensorwire.torch.to_torch: the tensor is read-only (a received message, or a read-only producer) and "
            "PyTorch has no read-only tensors; the result shares its memory, so do not write into it: an in-place "
            "op on a received tensor's read-only mapping is a segmentation fault (clone() it first, or pass "
            "copy=True). This warning is shown once.",
            stacklevel=3,
        )
    x = _torch_from_dlpack(t, "tensorwire.torch.to_torch")
    if shape_ok and isinstance(desc.get("type"), str):
        codec = _lookup_name(desc["type"])
        if codec is not None:
            attrs, unencoded = _received_attrs(desc)
            try:
                y = codec.decode(x, attrs)
            except Exception as e:
                why = f"the attribute {e.args[0]!r} is missing" if isinstance(e, KeyError) and e.args else str(e)
                if unencoded:
                    why += (
                        f" (the sender could not encode {', '.join(unencoded)}: listed under \"unencoded\", they are "
                        f"not passed to decode)"
                    )
                what = f"to_torch: rebuilding a {desc['type']} from the tensor's metadata failed"
                raise ValueError(f"{what}: {why}") from e
            if not isinstance(y, codec.cls):
                raise TypeError(f"to_torch: the decode function of {codec.name} returned {type(y).__name__}")
            return y
    return x


def _received_attrs(desc: Any) -> tuple[Any, list[str]]:
    """A description's attributes for decode, without the "unencoded" placeholders (reprs, not values)."""
    attrs = desc.get("attrs", {})
    unencoded = desc.get("unencoded", [])
    if not isinstance(unencoded, (list, tuple)) or not all(isinstance(n, str) for n in unencoded):
        raise ValueError(
            f"to_torch: the description of a {desc['type']} is malformed: \"unencoded\" must be a list of attribute "
            f"names, not {_short_repr(unencoded)}"
        )
    if isinstance(attrs, dict) and unencoded:
        skip = set(unencoded)
        attrs = {k: v for k, v in attrs.items() if k not in skip}
    return attrs, list(unencoded)


def to_torch(t: Any, *, copy: bool | None = None) -> Any:
    """A tensorwire tensor (or anything tw.asarray takes; or a dict / list / tuple of them, as Subscriber.recv
    returns) as torch tensors, zero-copy, with registered subclasses rebuilt from the metadata (see the module doc).

    Read-only tensors (received messages) are shared too, as torch.from_numpy shares a read-only array: do not
    write into the result (a one-time warning says so); copy=True gives a private, writable copy. Negative strides,
    which PyTorch refuses, are copied, or refused with tw.CopyError under copy=False.
    """
    check_copy(copy, "to_torch")
    # A list or tuple of numbers (nested or not) is array data, as tw.asarray and tw.to_torch take it; one holding
    # tensors (or dicts) is a message, converted part by part.
    if isinstance(t, (dict, list, tuple)) and not hasattr(t, "__dlpack__") and not _numbers_only(t):
        return _tree_map(t, lambda v: _to_torch_one(v, copy), lambda v: not isinstance(v, (dict, list, tuple)))
    return _to_torch_one(t, copy)


def _numbers_only(x: Any, depth: int = 0) -> bool:
    """Whether x is a non-empty list / tuple whose leaves are all numbers (Python's or NumPy's scalars)."""
    if isinstance(x, (bool, int, float, complex)) or (type(x).__module__ == "numpy" and hasattr(x, "dtype")
                                                      and getattr(x, "ndim", 1) == 0):
        return depth > 0
    if type(x) not in (list, tuple) or depth > 64:
        return False
    return (len(x) > 0 or depth > 0) and all(_numbers_only(e, depth + 1) for e in x)


def from_torch(x: Any, *, copy: bool | None = None) -> Any:
    """A torch tensor (or a nested structure of them) as tensorwire tensors, zero-copy; a subclass instance keeps
    its description in ``t.metadata[METADATA_KEY]``. Tensors that require grad are detached (the data is shared) and
    read-only, as ``tw.asarray`` makes them: a write would change what autograd saved (wrong gradients, silently);
    ``copy=True`` gives a writable copy."""
    check_copy(copy, "from_torch")

    def one(v: torch.Tensor) -> Any:
        if v.requires_grad:
            desc = _describe_for_transport(v)
            t = asarray(_plain(v), copy=copy)  # (detached and read-only by asarray, unless copied)
            if desc is not None:
                t.metadata[METADATA_KEY] = desc
            return t
        return asarray(v, copy=copy)

    if isinstance(x, torch.Tensor):
        return one(x)
    if not isinstance(x, (dict, list, tuple)) and not dataclasses.is_dataclass(x):
        raise TypeError(f"from_torch: expected a torch.Tensor or a structure of them, got {type(x).__name__}")
    return _tree_map(x, one, lambda v: isinstance(v, torch.Tensor))


# ---- pinning -------------------------------------------------------------------------------------------------------

_pin_warned = False


def _accelerator() -> bool:
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        return bool(acc.is_available())
    return bool(torch.cuda.is_available())


def _pin_tensor(x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or x.layout != torch.strided or x.is_pinned():
        return x
    cls, state = _state(x)
    return _rewrap(_plain(x).pin_memory(), cls, state)


def _has_pin_memory(v: Any) -> bool:
    """A custom batch type that pins itself (torch's documented extension point: a pin_memory() method), which pin
    calls instead of walking into it. Containers are walked, as torch's pin_memory walks them."""
    if isinstance(v, (type, str, bytes, bytearray, collections.abc.Mapping, tuple, list)):
        return False
    return callable(getattr(v, "pin_memory", None))


def _pin_leaf(v: Any) -> Any:
    return _pin_tensor(v) if isinstance(v, torch.Tensor) else v.pin_memory()


def pin(obj: Any) -> Any:
    """Every CPU tensor in obj (a tensor, or nested dicts / lists / tuples / namedtuples / dataclasses) copied to
    pinned memory by PyTorch's pin_memory(), keeping subclasses and their attributes; an object with a pin_memory()
    method of its own (a custom batch type, as torch's DataLoader documents) is replaced by what that returns. Without
    an accelerator it does what PyTorch's DataLoader does: warns once and returns obj unchanged (calling nothing)."""
    global _pin_warned
    if not _accelerator():
        if not _pin_warned:
            _pin_warned = True
            warnings.warn(
                "tensorwire.torch.pin: no accelerator is present, so there is no pinned memory; the data is returned "
                "unpinned (as torch.utils.data.DataLoader(pin_memory=True) does). This warning is shown once.",
                stacklevel=2,
            )
        return obj
    return _tree_map(obj, _pin_leaf, lambda v: isinstance(v, torch.Tensor) or _has_pin_memory(v))


# ---- collation -----------------------------------------------------------------------------------------------------


def _collate_tensors(batch: Any, *, collate_fn_map: Any = None) -> Any:
    elem = batch[0]
    cls = type(elem)
    if cls is torch.Tensor and all(type(b) is torch.Tensor for b in batch):
        return torch.stack(list(batch), 0)
    if any(type(b) is not cls for b in batch):
        return list(batch)
    states = [_state(b)[1] for b in batch]
    if not all(b.shape == elem.shape for b in batch) or not all(_same_state(states[0], s) for s in states[1:]):
        return list(batch)
    return _rewrap(torch.stack([_plain(b) for b in batch], 0), cls, states[0])


_COLLATE_MAP: dict = {torch.Tensor: _collate_tensors}
_COLLATE_MAP.update({k: v for k, v in _default_collate_fn_map.items() if k is not torch.Tensor})


def collate(batch: Any) -> Any:
    """torch's default_collate, keeping tensor subclasses: samples of one subclass with equal attributes and equal
    shapes stack into an instance of that subclass with those attributes; otherwise (attributes or shapes differ,
    or types are mixed) that field of the batch is a list of the per-sample tensors, each keeping its type. Plain
    tensors stack as torch does (and raise as torch does when their shapes differ)."""
    return _torch_collate(batch, collate_fn_map=_COLLATE_MAP)


# ---- contiguous inputs ---------------------------------------------------------------------------------------------


# The dtypes that go torch -> tensorwire -> torch through DLPack with torch.from_dlpack. Others (float8 and float4,
# which need DLPack 1.1 where torch.from_dlpack asks for 1.0; bit and quantized types, which DLPack cannot carry)
# stay with PyTorch here. (to_torch takes float8 back through a 1.1 capsule: torch_from_dlpack.)
_DLPACK_DTYPES = frozenset(
    getattr(torch, n)
    for n in (
        "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
        "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    )
    if isinstance(getattr(torch, n, None), torch.dtype)
)


def _dlpack_carries(x: torch.Tensor) -> bool:
    """True when x (a CPU tensor) can go to tensorwire and back through DLPack: a strided layout, a dtype both
    sides know, not nested (strided-layout nested tensors have no single shape)."""
    return x.layout == torch.strided and x.dtype in _DLPACK_DTYPES and not x.is_nested


def _engine_contiguous(x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu":
        return x.contiguous()  # CUDA: PyTorch's kernel until tensorwire's device kernels land (the CUDA issue)
    if not _dlpack_carries(x):
        return x.contiguous()  # a layout or dtype DLPack cannot carry: PyTorch does it
    try:
        t = asarray(x)
    except BufferError:
        return x.contiguous()  # the producer refused the export (state DLPack cannot describe): PyTorch does it
    return torch.from_dlpack(t.copy())


class _Contiguous(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _engine_contiguous(x.detach())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g  # the identity: autograd accepts a gradient of any layout


def _torch_autodiff_only(x: torch.Tensor) -> bool:
    """Forward-mode AD (inside fwAD.dual_level(): a dual tensor does not require grad, so its tangent was dropped)
    and torch.func transforms (grad, jacrev...: wrapped tensors) differentiate PyTorch's own ops only."""
    return _fw_ad._current_level >= 0 or _is_functorch_wrapped(x)


def _needs_copy(x: torch.Tensor) -> bool:
    """A strided tensor that is not C-contiguous (sparse layouts have no is_contiguous: they raise)."""
    return x.layout == torch.strided and not x.is_contiguous()


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """x made C-contiguous by tensorwire's copy engine (x itself when it already is); differentiable, and a subclass
    keeps its type and attributes. CUDA tensors, and dtypes or layouts DLPack cannot carry (float8, quantized,
    nested), are copied by PyTorch's x.contiguous(), and so is everything under forward-mode AD or a torch.func
    transform (their tangents and wrappers are PyTorch's). A tensor that is not strided (sparse COO, CSR, CSC, BSR,
    BSC) has no strides to make contiguous: it is returned as it is."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"contiguous: expects a torch.Tensor, got {type(x).__module__}.{type(x).__qualname__}")
    if not _needs_copy(x):
        return x
    if _torch_autodiff_only(x):
        return x.contiguous()
    cls = type(x)
    if cls is torch.Tensor:
        return _Contiguous.apply(x) if x.requires_grad else _engine_contiguous(x)
    _, state = _state(x)
    plain = _plain(x)
    y = _Contiguous.apply(plain) if plain.requires_grad else _engine_contiguous(plain)
    return _rewrap(y, cls, state)


def contiguous_inputs(fn: Callable | None = None, *, mutates: tuple[str, ...] | list[str] = ()) -> Any:
    """Decorate an op so that every torch.Tensor argument (positional or keyword, and tensors directly inside
    list / tuple arguments) reaches it C-contiguous, made so by tensorwire's engine, free when it already is.
    Autograd flows through (the copy's gradient is the identity). Works on plain functions and on the
    implementation of a torch.library.custom_op (decorate the function, then register it).

    A non-contiguous argument is replaced by a copy, so an op that writes into an argument must name it:
    ``@contiguous_inputs(mutates=("out",))`` copies such an argument back into the caller's tensor after the call
    (and refuses one whose elements overlap, such as an expanded tensor, which cannot be written element-wise); an
    op that returns the argument it wrote (as torch's out= ops do) returns the caller's tensor. For
    an op taking ``**kwargs``, a name in mutates may be a keyword it receives there.
    """
    if fn is None:
        return lambda f: contiguous_inputs(f, mutates=mutates)
    if not callable(fn):
        raise TypeError(f"contiguous_inputs: expected a callable, got {type(fn).__name__}")
    if isinstance(mutates, str) or not all(isinstance(m, str) for m in mutates):
        raise TypeError("contiguous_inputs: mutates must be a tuple of parameter names")
    Tensor = torch.Tensor
    mutated = tuple(mutates)
    try:
        sig: inspect.Signature | None = inspect.signature(fn, eval_str=True)
    except Exception:  # an annotation that does not evaluate: leave inspect to follow __wrapped__
        sig = None
    if mutated:
        if sig is None:
            sig = inspect.signature(fn)
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
        unknown = [m for m in mutated if m not in sig.parameters and not var_kw]
        if unknown:
            raise ValueError(f"contiguous_inputs: {fn.__name__} has no parameter(s) {', '.join(unknown)}")

    def fix(a: Any) -> Any:
        if isinstance(a, Tensor):
            return contiguous(a) if _needs_copy(a) else a
        if type(a) in (list, tuple) and any(isinstance(v, Tensor) and _needs_copy(v) for v in a):
            return type(a)(fix(v) for v in a)
        return a

    def overlaps(t: torch.Tensor) -> bool:
        return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))

    def prepare(name: str, value: Any, written: bool, back: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        fixed = fix(value)
        if fixed is not value and written:
            pairs = zip(value, fixed) if isinstance(value, (list, tuple)) else [(value, fixed)]
            for orig, new in pairs:
                if new is orig:
                    continue
                if overlaps(orig):
                    raise ValueError(
                        f"{fn.__name__}: argument {name!r} is written, and its elements overlap (a stride-0, "
                        f"expanded tensor of strides {orig.stride()}): nothing can be written into it element-wise"
                    )
                back.append((orig, new))
        return fixed

    def call_mutating(args: tuple, kwargs: dict) -> Any:
        assert sig is not None
        bound = sig.bind(*args, **kwargs)
        back: list[tuple[Tensor, Tensor]] = []
        for name, value in list(bound.arguments.items()):
            if sig.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                # **kwargs: each keyword is an argument of its own, written when mutates names it (or **kwargs)
                every = name in mutated
                bound.arguments[name] = {k: prepare(k, v, every or k in mutated, back) for k, v in value.items()}
            else:
                bound.arguments[name] = prepare(name, value, name in mutated, back)
        result = fn(*bound.args, **bound.kwargs)
        with torch.no_grad():
            for orig, new in back:
                orig.copy_(new)
        # An op that returns the argument it wrote (as torch's out= ops do) returns the caller's tensor, not the
        # contiguous copy it was handed (later in-place changes to the result must reach the caller's).
        for orig, new in back:
            if result is new:
                return orig
        if isinstance(result, tuple) and any(r is n for r in result for _, n in back):
            swap = {id(n): o for o, n in back}
            return type(result)(*(swap.get(id(r), r) for r in result)) if hasattr(result, "_fields") else \
                tuple(swap.get(id(r), r) for r in result)
        return result

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if mutated:
            return call_mutating(args, kwargs)
        for a in args:
            if isinstance(a, Tensor):
                if _needs_copy(a):
                    break
            elif type(a) in (list, tuple):
                break
        else:
            if not kwargs:
                return fn(*args)
        return fn(*[fix(a) for a in args], **{k: fix(v) for k, v in kwargs.items()})

    # The signature with its annotations evaluated where fn was defined: torch.library.custom_op reads the schema
    # from it and evaluates string annotations (from __future__ import annotations) in the wrapper's globals.
    if sig is not None:
        wrapper.__signature__ = sig  # type: ignore[attr-defined]
    return wrapper


# ---- the DataLoader ------------------------------------------------------------------------------------------------

from ._dataloader import DataLoader  # noqa: E402  (uses the helpers above)

_ext._set_subclass_hook(_describe_for_transport)
_ensure_builtins()

del annotations  # (the __future__ import binds the name: not part of the public namespace)
