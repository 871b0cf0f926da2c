"""Pickling: protocol 5 hands CPU data out of band (PickleBuffer) so large tensors are never copied by pickle."""

from __future__ import annotations

import pickle


def reduce_ex(self, protocol: int):
    dev = self.device
    if not dev.host_accessible:
        raise TypeError(f"cannot pickle a tensor on {dev}: its memory is not host-accessible")
    c = self.contiguous()
    raw = c._byte_view()
    meta = c._meta_encode()
    if protocol >= 5:
        buf = pickle.PickleBuffer(raw)
    else:
        buf = bytes(memoryview(raw))
    return (_rebuild, (buf, str(self.dtype), self.shape, self.readonly, self.subbyte_padded, meta))


def _rebuild(buf, dtype: str, shape, readonly: bool, padded: bool, meta: bytes):
    from . import asarray

    # An out-of-band buffer comes back as whatever the receiver made of the bytes (pickle.loads(buffers=...)): any
    # C-contiguous buffer of the right size is taken as its bytes, as NumPy's unpickler does.
    view = memoryview(buf)
    if not view.c_contiguous:
        raise ValueError(f"pickled tensor: its out-of-band buffer (format {view.format!r}, shape {view.shape}) is not "
                         "C-contiguous, so it is not the bytes that were pickled")
    if view.nbytes == 0:
        view = memoryview(b"")  # (a cast refuses zeros in the shape)
    elif view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    raw = asarray(view)
    if raw.readonly and not readonly:
        raw = raw.copy()  # in-band bytes are immutable; the original was writable
    t = raw._from_bytes(dtype, shape, padded)
    t._meta_decode(meta)
    if readonly and not t.readonly:
        t = t.as_readonly()
    return t
