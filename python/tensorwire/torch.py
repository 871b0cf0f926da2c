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
     "registered": True}

``to_torch`` rebuilds only registered types (``register_subclass``): a peer's message never makes tensorwire import
or construct anything else. An unknown type arrives as a plain ``torch.Tensor``, and the tensorwire tensor keeps
the description in ``t.metadata[METADATA_KEY]``. An unregistered sender's attributes that are not JSON-like are
sent as their ``repr`` and listed under ``"unencoded"``.
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
import torch.utils.data
from torch.utils.data._utils.collate import collate as _torch_collate
from torch.utils.data._utils.collate import default_collate_fn_map as _default_collate_fn_map

from . import _tensorwire as _ext
from ._tensorwire import CopyError, asarray

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

# ---- the registry -------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Codec:
    cls: type
    name: str
    encode: Callable[[torch.Tensor], dict]
    decode: Callable[[torch.Tensor, dict], torch.Tensor]


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
    if not isinstance(n, str) or not n:
        raise TypeError("register_subclass: name must be a non-empty str")
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
        codec = _by_cls.pop(cls)
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


def _json_like(v: Any, depth: int = 0) -> bool:
    if type(v) is int:
        return -(2**63) <= v < 2**63
    if v is None or type(v) in (bool, float, str, bytes):
        return True
    if depth >= _MAX_DEPTH:
        return False
    if isinstance(v, (list, tuple)):
        return all(_json_like(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_like(x, depth + 1) for k, x in v.items())
    return False


def _encode_dict(x: torch.Tensor) -> dict:
    attrs, bad = _dict_attrs(x)
    if bad:
        raise TypeError(
            f"cannot encode {_type_name(type(x))}: attribute(s) {', '.join(bad)} are not JSON-like; register the "
            f"class with an encode= that converts them"
        )
    return attrs


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


def _dict_attrs(x: torch.Tensor) -> tuple[dict, list[str]]:
    d = getattr(x, "__dict__", None) or {}
    attrs: dict = {}
    bad: list[str] = []
    for k, v in d.items():
        if not isinstance(k, str):
            continue
        if isinstance(v, enum.Enum):
            v = v.name
        if _json_like(v):
            attrs[k] = v
        else:
            bad.append(k)
    return attrs, bad


def describe(x: torch.Tensor) -> dict | None:
    """The description of x's subclass that tensorwire's transports carry (see the module doc), or None for a plain
    torch.Tensor or a torch.nn.Parameter. It records x's shape: a view of a different shape (which carries a copy of
    the metadata) converts back to a plain tensor, never to a subclass instance of the wrong shape."""
    cls = type(x)
    if cls is torch.Tensor or not isinstance(x, torch.Tensor) or issubclass(cls, torch.nn.Parameter):
        return None
    codec = _lookup_cls(cls)
    if codec is not None:
        attrs = codec.encode(x)
        if not isinstance(attrs, dict) or not _json_like(attrs):
            raise TypeError(
                f"the encode function registered for {codec.name} returned {type(attrs).__name__} that is not a "
                f"dict of JSON-like values (None, bool, int, float, str, bytes, lists and str-keyed dicts)"
            )
        return {"type": codec.name, "attrs": attrs, "registered": True, "shape": list(x.shape)}
    attrs, bad = _dict_attrs(x)
    desc: dict = {"type": _type_name(cls), "attrs": attrs, "registered": False, "shape": list(x.shape)}
    if bad:
        for k in bad:
            try:
                r = repr(x.__dict__[k])
            except Exception as e:  # a broken __repr__ must not break a send
                r = f"<unrepresentable: {type(e).__name__}>"
            attrs[k] = r if len(r) <= _MAX_REPR else r[: _MAX_REPR - 3] + "..."
        desc["unencoded"] = sorted(bad)
    return desc


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
                codec = _Codec(cls, _type_name(cls), _tv_encode, functools.partial(_tv_decode, tv, cls))
                _by_cls[cls] = codec
                _by_name.setdefault(codec.name, codec)
        _builtins_done = True


def _tv_encode(x: torch.Tensor) -> dict:
    out: dict = {}
    for k, v in (getattr(x, "__dict__", None) or {}).items():
        if isinstance(v, enum.Enum):
            v = v.name
        elif isinstance(v, tuple):
            v = list(v)
        if not _json_like(v):
            raise TypeError(f"cannot encode {type(x).__name__}.{k} = {v!r}")
        out[k] = v
    return out


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
    return y


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
        return tuple(vals) if type(obj) is tuple else type(obj)(vals)
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
    t = asarray(t)
    desc = t.metadata[METADATA_KEY] if METADATA_KEY in t.metadata else None
    needs = None
    if any(s < 0 for s, n in zip(t.strides, t.shape) if n > 1):
        needs = f"negative strides {t.strides} (PyTorch refuses them)"
    if copy is True or needs is not None:
        if copy is False:
            raise CopyError(f"to_torch: PyTorch cannot take this layout ({needs}) and copy=False forbids the copy")
        t = t.copy()
    elif t.readonly and not _readonly_warned:
        _readonly_warned = True
        warnings.warn(
            "tensorwire.torch.to_torch: the tensor is read-only (a received message, or a read-only producer) and "
            "PyTorch has no read-only tensors; the result shares its memory, so do not write into it "
            "(clone() it first, or pass copy=True). This warning is shown once.",
            stacklevel=3,
        )
    x = torch.from_dlpack(t)
    shape_ok = isinstance(desc, dict) and desc.get("shape", list(x.shape)) == list(x.shape)
    if shape_ok and isinstance(desc.get("type"), str):
        codec = _lookup_name(desc["type"])
        if codec is not None:
            try:
                y = codec.decode(x, desc.get("attrs", {}))
            except Exception as e:
                raise ValueError(f"to_torch: rebuilding a {desc['type']} from the tensor's metadata failed: {e}") from e
            if not isinstance(y, codec.cls):
                raise TypeError(f"to_torch: the decode function of {codec.name} returned {type(y).__name__}")
            return y
    return x


def to_torch(t: Any, *, copy: bool | None = None) -> Any:
    """A tensorwire tensor (or anything tw.asarray takes; or a dict / list / tuple of them, as Subscriber.recv
    returns) as torch tensors, zero-copy, with registered subclasses rebuilt from the metadata (see the module doc).

    Read-only tensors (received messages) are shared too, as torch.from_numpy shares a read-only array: do not
    write into the result (a one-time warning says so); copy=True gives a private, writable copy. Negative strides,
    which PyTorch refuses, are copied, or refused with tw.CopyError under copy=False.
    """
    if copy is not None and not isinstance(copy, bool):
        raise TypeError(f"to_torch: copy must be True, False or None, not {type(copy).__name__}")
    if isinstance(t, (dict, list, tuple)) and not hasattr(t, "__dlpack__"):
        return _tree_map(t, lambda v: _to_torch_one(v, copy), lambda v: not isinstance(v, (dict, list, tuple)))
    return _to_torch_one(t, copy)


def from_torch(x: Any, *, copy: bool | None = None) -> Any:
    """A torch tensor (or a nested structure of them) as tensorwire tensors, zero-copy; a subclass instance keeps
    its description in ``t.metadata[METADATA_KEY]``. Tensors that require grad are detached (the data is shared)."""
    if copy is not None and not isinstance(copy, bool):
        raise TypeError(f"from_torch: copy must be True, False or None, not {type(copy).__name__}")

    def one(v: torch.Tensor) -> Any:
        if v.requires_grad:
            desc = describe(v)
            t = asarray(_plain(v).detach(), copy=copy)
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
    plain = _plain(x)
    tw_pin = getattr(_ext.Tensor, "pin", None)  # tensorwire's pinned pool (the CUDA issue); else PyTorch's
    if tw_pin is not None and not plain.requires_grad:
        pinned = torch.from_dlpack(tw_pin(asarray(plain)))
    else:
        pinned = plain.pin_memory()
    return _rewrap(pinned, cls, state)


def pin(obj: Any) -> Any:
    """Every CPU tensor in obj (a tensor, or nested dicts / lists / tuples / namedtuples / dataclasses) copied to
    pinned memory, keeping subclasses and their attributes. Without an accelerator it does what PyTorch's DataLoader
    does: warns once and returns obj unchanged."""
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
    return _tree_map(obj, _pin_tensor, lambda v: isinstance(v, torch.Tensor))


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


def _engine_contiguous(x: torch.Tensor) -> torch.Tensor:
    if x.device.type != "cpu" or x.layout != torch.strided:
        return x.contiguous()  # CUDA: PyTorch's kernel until tensorwire's device kernels land (the CUDA issue)
    try:
        t = asarray(x)
    except Exception:
        return x.contiguous()  # a dtype or state DLPack cannot carry: PyTorch does it
    return torch.from_dlpack(t.copy())


class _Contiguous(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return _engine_contiguous(x.detach())

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g  # the identity: autograd accepts a gradient of any layout


def contiguous(x: torch.Tensor) -> torch.Tensor:
    """x made C-contiguous by tensorwire's copy engine (x itself when it already is); differentiable, and a subclass
    keeps its type and attributes."""
    if x.is_contiguous():
        return x
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
    (and refuses one whose elements overlap, such as an expanded tensor, which cannot be written element-wise).
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
        unknown = [m for m in mutated if m not in sig.parameters]
        if unknown:
            raise ValueError(f"contiguous_inputs: {fn.__name__} has no parameter(s) {', '.join(unknown)}")

    def fix(a: Any) -> Any:
        if isinstance(a, Tensor):
            return a if a.is_contiguous() else contiguous(a)
        if type(a) in (list, tuple) and any(isinstance(v, Tensor) and not v.is_contiguous() for v in a):
            return type(a)(fix(v) for v in a)
        return a

    def call_mutating(args: tuple, kwargs: dict) -> Any:
        assert sig is not None
        bound = sig.bind(*args, **kwargs)
        back: list[tuple[Tensor, Tensor]] = []
        for name, value in list(bound.arguments.items()):
            fixed = fix(value)
            if fixed is not value and name in mutated:
                pairs = zip(value, fixed) if isinstance(value, (list, tuple)) else [(value, fixed)]
                for orig, new in pairs:
                    if new is orig:
                        continue
                    if any(st == 0 and n > 1 for st, n in zip(orig.stride(), orig.shape)):
                        raise ValueError(
                            f"{fn.__name__}: argument {name!r} is written, and its elements overlap (a stride-0, "
                            f"expanded tensor of strides {orig.stride()}): nothing can be written into it element-wise"
                        )
                    back.append((orig, new))
            bound.arguments[name] = fixed
        result = fn(*bound.args, **bound.kwargs)
        with torch.no_grad():
            for orig, new in back:
                orig.copy_(new)
        return result

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if mutated:
            return call_mutating(args, kwargs)
        for a in args:
            if isinstance(a, Tensor):
                if not a.is_contiguous():
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

_ext._set_subclass_hook(describe)
_ensure_builtins()
