"""tensorwire.torch: subclasses and their attributes through pin, collate, DataLoader workers, pickling and
tw.Publisher; contiguous_inputs with autograd. Against real torchvision TVTensors and user-defined subclasses."""

from __future__ import annotations

import collections
import dataclasses
import gc
import inspect
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tensorwire as tw
import tensorwire.torch as twt
from tensorwire import _dataloader as twdl  # (imported by tensorwire.torch: import that first)

tv_tensors = pytest.importorskip("torchvision.tv_tensors")

HERE = os.path.dirname(os.path.abspath(__file__))
_topic_n = iter(range(10**6))


def topic(tag: str) -> str:
    return f"t11.{os.getpid()}.{tag}.{next(_topic_n)}"


def plain(x: torch.Tensor) -> torch.Tensor:
    with torch._C.DisableTorchFunctionSubclass():
        return x.as_subclass(torch.Tensor)


def boxes(n: int = 3, fmt: str = "XYXY", canvas=(480, 640), seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tv_tensors.BoundingBoxes(torch.rand(n, 4, generator=g) * 100, format=fmt, canvas_size=canvas)


class Units(torch.Tensor):
    """A user's subclass with plain attributes in __dict__ (never registered)."""


def units(values, unit="m", **extra):
    x = torch.as_tensor(values, dtype=torch.float32).as_subclass(Units)
    x.unit = unit
    x.__dict__.update(extra)
    return x


class Scaled(torch.Tensor):
    """A user's subclass registered with its own codec."""


def scaled(values, scale):
    x = torch.as_tensor(values, dtype=torch.float32).as_subclass(Scaled)
    x.scale = scale
    return x


@pytest.fixture
def scaled_registered():
    twt.register_subclass(
        Scaled,
        encode=lambda x: {"scale": x.scale},
        decode=lambda p, a: _rebuild_scaled(p, a),
        name="tests.Scaled",
    )
    yield
    twt.unregister_subclass(Scaled)


def _rebuild_scaled(p, a):
    y = p.as_subclass(Scaled)
    y.scale = float(a["scale"])
    return y


def assert_same_tv(a, b):
    assert type(a) is type(b)
    assert a.__dict__ == b.__dict__
    assert torch.equal(plain(a), plain(b))


# ---- the registry ---------------------------------------------------------------------------------------------------


def test_tvtensors_are_registered_once_torchvision_is_imported():
    reg = twt.registered_subclasses()
    for cls in (tv_tensors.Image, tv_tensors.Video, tv_tensors.Mask, tv_tensors.BoundingBoxes):
        assert reg[f"{cls.__module__}.{cls.__qualname__}"] is cls


def test_register_subclass_validates_its_arguments():
    with pytest.raises(TypeError, match="subclass of torch.Tensor"):
        twt.register_subclass(int)
    with pytest.raises(TypeError, match="subclass of torch.Tensor"):
        twt.register_subclass(torch.Tensor)
    with pytest.raises(TypeError, match="encode must be callable"):
        twt.register_subclass(Scaled, encode=42)
    with pytest.raises(ValueError, match="name of Scaled must be a non-empty str"):
        twt.register_subclass(Scaled, name="")
    with pytest.raises(TypeError, match="name must be a str, not int"):
        twt.register_subclass(Scaled, name=3)
    assert Scaled not in twt.registered_subclasses().values()  # neither attempt registered it

    class Other(torch.Tensor):
        pass

    twt.register_subclass(Other, name="tests.taken")
    try:
        with pytest.raises(ValueError, match="taken"):
            twt.register_subclass(Scaled, name="tests.taken")
        assert twt.register_subclass(Other, name="tests.taken2") is Other  # re-registering replaces the name
        assert "tests.taken" not in twt.registered_subclasses()
    finally:
        twt.unregister_subclass(Other)
    with pytest.raises(KeyError, match=r"unregister_subclass: <class '.*Other'> is not registered"):
        twt.unregister_subclass(Other)


def test_describe():
    assert twt.describe(torch.zeros(2)) is None
    assert twt.describe(torch.nn.Parameter(torch.zeros(2))) is None
    d = twt.describe(boxes(canvas=(4, 5)))
    assert d["type"].endswith("BoundingBoxes") and d["registered"] is True
    assert d["attrs"]["format"] == "XYXY" and d["attrs"]["canvas_size"] == [4, 5]
    u = units([1.0], unit="s", ok=[1, 2], bad=object())
    d = twt.describe(u)
    assert d["registered"] is False and d["type"] == f"{__name__}.Units"
    assert d["attrs"]["unit"] == "s" and d["attrs"]["ok"] == [1, 2] and d["unencoded"] == ["bad"]
    assert d["attrs"]["bad"].startswith("<object object")


class Tagged(torch.Tensor):
    """A user's subclass registered with the default codec (its __dict__)."""


def tagged(**attrs):
    x = torch.arange(3.0).as_subclass(Tagged)
    x.__dict__.update(attrs)
    return x


@pytest.fixture
def tagged_registered():
    twt.register_subclass(Tagged, name="tests.Tagged")
    yield
    twt.unregister_subclass(Tagged)


def test_an_encode_that_cannot_encode_degrades_and_never_fails_a_send():
    class Bad(torch.Tensor):
        pass

    x = torch.zeros(2).as_subclass(Bad)
    x.scale = 0.5
    codecs = [lambda x: {"f": object(), "ok": 1}, lambda x: 42, lambda x: 1 / 0]
    expect = [
        ({"f": "<object object", "ok": 1}, ["f"], r"attribute\(s\) f cannot travel.*f: not JSON-like"),
        ({"scale": "0.5"}, ["scale"], r"attribute\(s\) scale .*encode function failed: TypeError: it returned int"),
        ({"scale": "0.5"}, ["scale"], r"attribute\(s\) scale .*encode function failed: ZeroDivisionError"),
    ]
    try:
        for encode, (attrs, unencoded, msg) in zip(codecs, expect):
            twt.register_subclass(Bad, encode=encode, name="tests.Bad")
            # the warning names the attribute and the remedy
            with pytest.warns(UserWarning, match=msg + r".*register_subclass\(Bad, encode=\.\.\., decode=\.\.\.\)"):
                t = tw.asarray(x)
            assert t.data_ptr == x.data_ptr()
            d = t.metadata[twt.METADATA_KEY]
            assert d["unencoded"] == unencoded and d["registered"] is True
            assert {k: v[:14] if isinstance(v, str) else v for k, v in d["attrs"].items()} == attrs
    finally:
        twt.unregister_subclass(Bad)


def test_a_failing_description_never_fails_tw_asarray(monkeypatch):
    def broken(x):
        raise RuntimeError("describe broke")

    monkeypatch.setattr(twt, "describe", broken)
    u = units([1.0, 2.0])
    with pytest.warns(UserWarning, match=r"describing a .*Units failed \(RuntimeError: describe broke\); it travels "
                                         r"as a plain tensor\. register_subclass\(Units, encode="):
        t = tw.asarray(u)
    assert twt.METADATA_KEY not in t.metadata and t.data_ptr == u.data_ptr()


# ---- conversions ---------------------------------------------------------------------------------------------------


def tv_samples():
    g = torch.Generator().manual_seed(3)
    out = [
        tv_tensors.Image(torch.randint(0, 255, (3, 4, 5), dtype=torch.uint8, generator=g)),
        tv_tensors.Video(torch.rand(2, 3, 4, 5, generator=g)),
        tv_tensors.Mask(torch.rand(4, 5, generator=g) > 0.5),
        boxes(fmt="CXCYWH", canvas=(7, 9)),
    ]
    if hasattr(tv_tensors, "KeyPoints"):
        out.append(tv_tensors.KeyPoints(torch.rand(3, 2, generator=g), canvas_size=(10, 11)))
    return out


@pytest.mark.parametrize("x", tv_samples(), ids=lambda x: type(x).__name__)
def test_to_torch_rebuilds_tvtensors_zero_copy(x):
    t = twt.from_torch(x)
    assert t.metadata[twt.METADATA_KEY]["registered"] is True
    y = twt.to_torch(t)
    assert_same_tv(y, x)
    assert y.data_ptr() == x.data_ptr()  # zero-copy both ways


def test_plain_from_dlpack_keeps_working():
    b = boxes()
    y = torch.from_dlpack(tw.asarray(b))
    assert type(y) is torch.Tensor and torch.equal(y, plain(b)) and y.data_ptr() == b.data_ptr()


def test_registered_user_codec(scaled_registered):
    x = scaled([1.0, 2.0], 0.5)
    t = tw.asarray(x)
    assert t.metadata[twt.METADATA_KEY] == {
        "type": "tests.Scaled", "attrs": {"scale": 0.5}, "registered": True, "shape": [2]
    }
    y = twt.to_torch(t)
    assert type(y) is Scaled and y.scale == 0.5 and torch.equal(plain(y), plain(x))


def test_unregistered_subclass_arrives_plain_with_its_description():
    u = units([1.0, 2.0], unit="kg")
    t = tw.asarray(u)
    y = twt.to_torch(t)
    assert type(y) is torch.Tensor and torch.equal(y, plain(u))
    assert t.metadata[twt.METADATA_KEY] == {
        "type": f"{__name__}.Units", "attrs": {"unit": "kg"}, "registered": False, "shape": [2]
    }


def test_a_tvtensor_with_attributes_its_codec_does_not_know_crosses_a_publisher(monkeypatch):
    monkeypatch.setattr(twt, "_readonly_warned", True)
    b = boxes(canvas=(5, 6))
    b.note = "hi"  # JSON-like, but not a BoundingBoxes attribute: _tv_decode would refuse it
    b.src = object()  # not JSON-like at all
    name = topic("extra")
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        with pytest.warns(UserWarning, match=r"BoundingBoxes: attribute\(s\) note, src cannot travel.*"
                                             r"register_subclass\(BoundingBoxes, encode="):
            pub.send(b)
        t = sub.recv(timeout=10)
        d = t.metadata[twt.METADATA_KEY]
        assert d["unencoded"] == ["note", "src"] and d["attrs"]["note"] == "'hi'"
        assert d["attrs"]["src"].startswith("<object object")
        y = twt.to_torch(t)
        assert type(y) is tv_tensors.BoundingBoxes and y.format.name == "XYXY" and y.canvas_size == (5, 6)
        assert "note" not in y.__dict__ and "src" not in y.__dict__
        assert y.data_ptr() == t.data_ptr and torch.equal(plain(y), plain(b))
        del y, t


def test_unencoded_placeholders_never_reach_decode(tagged_registered, scaled_registered):
    with pytest.warns(UserWarning, match=r"tests\.Tagged: attribute\(s\) bad "):
        t = tw.asarray(tagged(ok=1, bad=object()))
    assert t.metadata[twt.METADATA_KEY]["attrs"]["bad"].startswith("<object")  # the repr travels ...
    y = twt.to_torch(t)
    assert type(y) is Tagged and y.ok == 1 and "bad" not in y.__dict__  # ... but is not an attribute
    # a decode that needs an attribute the sender could not encode: an error naming the type and the attribute
    with pytest.warns(UserWarning, match=r"tests\.Scaled: attribute\(s\) scale "):
        t = tw.asarray(scaled([1.0], object()))
    with pytest.raises(ValueError, match=r"rebuilding a tests\.Scaled .* the attribute 'scale' is missing \(the "
                                         r"sender could not encode scale"):
        twt.to_torch(t)
    b = boxes()
    b.canvas_size = object()
    with pytest.warns(UserWarning, match="canvas_size: not JSON-like"):
        t = tw.asarray(b)
    with pytest.raises(ValueError, match=r"BoundingBoxes: the message lacks canvas_size \(the sender could not "
                                         r"encode canvas_size"):
        twt.to_torch(t)
    t.metadata[twt.METADATA_KEY] = {"type": "tests.Tagged", "attrs": {"ok": 1}, "unencoded": "ok"}
    with pytest.raises(ValueError, match=r"description of a tests\.Tagged is malformed: \"unencoded\" must be a list"):
        twt.to_torch(t)


def test_a_large_attribute_travels_unencoded_instead_of_failing_the_send(scaled_registered):
    u = units([1.0, 2.0], unit="m", blob="x" * 100_000, ints=list(range(5000)), mid="y" * 8000)
    name = topic("big")
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:  # 64 KiB of metadata at most
        pub.send(u)
        t = sub.recv(timeout=10)
        d = t.metadata[twt.METADATA_KEY]
        assert d["unencoded"] == ["blob", "ints"]
        assert d["attrs"]["unit"] == "m" and d["attrs"]["mid"] == "y" * 8000  # what fits travels encoded
        assert d["attrs"]["blob"] == "'" + "x" * 196 + "..."  # the rest as a cut repr
        assert twt._wire_size(d["attrs"]) <= 16 * 1024
        assert torch.equal(twt.to_torch(t, copy=True), plain(u))
        del t
    with pytest.warns(UserWarning, match=r"tests\.Scaled: attribute\(s\) scale .*past the 16 KiB"):
        assert twt.describe(scaled([1.0], "z" * 20_000))["unencoded"] == ["scale"]


def test_to_torch_of_a_received_tensor_shares_it_and_warns_once(monkeypatch):
    monkeypatch.setattr(twt, "_readonly_warned", False)
    name = topic("ro")
    b = boxes(canvas=(5, 6))
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        pub.send(b)
        t = sub.recv(timeout=10)
        assert t.readonly
        with pytest.warns(UserWarning, match="read-only"):
            y = twt.to_torch(t)
        assert type(y) is tv_tensors.BoundingBoxes and y.canvas_size == (5, 6)
        assert y.data_ptr() == t.data_ptr  # zero-copy out of the publisher's shared memory
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            twt.to_torch(t)  # once
        z = twt.to_torch(t, copy=True)
        assert z.data_ptr() != t.data_ptr and type(z) is tv_tensors.BoundingBoxes
        z.add_(1)  # a private, writable copy
        assert torch.equal(plain(y), plain(b))
        del y, z, t


def test_to_torch_copies_negative_strides_or_refuses():
    a = np.arange(10.0)[::-2]
    y = twt.to_torch(a)
    assert y.tolist() == a.tolist()
    with pytest.raises(tw.CopyError, match="negative strides"):
        twt.to_torch(a, copy=False)
    with pytest.raises(TypeError, match="copy must be"):
        twt.to_torch(a, copy="yes")


def test_to_torch_of_a_received_dict_message_and_nested_from_torch(monkeypatch):
    monkeypatch.setattr(twt, "_readonly_warned", True)
    b, img = boxes(), tv_samples()[0]
    ts = twt.from_torch({"boxes": b, "img": img, "more": [b]})
    assert isinstance(ts["boxes"], tw.Tensor) and isinstance(ts["more"][0], tw.Tensor)
    assert ts["boxes"].data_ptr == b.data_ptr() and ts["img"].data_ptr == img.data_ptr()
    back = twt.to_torch(ts)
    assert_same_tv(back["boxes"], b)
    assert_same_tv(back["img"], img)
    assert_same_tv(back["more"][0], b)
    assert back["boxes"].data_ptr() == back["more"][0].data_ptr() == b.data_ptr()  # zero-copy both ways
    assert back["img"].data_ptr() == img.data_ptr()
    with pytest.raises(TypeError, match="from_torch"):
        twt.from_torch(42)
    # a received dict message: each tensor shares the message's memory
    name = topic("dict")
    with tw.Subscriber(name) as sub, tw.Publisher(name) as pub:
        pub.send({"boxes": b, "img": img})
        msg = sub.recv(timeout=10)
        got = twt.to_torch(msg)
        assert_same_tv(got["boxes"], b)
        assert_same_tv(got["img"], img)
        assert got["boxes"].data_ptr() == msg["boxes"].data_ptr and got["img"].data_ptr() == msg["img"].data_ptr
        del got, msg


def test_a_received_tensor_outlives_its_message_subscriber_and_publisher(monkeypatch):
    monkeypatch.setattr(twt, "_readonly_warned", True)
    name = topic("life")
    b = boxes(4, canvas=(9, 9))
    expected = plain(b).clone()
    sub, pub = tw.Subscriber(name), tw.Publisher(name, depth=2)
    pub.send(b)
    t = sub.recv(timeout=10)
    y = twt.to_torch(t)
    ptr = y.data_ptr()
    assert ptr == t.data_ptr
    del t
    gc.collect()
    # the publisher reuses a pool buffer once its last reader lets go: y must still hold this one
    for i in range(6):
        pub.send(torch.full((4, 4), float(i)))
        sub.recv(timeout=10)
    assert torch.equal(plain(y), expected)
    sub.close()
    pub.close()
    gc.collect()
    assert type(y) is tv_tensors.BoundingBoxes and y.canvas_size == (9, 9)
    assert y.data_ptr() == ptr and torch.equal(plain(y), expected)  # still mapped, still the sent values
    assert torch.equal(plain(y.clone()), expected)


def test_from_torch_detaches_a_tensor_that_requires_grad():
    x = boxes().requires_grad_(True)
    t = twt.from_torch(x)
    assert t.data_ptr == x.data_ptr() and t.metadata[twt.METADATA_KEY]["registered"]
    # Read-only, as tw.asarray makes it: a write through the view changed what autograd saved (wrong gradients).
    w = torch.full((3,), 2.0, requires_grad=True)
    v = torch.ones(3, requires_grad=True)
    (w * v).sum().backward()
    assert w.grad.tolist() == [1.0, 1.0, 1.0]
    for y in (twt.from_torch(v), twt.from_torch(torch.nn.Parameter(torch.ones(2))), twt.from_torch({"v": v})["v"],
              t):
        assert y.readonly
        with pytest.raises(ValueError, match="read-only"):
            np.asarray(y)[...] = 100
    c = twt.from_torch(v, copy=True)  # a copy is the caller's own
    assert not c.readonly and c.data_ptr != v.data_ptr()


def test_hostile_attributes_are_refused_with_a_clear_error():
    t = tw.asarray(np.zeros((2, 4), np.float32))
    name = f"{tv_tensors.BoundingBoxes.__module__}.BoundingBoxes"
    for attrs, msg in (
        ({"format": "__class__", "canvas_size": [1, 1]}, "not a BoundingBoxFormat"),
        ({"format": "XYXY", "canvas_size": [1]}, "pair of non-negative ints"),
        ({"format": "XYXY", "canvas_size": [1, -2]}, "pair of non-negative ints"),
        ({"format": "XYXY", "canvas_size": [1, 1], "__class__": 1}, "unknown attribute"),
    ):
        t.metadata[twt.METADATA_KEY] = {"type": name, "attrs": attrs, "registered": True}
        with pytest.raises(ValueError, match=msg):
            twt.to_torch(t)
    for attrs, msg in (
        ({"canvas_size": [1, 1]}, "lacks format"),
        ({"format": "XYXY", "canvas_size": [1, 1], "clamping_mode": "sometimes"}, "clamping_mode"),
    ):
        t.metadata[twt.METADATA_KEY] = {"type": name, "attrs": attrs, "registered": True}
        with pytest.raises(ValueError, match=msg):
            twt.to_torch(t)
    t3 = tw.asarray(np.zeros((2, 3), np.float32))
    t3.metadata[twt.METADATA_KEY] = {"type": name, "attrs": {"format": "XYXY", "canvas_size": [1, 1]}}
    with pytest.raises(ValueError, match="last dimension must be 4"):
        twt.to_torch(t3)
    t.metadata[twt.METADATA_KEY] = {"type": 42}  # malformed descriptions: a plain tensor
    assert type(twt.to_torch(t)) is torch.Tensor
    t.metadata[twt.METADATA_KEY] = "nonsense"
    assert type(twt.to_torch(t)) is torch.Tensor


def test_boxes_from_a_sender_without_clamping_mode_get_this_torchvisions_default():
    # (a torchvision older than 0.23 sends no clamping_mode: the rebuilt boxes had none, and repr() or any v2
    # transform raised AttributeError)
    from torchvision.transforms import v2

    t = tw.asarray(np.array([[0, 0, 10, 20]], np.float32))
    t.metadata[twt.METADATA_KEY] = {"type": f"{tv_tensors.BoundingBoxes.__module__}.BoundingBoxes",
                                    "attrs": {"format": "XYXY", "canvas_size": [64, 64]}, "registered": True}
    r = twt.to_torch(t)
    assert type(r) is tv_tensors.BoundingBoxes
    assert r.clamping_mode == tv_tensors.BoundingBoxes([[0, 0, 1, 1]], format="XYXY", canvas_size=(2, 2)).clamping_mode
    assert "clamping_mode" in repr(r)
    assert v2.RandomHorizontalFlip(p=1)(r).tolist() == [[54.0, 0.0, 64.0, 20.0]]


def test_a_view_of_another_shape_converts_to_a_plain_tensor():
    t = tw.asarray(boxes(5))
    assert type(twt.to_torch(t)) is tv_tensors.BoundingBoxes
    col = t[:, 0]  # the view carries a copy of the metadata, but it is no longer a (N, 4) box tensor
    assert twt.METADATA_KEY in col.metadata and type(twt.to_torch(col)) is torch.Tensor


def test_a_transposed_or_reversed_view_of_the_same_shape_converts_to_a_plain_tensor():
    # A square box tensor's .T has the shape the description recorded: its columns were rebuilt as boxes.
    bb = tv_tensors.BoundingBoxes(torch.arange(16.0).reshape(4, 4), format="XYXY", canvas_size=(99, 99))
    t = tw.asarray(bb)
    assert type(twt.to_torch(t)) is tv_tensors.BoundingBoxes
    views = (t.T, t.permute(1, 0), t.transpose(0, 1), t[:, ::-1], t[::-1], t.slice(1, None, None, -1))
    for view in views:  # the view drops the description, so its copies, sent or not, are plain too
        assert twt.METADATA_KEY not in view.metadata and type(twt.to_torch(view)) is torch.Tensor
        assert type(twt.to_torch(view.copy())) is torch.Tensor
    assert twt.METADATA_KEY in t.metadata  # (the source keeps it)
    name = f"tposed-{os.getpid()}"
    with tw.Publisher(name) as pub, tw.Subscriber(name) as sub:
        pub.send(t.T)  # (a dense transpose: it arrives transposed, but the view dropped the description)
        assert type(twt.to_torch(sub.recv(timeout=5))) is torch.Tensor
        pub.send(t)
        assert type(twt.to_torch(sub.recv(timeout=5))) is tv_tensors.BoundingBoxes
    # A view that moves no dimension of extent > 1 keeps it; the description's own check still covers a view made
    # before it was recorded (a reordered layout arriving as it was).
    assert twt.METADATA_KEY in t.permute(0, 1).metadata and twt.METADATA_KEY in t[None].permute(1, 0, 2).metadata
    u = tw.asarray(bb)
    u.metadata[twt.METADATA_KEY] = dict(u.metadata[twt.METADATA_KEY], order=[1, 0])
    assert type(twt.to_torch(u.T)) is torch.Tensor
    # A dense copy in C order (what a packing transport delivers) keeps its type, and so does a channels-last image
    # whose layout crossed as it was.
    assert type(twt.to_torch(t.copy())) is tv_tensors.BoundingBoxes
    img = tv_tensors.Image(torch.rand(2, 3, 4, 4)).to(memory_format=torch.channels_last)
    ti = tw.asarray(img)
    assert not ti.is_contiguous() and type(twt.to_torch(ti)) is tv_tensors.Image
    assert type(twt.to_torch(ti.copy())) is tv_tensors.Image


@pytest.mark.parametrize("fmt,n", [("XYWHR", 5), ("CXCYWHR", 5), ("XYXYXYXY", 8), ("XYXY", 4)])
def test_rotated_bounding_boxes_cross_with_their_coordinates(fmt, n):
    # torchvision's rotated formats have 5 or 8 coordinates; the decoder demanded 4 of every BoundingBoxes.
    bb = tv_tensors.BoundingBoxes(torch.arange(2.0 * n).reshape(2, n), format=fmt, canvas_size=(64, 64))
    for t in (tw.asarray(bb), pickle.loads(pickle.dumps(tw.asarray(bb)))):
        r = twt.to_torch(t)
        assert type(r) is tv_tensors.BoundingBoxes and r.format.name == fmt and torch.equal(r, bb)
    t = tw.asarray(bb)
    t.metadata[twt.METADATA_KEY] = dict(t.metadata[twt.METADATA_KEY], shape=[2, 3])  # shapes still checked
    with pytest.raises(ValueError, match="last dimension must be"):
        twt._tv_decode(tv_tensors, tv_tensors.BoundingBoxes, torch.zeros(2, 3), t.metadata[twt.METADATA_KEY]["attrs"])


def test_the_default_decode_refuses_names_that_shadow_the_class(scaled_registered):
    class Plain(torch.Tensor):
        pass

    twt.register_subclass(Plain, name="tests.Plain")
    try:
        t = tw.asarray(np.zeros(2, np.float32))
        for bad in ("__class__", "float", "__torch_function__"):
            t.metadata[twt.METADATA_KEY] = {"type": "tests.Plain", "attrs": {bad: 1}, "registered": True}
            with pytest.raises(ValueError, match="not allowed"):
                twt.to_torch(t)
        t.metadata[twt.METADATA_KEY] = {"type": "tests.Plain", "attrs": {"unit": "m"}, "registered": True}
        y = twt.to_torch(t)
        assert type(y) is Plain and y.unit == "m"
    finally:
        twt.unregister_subclass(Plain)


def test_pickling_a_tw_tensor_keeps_the_description():
    b = boxes(canvas=(3, 8))
    t2 = pickle.loads(pickle.dumps(tw.asarray(b), protocol=5))
    assert_same_tv(twt.to_torch(t2), b)


# ---- across processes: tw.Publisher ------------------------------------------------------------------------------

RECEIVER = textwrap.dedent(
    """
    import sys, json, os
    import torch, tensorwire as tw, tensorwire.torch as twt
    if sys.argv[2] == "tv":
        from torchvision import tv_tensors
    sub = tw.Subscriber(sys.argv[1])
    print("ready", flush=True)
    out = []
    for _ in range(int(sys.argv[3])):
        t = sub.recv(timeout=30)
        x = twt.to_torch(t)
        out.append({"type": type(x).__module__ + "." + type(x).__qualname__,
                    "attrs": {k: (v.name if hasattr(v, "name") else list(v) if isinstance(v, tuple) else v)
                              for k, v in getattr(x, "__dict__", {}).items()},
                    "values": torch.as_tensor(x).flatten().tolist(),
                    "desc": t.metadata.get(twt.METADATA_KEY),
                    "modules": sorted(m for m in ("tests_evil_module", "torchvision") if m in sys.modules)})
    print(json.dumps(out), flush=True)
    """
)


def receiver_env(*extra: str) -> dict:
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(tw.__file__)))
    paths = [pkg_root, *extra] + [q for q in env.get("PYTHONPATH", "").split(os.pathsep) if q]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def run_receiver(topic_name: str, mode: str, n: int, send, extra_path: tuple[str, ...] = ()):
    env = receiver_env(*extra_path)
    p = subprocess.Popen(
        [sys.executable, "-c", RECEIVER, topic_name, mode, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=HERE,
    )
    try:
        line = p.stdout.readline().strip()
        if line != "ready":
            p.kill()
            raise AssertionError(f"the receiver did not start: {p.communicate()[1][-2000:]}")
        with tw.Publisher(topic_name) as pub:
            send(pub)
            out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    import json

    return json.loads(out.strip().splitlines()[-1])


def test_a_tvtensor_crosses_a_publisher_as_itself():
    b = boxes(fmt="XYWH", canvas=(11, 13))
    m = tv_tensors.Mask(torch.tensor([[True, False]]))
    got = run_receiver(topic("tv"), "tv", 2, lambda pub: (pub.send(b, metadata={"step": 7}), pub.send(m)))
    assert got[0]["type"] == "torchvision.tv_tensors._bounding_boxes.BoundingBoxes"
    assert got[0]["attrs"]["format"] == "XYWH" and got[0]["attrs"]["canvas_size"] == [11, 13]
    assert got[0]["values"] == plain(b).flatten().tolist()
    assert got[1]["type"].endswith("Mask") and got[1]["values"] == [True, False]


def test_unregistered_and_unknown_types_arrive_plain_and_nothing_is_imported(tmp_path):
    # A message naming a module whose import would run code, importable where the receiver runs: the receiver
    # neither imports nor constructs it.
    marker = tmp_path / "imported"
    (tmp_path / "tests_evil_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nclass Evil:\n    pass\n"
    )
    evil = tw.asarray(np.arange(3, dtype=np.float32))
    evil.metadata[twt.METADATA_KEY] = {"type": "tests_evil_module.Evil", "attrs": {"x": 1}, "registered": True}
    u = units([4.0, 5.0], unit="N")
    b = boxes()
    # The receiver never imported torchvision: TVTensors are not registered there, so they arrive plain too.
    got = run_receiver(topic("unk"), "plain", 3, lambda pub: (pub.send(evil), pub.send(u), pub.send(b)),
                       extra_path=(str(tmp_path),))
    assert [g["type"] for g in got] == ["torch.Tensor"] * 3
    assert got[0]["desc"]["type"] == "tests_evil_module.Evil" and got[0]["modules"] == []
    assert got[1]["desc"] == {"type": f"{__name__}.Units", "attrs": {"unit": "N"}, "registered": False, "shape": [2]}
    assert got[1]["values"] == [4.0, 5.0]
    assert got[2]["desc"]["attrs"]["format"] == "XYXY" and "torchvision" not in got[2]["modules"]
    assert not marker.exists()
    # the check can fail: with the same environment, importing the module leaves the marker
    subprocess.run([sys.executable, "-c", "import tests_evil_module"], env=receiver_env(str(tmp_path)), cwd=HERE,
                   check=True, timeout=60)
    assert marker.read_text() == "imported"


# ---- pin -----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    image: torch.Tensor
    boxes: torch.Tensor
    label: int


Pair = collections.namedtuple("Pair", "a b")


def nested_batch():
    return {
        "sample": Sample(tv_samples()[0], boxes(), 3),
        "pair": Pair(units([1.0], unit="s"), [boxes(seed=1), "text"]),
        "t": (torch.arange(3),),
    }


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-accelerator behaviour")
def test_pin_without_an_accelerator_warns_once_and_returns_the_structure(monkeypatch):
    monkeypatch.setattr(twt, "_pin_warned", False)
    batch = nested_batch()
    with pytest.warns(UserWarning, match="no accelerator"):
        assert twt.pin(batch) is batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert twt.pin(batch) is batch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs a CUDA device (runs in make test-gpu)")
def test_pin_keeps_types_and_attributes_on_a_gpu():
    batch = nested_batch()
    p = twt.pin(batch)
    assert type(p["sample"]) is Sample and type(p["pair"]) is Pair
    assert_same_tv(p["sample"].image, batch["sample"].image)
    assert p["sample"].image.is_pinned() and p["sample"].boxes.is_pinned()
    assert type(p["pair"].a) is Units and p["pair"].a.unit == "s" and p["pair"].a.is_pinned()
    assert p["pair"].b[1] == "text" and p["sample"].label == 3
    c = p["sample"].boxes.cuda(non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(plain(c).cpu(), plain(batch["sample"].boxes))


class CustomBatch:
    """A user's batch type that pins itself (torch's documented extension point)."""

    def __init__(self, x: torch.Tensor, pinned: bool = False) -> None:
        self.x, self.pinned = x, pinned

    def pin_memory(self) -> "CustomBatch":
        pin_calls.append(self)
        return CustomBatch(self.x, pinned=True)


pin_calls: list = []


def test_pin_calls_a_custom_batch_types_pin_memory(monkeypatch):
    # No GPU needed: pretend there is an accelerator and record what would be pinned.
    monkeypatch.setattr(twt, "_accelerator", lambda: True)
    monkeypatch.setattr(twt, "_pin_tensor", lambda t: ("pinned", t))
    pin_calls.clear()
    cb, t = CustomBatch(torch.zeros(2)), torch.ones(3)
    out = twt.pin({"batch": cb, "t": t, "cls": CustomBatch, "name": "x", "pair": Pair(cb, 1)})
    assert type(out["batch"]) is CustomBatch and out["batch"].pinned and out["batch"].x is cb.x
    assert type(out["pair"]) is Pair and out["pair"].a.pinned
    assert pin_calls == [cb, cb] and out["t"][0] == "pinned" and out["t"][1] is t
    assert out["cls"] is CustomBatch and out["name"] == "x"  # a class is not an instance to pin
    # no accelerator: nothing is pinned, nothing is called
    monkeypatch.setattr(twt, "_accelerator", lambda: False)
    monkeypatch.setattr(twt, "_pin_warned", True)
    assert twt.pin({"batch": cb})["batch"] is cb and len(pin_calls) == 2


def test_in_process_paths_keep_attributes_no_codec_could_encode():
    b = boxes(2)
    b.source = object()  # not JSON-like: fine inside one program
    c = twt.collate([b, b])
    assert type(c) is tv_tensors.BoundingBoxes and c.source is b.source
    s = tv_tensors.BoundingBoxes(torch.rand(4, 3).T, format="XYXY", canvas_size=(2, 2))
    s.source = b.source
    assert not s.is_contiguous() and twt.contiguous(s).source is b.source


def test_tree_map_keeps_container_types():
    batch = nested_batch()
    out = twt._tree_map(batch, lambda x: x + 0, lambda v: isinstance(v, torch.Tensor))
    assert type(out["sample"]) is Sample and type(out["pair"]) is Pair and type(out["t"]) is tuple
    assert out["pair"].b[1] == "text"
    od = twt._tree_map(collections.OrderedDict(a=torch.zeros(1)), lambda x: x, lambda v: isinstance(v, torch.Tensor))
    assert type(od) is collections.OrderedDict


# ---- collate -------------------------------------------------------------------------------------------------------


def test_collate_stacks_subclasses_whose_attributes_and_shapes_agree():
    bs = [boxes(4, seed=i) for i in range(3)]
    c = twt.collate(bs)
    assert type(c) is tv_tensors.BoundingBoxes and c.shape == (3, 4, 4)
    assert c.format.name == "XYXY" and c.canvas_size == (480, 640)
    assert torch.equal(plain(c), torch.stack([plain(b) for b in bs]))
    us = twt.collate([units([1.0], unit="m"), units([2.0], unit="m")])
    assert type(us) is Units and us.unit == "m" and us.tolist() == [[1.0], [2.0]]


def test_collate_gives_a_per_sample_list_when_they_differ():
    differing_shapes = [boxes(1), boxes(3)]
    c = twt.collate(differing_shapes)
    assert isinstance(c, list) and len(c) == 2 and all(a is b for a, b in zip(c, differing_shapes))
    c = twt.collate([boxes(2, canvas=(1, 1)), boxes(2, canvas=(2, 2))])
    assert isinstance(c, list) and [b.canvas_size for b in c] == [(1, 1), (2, 2)]
    mixed = twt.collate([boxes(2), plain(boxes(2))])
    assert isinstance(mixed, list) and type(mixed[0]) is tv_tensors.BoundingBoxes


def test_collate_of_plain_structures_matches_default_collate():
    samples = [{"x": torch.full((2,), i), "y": i, "n": Pair(i, float(i))} for i in range(4)]
    ours, theirs = twt.collate(samples), torch.utils.data.default_collate(samples)
    assert torch.equal(ours["x"], theirs["x"]) and torch.equal(ours["y"], theirs["y"])
    assert type(ours["n"]) is Pair and torch.equal(ours["n"].b, theirs["n"].b)
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        twt.collate([torch.zeros(2), torch.zeros(3)])


# ---- DataLoader ----------------------------------------------------------------------------------------------------


class Detection(torch.utils.data.Dataset):
    def __init__(self, n: int = 24, crash_at: int | None = None, raise_at: int | None = None) -> None:
        self.n, self.crash_at, self.raise_at = n, crash_at, raise_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if i == self.crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.raise_at:
            raise KeyError(f"sample {i} is broken")
        g = torch.Generator().manual_seed(i)
        return {
            "image": tv_tensors.Image(torch.randint(0, 255, (3, 6, 5), dtype=torch.uint8, generator=g)),
            "boxes": boxes(1 + i % 4, seed=i),
            "mask": tv_tensors.Mask(torch.rand(6, 5, generator=g) > 0.5),
            "units": units(torch.rand(2, generator=g).tolist(), unit="m"),
            "label": i,
            "name": f"s{i}",
        }


class ScaledDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> torch.Tensor:
        return scaled([float(i)] * 2, 0.25)


def check_batch(b: dict, ds: Detection) -> None:
    labels = b["label"].tolist()
    assert type(b["image"]) is tv_tensors.Image and type(b["mask"]) is tv_tensors.Mask
    assert type(b["units"]) is Units and b["units"].unit == "m"
    assert isinstance(b["boxes"], list) and len(b["boxes"]) == len(labels)
    assert b["name"] == [f"s{i}" for i in labels]
    for j, i in enumerate(labels):
        s = ds[i]
        assert torch.equal(plain(b["image"][j]), plain(s["image"]))
        assert torch.equal(plain(b["mask"][j]), plain(s["mask"]))
        assert torch.equal(plain(b["units"][j]), plain(s["units"]))
        assert_same_tv(b["boxes"][j], s["boxes"])


def open_fds() -> dict:
    out = {}
    for f in os.listdir("/proc/self/fd"):
        try:
            out[f] = os.readlink(f"/proc/self/fd/{f}")
        except OSError:  # the listing's own fd
            pass
    return out


def memfd_maps() -> int:
    with open("/proc/self/maps") as f:
        return sum("memfd:" in line for line in f)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batches_keep_types_and_values(num_workers):
    ds = Detection(24)
    loader = twt.DataLoader(ds, batch_size=5, num_workers=num_workers, shuffle=True,
                            generator=torch.Generator().manual_seed(0))
    assert isinstance(loader, torch.utils.data.DataLoader)
    seen = []
    for b in loader:
        check_batch(b, ds)
        b["image"].add_(1)  # batches are writable, as torch's are
        seen += b["label"].tolist()
    assert sorted(seen) == list(range(24))


def _refuse_torch_pickling(marker: str, worker_id: int) -> None:
    """worker_init_fn: any tensor data pickled in this worker (torch's own path: a shared-memory file and one fd per
    storage) leaves a marker file and raises."""
    from multiprocessing.reduction import ForkingPickler

    def refuse(*a):
        with open(marker, "a") as f:
            f.write(f"worker {worker_id} pickled tensor data\n")
        raise AssertionError("a worker pickled tensor data")

    for cls in [torch.Tensor, torch.UntypedStorage, torch.storage.TypedStorage] + list(torch._storage_classes):
        ForkingPickler.register(cls, refuse)


def test_dataloader_workers_pickle_no_tensor_data(tmp_path):
    import functools

    ds = Detection(12)
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    for b in twt.DataLoader(ds, batch_size=4, num_workers=2, worker_init_fn=functools.partial(_refuse_torch_pickling, ours)):
        check_batch(b, ds)
    assert not os.path.exists(ours)
    # the check can fail: torch's own DataLoader pickles its batches' tensors (its queue's feeder thread then
    # fails, and no batch arrives)
    with pytest.raises(RuntimeError, match="timed out"):
        list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, timeout=3, collate_fn=twt.collate,
                                         worker_init_fn=functools.partial(_refuse_torch_pickling, theirs)))
    assert "pickled tensor data" in open(theirs).read()


