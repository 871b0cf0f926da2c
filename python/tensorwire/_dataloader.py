"""tensorwire.torch.DataLoader: torch's DataLoader whose workers hand batches over through tensorwire shared memory.

Each worker owns one tw.Publisher (one pool of reused shared-memory segments); the main process subscribes to every
worker before starting them. A worker collates (keeping subclasses), sends the batch's CPU tensors in a few
messages, and puts only a small skeleton on torch's result queue: the batch's structure with references in place of
tensors, the subclasses' classes and attributes, and everything that is not a tensor. No file descriptor per tensor,
no pickling of tensor data. The main process receives the messages and copies each tensor once into memory of its
own (tensorwire's buffer cache, so steady-state batches fault no fresh pages): batches are writable, as torch's are,
and the worker's pool buffers return at once. Everything else (ordering, worker crashes, timeouts, shutdown) is
torch's own machinery.
"""

from __future__ import annotations

import inspect
import itertools
import os
import threading
import time
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import get_worker_info
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from . import torch as _twt
from ._tensorwire import Publisher, Subscriber, asarray

_MAX_TENSORS_PER_MESSAGE = 31
_RECV_TIMEOUT = 60.0  # the data is sent before its skeleton is queued, so a receive waits only for a dead worker
_counter = itertools.count()


def _topic(token: str, worker_id: int) -> str:
    return f"twdl.{token}.{worker_id}"


class _Ref:
    """A tensor's place in a skeleton: the index of its plain data among the batch's sent tensors, and its class and
    in-process state (the class is pickled by reference, like any object a worker returns to torch)."""

    __slots__ = ("index", "cls", "state")

    def __init__(self, index: int, cls: type, state: Any) -> None:
        self.index, self.cls, self.state = index, cls, state

    def __reduce__(self) -> Any:
        return (_Ref, (self.index, self.cls, self.state))


class _Batch:
    """What a worker puts on torch's result queue instead of the batch."""

    __slots__ = ("token", "worker_id", "batch_no", "parts", "count", "skeleton", "__weakref__")

    def __init__(self, token: str, worker_id: int, batch_no: int, parts: int, count: int, skeleton: Any) -> None:
        self.token, self.worker_id, self.batch_no = token, worker_id, batch_no
        self.parts, self.count, self.skeleton = parts, count, skeleton

    def __reduce__(self) -> Any:
        return (_Batch, (self.token, self.worker_id, self.batch_no, self.parts, self.count, self.skeleton))

    def pin_memory(self, device: Any = None) -> Any:
        """Called by torch's pin-memory thread: receive the batch and pin it (subclasses kept)."""
        return _twt.pin(_resolve(self))


# ---- the worker side ---------------------------------------------------------------------------------------------

_worker_state: dict[str, Any] = {}  # token -> [publisher, batches sent]


class _WorkerCollate:
    """The collate_fn the workers run: the user's (or tensorwire.torch.collate), then the hand-over."""

    def __init__(self, fn: Any, token: str, depth: int) -> None:
        self.fn, self.token, self.depth = fn, token, depth

    def __call__(self, samples: Any) -> Any:
        batch = self.fn(samples)
        info = get_worker_info()
        if info is None:  # not in a worker (someone called the loader's collate_fn directly)
            return batch
        return _hand_over(batch, self.token, info.id, self.depth)


def _publisher(token: str, worker_id: int, depth: int) -> list:
    st = _worker_state.get(token)
    if st is None:
        pub = Publisher(_topic(token, worker_id), depth=depth, on_full="block", max_metadata_bytes=1024)
        deadline = time.monotonic() + _RECV_TIMEOUT
        while pub.subscribers < 1:  # the main process subscribed before starting us: this is immediate
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensorwire DataLoader worker {worker_id}: the main process never subscribed")
            time.sleep(0.001)
        st = _worker_state[token] = [pub, 0]
        import multiprocessing.util

        multiprocessing.util.Finalize(None, pub.close, exitpriority=16)
    return st


def _hand_over(batch: Any, token: str, worker_id: int, depth: int) -> Any:
    tensors: list = []

    def leaf(x: torch.Tensor) -> Any:
        if x.device.type != "cpu" or x.layout != torch.strided or x.requires_grad:
            return x  # left to torch's own pickling (CUDA, sparse, autograd state)
        cls, state = _twt._state(x)
        plain = _twt._plain(x)
        try:
            t = asarray(plain)
        except Exception:
            return x  # a dtype or state DLPack cannot carry: torch's pickling
        tensors.append(t)
        return _Ref(len(tensors) - 1, cls, state)

    skeleton = _twt._tree_map(batch, leaf, lambda v: isinstance(v, torch.Tensor))
    st = _publisher(token, worker_id, depth)
    pub, batch_no = st
    st[1] += 1
    parts = 0
    for i in range(0, len(tensors), _MAX_TENSORS_PER_MESSAGE):
        chunk = tensors[i : i + _MAX_TENSORS_PER_MESSAGE]
        pub.send(chunk, metadata={"batch": batch_no, "part": parts}, timeout=_RECV_TIMEOUT)
        parts += 1
    return _Batch(token, worker_id, batch_no, parts, len(tensors), skeleton)