class ManyBoxes(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 600

    def __getitem__(self, i: int):
        return boxes(1 + i % 3, seed=i)


def test_dataloader_batches_larger_than_a_workers_ring():
    # 300 per-sample box tensors per batch: more than a worker's ring holds at once
    ds = ManyBoxes()
    loader = twt.DataLoader(ds, batch_size=300, num_workers=2, prefetch_factor=2)
    out = []
    for b in loader:
        assert isinstance(b, list) and len(b) == 300
        out.extend(b)
    assert len(out) == 600 and all(torch.equal(plain(out[i]), plain(ds[i])) for i in (0, 299, 300, 599))


def test_dataloader_leaks_nothing_and_uses_no_fd_per_tensor():
    ds = Detection(40)
    list(twt.DataLoader(ds, batch_size=4, num_workers=2))  # first use: imports, thread pools
    gc.collect()
    fds, maps = open_fds(), memfd_maps()
    peak = 0
    for _ in range(2):
        for b in twt.DataLoader(ds, batch_size=4, num_workers=2):
            peak = max(peak, len(open_fds()))
            del b
    # while running: the workers' pipes and queues, one socket and a few pool segments per worker, whatever the
    # number of tensors (10 batches x 7 tensors)
    assert peak - len(fds) < 30, f"{peak - len(fds)} more fds open at the peak: {open_fds()}"
    # Back to where it started: the last workers' sockets and the pool's segments go as their threads finish, which
    # may be a moment after the loop (bounded: 10 s).
    deadline = time.monotonic() + 10
    while True:
        gc.collect()
        extra = {k: v for k, v in open_fds().items() if fds.get(k) != v}
        if (not extra and memfd_maps() == maps) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert extra == {} and memfd_maps() == maps, f"left open: {extra}; mappings {memfd_maps()} (were {maps})"


def test_dataloader_persistent_workers_and_pin_memory_without_gpu():
    ds = Detection(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns that there is no accelerator to pin for
        loader = twt.DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, pin_memory=True)
        for _ in range(2):
            for b in loader:
                check_batch(b, ds)
    del loader


def test_dataloader_persistent_workers_survive_an_epoch_left_early():
    ds = Detection(40)
    loader = twt.DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True, prefetch_factor=4)
    it = iter(loader)
    check_batch(next(it), ds)  # then leave: torch discards the prefetched batches when the next epoch starts
    tr = twdl._transports[it._tw_token]
    for _ in range(2):
        labels = []
        for b in loader:
            check_batch(b, ds)
            labels += b["label"].tolist()
        assert labels == list(range(40))
        assert loader._iterator is it
        # The discarded batches' tensors reached the main process (each worker sends in order, and its later batches
        # were taken): they were dropped, not kept until the iterator dies.
        assert tr.pending() == 0
    del it, loader


def test_dataloader_with_spawned_workers_and_a_registered_codec(scaled_registered):
    ds = ScaledDataset()
    loader = twt.DataLoader(ds, batch_size=3, num_workers=2, multiprocessing_context="spawn")
    out = list(loader)
    assert [type(b) for b in out] == [Scaled, Scaled]
    assert out[0].scale == 0.25 and out[1].tolist() == [[3.0, 3.0], [4.0, 4.0], [5.0, 5.0]]


def test_dataloader_pins_on_torchs_pin_thread(monkeypatch):
    # No GPU here: pretend there is an accelerator, so that torch starts its pin thread, and record where
    # tensorwire.torch pins (the real pinning runs in make test-gpu).
    import threading

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cpu"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda i: None)
    monkeypatch.setattr(twt, "_accelerator", lambda: True)
    where = []

    def fake_pin(x):
        where.append(threading.current_thread() is threading.main_thread())
        return x

    monkeypatch.setattr(twt, "_pin_tensor", fake_pin)
    ds = Detection(12)
    for b in twt.DataLoader(ds, batch_size=4, num_workers=2, pin_memory=True):
        check_batch(b, ds)
    assert where and not any(where)  # every tensor went through twt.pin, none on the main thread


def test_dataloader_worker_exception_is_reraised_as_torch_does():
    loader = twt.DataLoader(Detection(12, raise_at=5), batch_size=2, num_workers=2)
    with pytest.raises(KeyError, match="sample 5 is broken"):
        list(loader)