# ---- the main side -----------------------------------------------------------------------------------------------

_transports: dict[str, "_Transport"] = {}
_transports_lock = threading.Lock()


class _Transport:
    def __init__(self, token: str, num_workers: int) -> None:
        self.token = token
        self.subs = [Subscriber(_topic(token, w)) for w in range(num_workers)]

    def close(self) -> None:
        for s in self.subs:
            s.close()


def _resolve(b: Any) -> Any:
    if not isinstance(b, _Batch):
        return b
    with _transports_lock:
        tr = _transports.get(b.token)
    if tr is None:
        raise RuntimeError("tensorwire DataLoader: a batch arrived after its iterator was shut down")
    sub = tr.subs[b.worker_id]
    received: list = []
    part = 0
    while part < b.parts:
        try:
            msg = sub.recv(timeout=_RECV_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(
                f"tensorwire DataLoader: worker {b.worker_id}'s batch {b.batch_no} did not arrive within "
                f"{_RECV_TIMEOUT:.0f} s"
            ) from None
        tensors = msg if isinstance(msg, list) else [msg]
        md = tensors[0].metadata
        got_batch, got_part = md.get("batch"), md.get("part")
        if isinstance(got_batch, int) and got_batch < b.batch_no:
            # a batch torch discarded without processing (persistent workers reset between epochs)
            del msg, tensors, md
            continue
        if got_batch != b.batch_no or got_part != part:
            raise RuntimeError(
                f"tensorwire DataLoader: worker {b.worker_id} out of step (got batch {got_batch} part "
                f"{got_part}, expected batch {b.batch_no} part {part})"
            )
        # One copy into our own memory: batches are writable, as torch's are, and the leases end here.
        received.extend(torch.from_dlpack(t.copy()) for t in tensors)
        del msg, tensors, md
        part += 1
    if len(received) != b.count:
        raise RuntimeError(f"tensorwire DataLoader: worker {b.worker_id} sent {len(received)} of {b.count} tensors")

    def leaf(r: _Ref) -> Any:
        return _twt._rewrap(received[r.index], r.cls, r.state)

    return _twt._tree_map(b.skeleton, leaf, lambda v: isinstance(v, _Ref))


class _SingleIter(_SingleProcessDataLoaderIter):
    """num_workers=0: torch's iterator, but pinning keeps subclasses."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        self._tw_pin = self._pin_memory
        self._pin_memory = False

    def _next_data(self) -> Any:
        data = super()._next_data()
        return _twt.pin(data) if self._tw_pin else data


class _MultiIter(_MultiProcessingDataLoaderIter):
    def __init__(self, loader: Any) -> None:
        token = f"{os.getpid()}.{next(_counter)}.{os.urandom(3).hex()}"
        depth = (_MAX_TENSORS_PER_MESSAGE + 1) * (loader.prefetch_factor + 2)
        self._tw_token = token
        tr = _Transport(token, loader.num_workers)
        with _transports_lock:
            _transports[token] = tr
        user = loader.collate_fn
        loader.collate_fn = _WorkerCollate(user, token, depth)
        try:
            super().__init__(loader)
        except BaseException:
            self._tw_close()
            raise
        finally:
            loader.collate_fn = user

    def _process_data(self, data: Any, *args: Any) -> Any:
        data = super()._process_data(data, *args)  # (data, worker_idx) in torch >= 2.10, (data,) before
        return _resolve(data)

    def _tw_close(self) -> None:
        with _transports_lock:
            tr = _transports.pop(self._tw_token, None)
        if tr is not None:
            tr.close()

    def _shutdown_workers(self) -> None:
        try:
            super()._shutdown_workers()
        finally:
            self._tw_close()


_LOADER_PARAMS = inspect.signature(torch.utils.data.DataLoader.__init__)


class DataLoader(torch.utils.data.DataLoader):
    """torch.utils.data.DataLoader with the same arguments, whose batches keep tensor subclasses and their
    attributes (collation: tensorwire.torch.collate; pin_memory=True: tensorwire.torch.pin on torch's pin thread),
    and whose workers hand batches over through tensorwire shared memory (one pool per worker, no file descriptor
    per tensor, no pickling of tensor data). A custom collate_fn is used as given (its output's subclasses are
    still carried across the worker boundary)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = _LOADER_PARAMS.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        a.pop("self")
        extra = a.pop("kwargs", {}) if "kwargs" in a else {}
        auto = a.get("batch_size") is not None or a.get("batch_sampler") is not None
        if a.get("collate_fn") is None and auto:
            a["collate_fn"] = _twt.collate
        super().__init__(**a, **extra)

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return _SingleIter(self)
        self.check_worker_number_rationality()
        return _MultiIter(self)