def test_dataloader_killed_worker_surfaces_as_torch_error():
    loader = twt.DataLoader(Detection(12, crash_at=5), batch_size=2, num_workers=2, timeout=30)
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
        list(loader)


def test_dataloader_takes_torch_arguments_and_a_custom_collate():
    ds = Detection(8)
    loader = twt.DataLoader(ds, 4, False, num_workers=2, collate_fn=lambda s: [x["boxes"] for x in s])
    out = list(loader)
    assert len(out) == 2 and all(type(b) is tv_tensors.BoundingBoxes for batch in out for b in batch)
    assert_same_tv(out[1][0], ds[4]["boxes"])
    # no automatic batching: samples pass through (torch's default_convert)
    s = next(iter(twt.DataLoader(ds, batch_size=None, num_workers=2)))
    assert type(s["boxes"]) is tv_tensors.BoundingBoxes and s["label"] == 0


class Names(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 7

    def __getitem__(self, i: int):
        return {"name": f"s{i}", "n": i}


def test_dataloader_batches_with_no_tensor_to_send(monkeypatch):
    monkeypatch.setattr(twdl, "_RECV_TIMEOUT", 20.0)  # (a regression would wait for this, then raise)
    ds = Names()
    names = list(twt.DataLoader(ds, batch_size=3, num_workers=1, collate_fn=lambda s: [x["name"] for x in s]))
    assert names == [["s0", "s1", "s2"], ["s3", "s4", "s5"], ["s6"]]
    samples = list(twt.DataLoader(ds, batch_size=None, num_workers=1))  # an int stays an int: no tensor at all
    assert samples == [ds[i] for i in range(7)]


def test_a_failure_on_a_drain_thread_is_raised_where_the_batch_is_taken(monkeypatch):
    def broken(t):
        raise OSError("injected drain failure")

    monkeypatch.setattr(twdl, "_own_copy", broken)  # called by the main process's drain thread only
    monkeypatch.setattr(twdl, "_RECV_TIMEOUT", 20.0)
    with pytest.raises(RuntimeError, match="receiving from worker 0 failed: OSError: injected drain failure") as e:
        list(twt.DataLoader(Detection(8), batch_size=4, num_workers=1))
    assert isinstance(e.value.__cause__, OSError) and "did not arrive" not in str(e.value)


class Layouts(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5) + i
        f8 = torch.full((3,), float(i + 1)).to(torch.float8_e4m3fn)
        return {"cl": x.to(memory_format=torch.channels_last), "t": x[0, 0].T, "f8": f8}


def test_dataloader_keeps_a_channels_last_layout_and_leaves_float8_to_torch():
    ds = Layouts()
    out = list(twt.DataLoader(ds, batch_size=None, num_workers=1))
    for i, s in enumerate(out):
        ref = ds[i]
        assert s["cl"].stride() == ref["cl"].stride() == (60, 1, 15, 3) and torch.equal(s["cl"], ref["cl"])
        assert s["cl"].is_contiguous(memory_format=torch.channels_last)
        assert s["t"].stride() == ref["t"].stride() == (1, 5) and torch.equal(s["t"], ref["t"])
        # float8 cannot come back from DLPack in this torch: the worker leaves it to torch's pickling
        assert s["f8"].dtype == torch.float8_e4m3fn
        assert torch.equal(s["f8"].view(torch.uint8), ref["f8"].view(torch.uint8))


def test_dataloader_refuses_a_stray_subscriber_and_starts_no_thread_before_the_fork(monkeypatch):
    # Iterators of earlier tests that raised are kept alive by a reference cycle (the exception's traceback) until a
    # garbage collection, which would otherwise happen at a moment that depends on timing: collected now, and their
    # drain threads given (bounded) time to finish, so that every thread this test sees at the fork is this test's.
    gc.collect()
    until = time.monotonic() + 30
    while any(t.name.startswith("tensorwire-dataloader") for t in threading.enumerate()) and time.monotonic() < until:
        time.sleep(0.01)
    assert not any(t.name.startswith("tensorwire-dataloader") for t in threading.enumerate()), \
        "an earlier test's DataLoader threads are still running"
    at_fork: list = []
    recording = [True]

    def record():
        if recording:
            at_fork.append(sorted(t.name for t in threading.enumerate()))

    os.register_at_fork(before=record)  # (cannot be unregistered: it stops recording when the test ends)
    closing_at_shutdown = []
    base = torch.utils.data.dataloader._MultiProcessingDataLoaderIter
    real_shutdown = base._shutdown_workers

    def shutdown(self):
        tr = twdl._transports.get(self._tw_token)
        # (an iterator of an earlier test that the garbage collector finalizes now passes here too: told apart)
        closing_at_shutdown.append((id(self), tr is not None and tr.closing))
        return real_shutdown(self)

    monkeypatch.setattr(base, "_shutdown_workers", shutdown)
    try:
        ds = Detection(12)
        it = iter(twt.DataLoader(ds, batch_size=2, num_workers=1, multiprocessing_context="fork"))
        check_batch(next(it), ds)
        # the worker's publisher exists (it sent this batch) and serves the main process: a stray subscriber to
        # its predictable topic is refused, so it can never block the worker's sends
        with pytest.raises(ValueError, match="max_subscribers"):
            tw.Subscriber(twdl._topic(it._tw_token, 0))
        rest = list(it)
        assert [b["label"].tolist() for b in rest] == [[2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    finally:
        recording.clear()
    assert at_fork and not any(n.startswith("tensorwire-dataloader") for names in at_fork for n in names)
    # take() raises before torch joins its pin thread
    assert [closing for who, closing in closing_at_shutdown if who == id(it)] == [True]


# ---- contiguous_inputs ---------------------------------------------------------------------------------------------


def test_contiguous_inputs_is_free_for_contiguous_tensors():
    seen = []

    def impl(x, w, *, b=None):
        seen.append((x, w, b))
        return x

    op = twt.contiguous_inputs(impl)

    x, w, b = torch.randn(3, 4), torch.randn(4), torch.randn(4)
    op(x, w, b=b)
    assert seen[-1][0] is x and seen[-1][1] is w and seen[-1][2] is b
    op(x.T, [w, w[::2]], b=b.expand(2, 4))
    sx, sw, sb = seen[-1]
    assert sx.is_contiguous() and torch.equal(sx, x.T)
    assert isinstance(sw, list) and sw[0] is w and sw[1].is_contiguous() and torch.equal(sw[1], w[::2])
    assert sb.is_contiguous() and torch.equal(sb, b.expand(2, 4))
    assert op.__name__ == "impl" and op.__wrapped__ is impl and inspect.signature(op) == inspect.signature(impl)


def test_contiguous_inputs_copies_written_arguments_back():
    @twt.contiguous_inputs(mutates=("out",))
    def fill(x, out):
        assert out.is_contiguous()
        out.copy_(x * 2)

    x = torch.arange(6.0).reshape(2, 3)
    out = torch.zeros(3, 2).T  # a transposed destination
    fill(x, out)
    assert torch.equal(out, x * 2)
    base = torch.full((2, 6), -1.0)
    fill(x, out=base[:, ::2])  # keyword, strided
    assert torch.equal(base[:, ::2], x * 2) and bool((base[:, 1::2] == -1).all())  # written back, in place only
    with pytest.raises(ValueError, match="overlap"):
        fill(x, torch.zeros(1, 3).expand(2, 3))
    with pytest.raises(ValueError, match="no parameter"):
        twt.contiguous_inputs(mutates=("nope",))(lambda x: x)

    @twt.contiguous_inputs(mutates=("out",))
    def add_into(a, b, out):  # returns what it wrote, as torch's out= ops do
        return torch.add(a, b, out=out)

    o = torch.zeros(3, 2).T
    r = add_into(x, x, o)
    assert r is o and torch.equal(o, x * 2)  # the caller's tensor, not the contiguous copy it was handed

    @twt.contiguous_inputs(mutates=("out",))
    def pair(a, out):
        out.copy_(a)
        return a, out

    o2 = torch.zeros(3, 2).T
    first, second = pair(x, o2)
    assert second is o2 and torch.equal(o2, x)


def test_contiguous_inputs_fixes_and_writes_back_tensors_passed_in_kwargs():
    @twt.contiguous_inputs(mutates=("out",))
    def fill(x, **kw):
        assert x.is_contiguous() and all(v.is_contiguous() for v in kw.values()), [v.stride() for v in kw.values()]
        kw["out"].copy_(x * kw["scale"])
        kw["scale"].zero_()  # not named in mutates: the caller's tensor is not written

    x = torch.arange(6.0).reshape(2, 3)
    base = torch.full((2, 6), -1.0)
    scale = torch.full((3, 2), 2.0).T
    fill(x, out=base[:, ::2], scale=scale)
    assert torch.equal(base[:, ::2], x * 2) and bool((base[:, 1::2] == -1).all())
    assert bool((scale == 2).all())
    with pytest.raises(ValueError, match="'out' is written, and its elements overlap"):
        fill(x, out=torch.zeros(1, 3).expand(2, 3), scale=scale)

    @twt.contiguous_inputs(mutates=("kw",))  # **kwargs named: every keyword is written back
    def fill_all(**kw):
        for v in kw.values():
            assert v.is_contiguous()
            v.fill_(7.0)

    a, b = torch.zeros(3, 2).T, torch.zeros(2, 6)[:, ::3]
    fill_all(a=a, b=b)
    assert bool((a == 7).all()) and bool((b == 7).all())


def test_contiguous_refuses_what_is_not_a_tensor_and_copies_with_tensorwires_engine(monkeypatch):
    with pytest.raises(TypeError, match=r"contiguous: expects a torch\.Tensor, got numpy\.ndarray"):
        twt.contiguous(np.zeros((3, 2)).T)
    real = twt.asarray
    copies = []

    class Spy:
        def __init__(self, t):
            self.t = t

        def copy(self, *a, **k):
            c = self.t.copy(*a, **k)
            copies.append(c)
            return c

    monkeypatch.setattr(twt, "asarray", lambda x, *a, **k: Spy(real(x, *a, **k)))
    x = torch.randn(4, 3).T
    y = twt.contiguous(x)
    assert y.is_contiguous() and torch.equal(y, x)
    assert len(copies) == 1 and y.data_ptr() == copies[0].data_ptr  # y is the memory tensorwire's engine wrote
    # a dtype DLPack cannot carry back is PyTorch's to copy, without asking tensorwire
    f8 = torch.randn(4, 3).to(torch.float8_e4m3fn).T
    c = twt.contiguous(f8)
    assert c.is_contiguous() and c.dtype == f8.dtype
    assert torch.equal(c.view(torch.uint8), f8.contiguous().view(torch.uint8))
    assert len(copies) == 1

    # an engine failure is raised, never hidden behind a silent fallback
    def broken(x, *a, **k):
        raise RuntimeError("engine broke")

    monkeypatch.setattr(twt, "asarray", broken)
    with pytest.raises(RuntimeError, match="engine broke"):
        twt.contiguous(x)


def test_contiguous_keeps_subclasses():
    bt = tv_tensors.BoundingBoxes(torch.rand(4, 3).T, format="XYXY", canvas_size=(2, 2))
    c = twt.contiguous(bt)
    assert c.is_contiguous() and type(c) is tv_tensors.BoundingBoxes and c.canvas_size == (2, 2)
    assert torch.equal(plain(c), plain(bt))


def ref_op(x, w):
    return (x * w).sin().sum(-1)


@pytest.mark.parametrize(
    "make",
    [
        lambda g: (torch.randn(5, 4, generator=g), torch.randn(4, generator=g)),
        lambda g: (torch.randn(4, 5, generator=g).T, torch.randn(8, generator=g)[::2]),
        lambda g: (torch.randn(1, 4, generator=g).expand(5, 4), torch.randn(1, generator=g).expand(4)),
        lambda g: (torch.randn(5, 8, generator=g)[:, 1::2], torch.randn(4, generator=g)),
    ],
    ids=["contiguous", "transposed", "expanded", "sliced"],
)
def test_gradients_of_a_decorated_op_match_the_reference(make):
    seen = []

    @twt.contiguous_inputs
    def op(x, w):
        seen.append((x.is_contiguous(), w.is_contiguous()))
        return ref_op(x, w)

    def grads(f, loss):
        x, w = make(torch.Generator().manual_seed(1))
        x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
        # a view of the leaf: autograd's gradients of views are strided too
        loss(f(x.T.T, w)).backward()
        return x.grad, w.grad

    for loss in (lambda y: y.sum(), lambda y: (y * torch.arange(5.0)).sum()):
        gx, gw = grads(op, loss)
        rx, rw = grads(ref_op, loss)
        # (reductions sum in layout order: a contiguous input sums in another order than a strided one)
        torch.testing.assert_close(gx, rx, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(gw, rw, rtol=1e-6, atol=1e-6)
    assert all(a and b for a, b in seen)


def test_forward_mode_ad_and_torch_func_flow_through_contiguous():
    # A dual tensor does not require grad: its tangent was dropped by the engine's copy (silently None), and
    # torch.func.grad refused the autograd.Function. Under either, PyTorch's own contiguous() does the copy.
    import torch.autograd.forward_ad as fwAD
    x = torch.randn(4, 3).T
    with fwAD.dual_level():
        d = fwAD.make_dual(x, torch.full_like(x, 2.0))
        y = twt.contiguous(d)
        assert y.is_contiguous() and torch.equal(fwAD.unpack_dual(y).primal, x)
        assert torch.equal(fwAD.unpack_dual(y).tangent, torch.full_like(x, 2.0))

    @twt.contiguous_inputs
    def total(a):
        assert a.is_contiguous()
        return (a * a).sum()
    assert torch.allclose(torch.func.grad(total)(x), 2 * x)
    assert torch.allclose(torch.func.jacrev(lambda a: twt.contiguous(a).sum(0))(x).sum(), torch.tensor(12.0))


def test_contiguous_inputs_on_a_custom_op_with_backward():
    @torch.library.custom_op("tw_tests::scale_rows", mutates_args=())
    @twt.contiguous_inputs
    def scale_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        assert x.is_contiguous() and w.is_contiguous()
        return x * w

    @scale_rows.register_fake
    def _(x, w):
        return x.new_empty(x.shape)

    @torch.library.custom_op("tw_tests::scale_rows_bwd", mutates_args=())
    @twt.contiguous_inputs
    def scale_rows_bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert g.is_contiguous(), g.stride()
        return g * w, (g * x).sum(0)

    @scale_rows_bwd.register_fake
    def _(g, x, w):
        return x.new_empty(x.shape), w.new_empty(w.shape)

    scale_rows.register_autograd(
        lambda ctx, g: scale_rows_bwd(g, *ctx.saved_tensors),
        setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs),
    )
    x = torch.randn(4, 3).T.detach().requires_grad_(True)
    w = torch.randn(4).requires_grad_(True)
    scale_rows(x, w).sum().backward()  # an expanded (stride-0) gradient reaches the backward op
    torch.testing.assert_close(x.grad, w.detach().expand(3, 4))
    torch.testing.assert_close(w.grad, x.detach().sum(0))
    torch.library.opcheck(scale_rows, (x, w))


_DTYPES = [torch.float32, torch.float64, torch.int8, torch.uint8, torch.int64, torch.bool, torch.bfloat16,
           torch.float16, torch.complex64]


@st.composite
def strided_tensors(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    ndim = draw(st.integers(0, 4))
    shape = [draw(st.integers(0, 5)) for _ in range(ndim)]
    steps = [draw(st.integers(1, 3)) for _ in range(ndim)]
    base_shape = [max(1, n * s) + draw(st.integers(0, 2)) for n, s in zip(shape, steps)]
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    base = (torch.rand(base_shape or [1], generator=g) * 100 - 50).to(dtype) if ndim else torch.tensor(3.5).to(dtype)
    if ndim == 0:
        return base
    offs = [draw(st.integers(0, b - (n - 1) * s - 1)) if n else 0 for n, s, b in zip(shape, steps, base_shape)]
    x = base[tuple(slice(o, o + (n - 1) * s + 1 if n else o, s) for o, n, s in zip(offs, shape, steps))]
    if draw(st.booleans()) and ndim >= 2:
        x = x.transpose(0, ndim - 1)
    if draw(st.booleans()) and ndim >= 1:  # a broadcast (stride-0) dimension in front
        x = x.unsqueeze(0).expand(2, *x.shape)
    return x


def bits(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    fresh = torch.empty(t.shape, dtype=t.dtype).copy_(plain(t))
    return fresh.reshape(-1).view(torch.uint8).numpy().tobytes()


@given(strided_tensors(), st.booleans())
def test_property_contiguous_and_round_trips_are_bit_exact(x, as_units):
    if as_units:
        x = x.as_subclass(Units)
        x.unit = "m"
    c = twt.contiguous(x)
    assert c.is_contiguous() and c.shape == x.shape and c.dtype == x.dtype
    assert bits(c) == bits(x)
    assert type(c) is type(x)
    y = twt.to_torch(twt.from_torch(x))
    assert y.stride() == x.stride() and y.shape == x.shape
    if x.numel():
        assert y.data_ptr() == x.data_ptr()
    assert bits(y) == bits(x)
    col = twt.collate([x, x])
    assert type(col) is type(x) and torch.equal(plain(col), torch.stack([plain(x), plain(x)]))


def test_contiguous_inputs_passes_sparse_tensors_through():
    # (a sparse argument raised "unsupported memory format option Contiguous": sparse tensors have no strides)
    @twt.contiguous_inputs
    def spmm(a, x):
        assert x.is_contiguous()
        return torch.sparse.mm(a, x)

    coo = torch.eye(3).to_sparse()
    assert spmm(coo, torch.ones(2, 3).T).tolist() == [[1.0] * 2] * 3
    assert twt.contiguous(coo) is coo and twt.contiguous(torch.eye(3).to_sparse_csr()).layout == torch.sparse_csr

    @twt.contiguous_inputs(mutates=("out",))
    def into(a, out):
        out.copy_(torch.sparse.mm(a, torch.ones(3, 2)))

    out = torch.zeros(2, 3).T
    into(coo, out=out)
    assert out.tolist() == [[1.0] * 2] * 3


def test_to_torch_takes_a_list_of_numbers_as_array_data_as_tw_to_torch_does():
    # (it was a list of 0-d tensors)
    assert twt.to_torch([1, 2, 3]).tolist() == tw.to_torch([1, 2, 3]).tolist() == [1, 2, 3]
    assert twt.to_torch([[1.5, 2], (3, np.float32(4))]).shape == (2, 2)
    parts = twt.to_torch([tw.zeros(2), tw.zeros(3)])  # a message of tensors: part by part
    assert isinstance(parts, list) and [p.shape for p in parts] == [(2,), (3,)]


def test_float4_goes_back_to_torch_through_a_dlpack_1_1_capsule():
    x = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4).view(torch.float4_e2m1fn_x2)
    t = tw.asarray(x)
    for y in (tw.to_torch(t), twt.to_torch(t)):
        assert y.dtype == torch.float4_e2m1fn_x2 and y.data_ptr() == x.data_ptr()
        assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


class _Pair(tuple):
    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))

    def __reduce__(self):
        return (_Pair, tuple(self))


class _Three(tuple):
    def __new__(cls, a, b, c):
        return super().__new__(cls, (a, b))


class _Star(tuple):
    def __new__(cls, *items):
        return super().__new__(cls, items)


def test_a_tuple_subclass_keeps_its_type_when_its_constructor_takes_the_items():
    # (twt.DataLoader raised "Pair.__new__() missing 1 required positional argument" where torch's loader works)
    same = twt._tree_map(_Pair(torch.zeros(1), torch.ones(1)), lambda v: v + 1, lambda v: isinstance(v, torch.Tensor))
    assert type(same) is _Pair and [v.tolist() for v in same] == [[1.0], [2.0]]
    odd = twt._tree_map(_Three(torch.zeros(1), torch.ones(1), None), lambda v: v, lambda v: isinstance(v, torch.Tensor))
    assert type(odd) is list and len(odd) == 2  # neither constructor fits: a list, as torch's default_collate
    star = twt._tree_map(_Star(torch.zeros(1), torch.ones(2)), lambda v: v, lambda v: isinstance(v, torch.Tensor))
    assert type(star) is _Star and [v.shape for v in star] == [(1,), (2,)]  # (not a 1-tuple holding a list)
    loader = twt.DataLoader(list(range(8)), batch_size=4, num_workers=1,
                            collate_fn=lambda b: _Pair(torch.tensor(b), torch.tensor(b) * 2))
    batches = list(loader)
    assert [type(b) for b in batches] == [_Pair, _Pair]
    assert [v.tolist() for v in batches[1]] == [[4, 5, 6, 7], [8, 10, 12, 14]]


class _Aliased(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        x = torch.full((3,), float(i))
        return {"a": x, "b": x, "c": [x, torch.zeros(2)]}


def test_a_tensor_in_two_places_of_a_batch_arrives_as_one_tensor_as_with_torchs_loader():
    # (each place got a copy of its own: a write through one did not show through the other, and it crossed twice)
    for num_workers in (0, 1):
        b = next(iter(twt.DataLoader(_Aliased(), batch_size=None, num_workers=num_workers)))
        ref = next(iter(torch.utils.data.DataLoader(_Aliased(), batch_size=None, num_workers=num_workers)))
        assert (b["a"] is b["b"] is b["c"][0]) and (ref["a"] is ref["b"])
        assert b["c"][1] is not b["a"]


def test_a_copy_for_pytorch_keeps_a_dense_layouts_order_as_clone_does():
    # (a received channels_last tensor is read-only, so to_torch copies it: the copy was C order, undoing the order
    # the transport kept)
    c = torch.arange(120.0).reshape(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    r = tw.asarray(c).as_readonly()
    for y in (tw.to_torch(r), twt.to_torch(r, copy=True), tw.to_torch(c, copy=True)):
        assert y.is_contiguous(memory_format=torch.channels_last) and torch.equal(y, c) and y.data_ptr() != c.data_ptr()
    rev = tw.asarray(np.arange(6.0)[::-1])  # negative strides: PyTorch refuses them, the copy is dense and forward
    assert tw.to_torch(rev).stride() == (1,) and tw.to_torch(rev).tolist() == [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]


def test_a_one_item_tuple_subclass_taking_items_keeps_its_item():
    one = twt._tree_map(_Star(torch.zeros(1)), lambda v: v + 1, lambda v: isinstance(v, torch.Tensor))
    assert type(one) is _Star and len(one) == 1 and one[0].tolist() == [1.0]

    class Cloning(tuple):  # a constructor that makes new items from the iterable it is given
        def __new__(cls, items):
            return super().__new__(cls, [x.clone() for x in items])

    made = twt._tree_map(Cloning([torch.zeros(1), torch.ones(1)]), lambda v: v, lambda v: isinstance(v, torch.Tensor))
    assert type(made) is Cloning and [v.tolist() for v in made] == [[0.0], [1.0]]
