"""tensorwire.torch.DataLoader: torch's DataLoader whose workers hand batches over through tensorwire shared memory.

Each worker owns one tw.Publisher (one pool of reused shared-memory segments) that serves one subscriber: the main
process subscribes to every worker before starting them. A worker collates (keeping subclasses), sends the batch's
CPU tensors in a few messages, and puts only a small skeleton on torch's result queue: the batch's structure with
references in place of tensors, the subclasses' classes and attributes, and everything that is not a tensor (a batch
with no tensor to send sends nothing). No file descriptor per tensor, no pickling of tensor data. Once torch has
started the workers (no thread of ours exists when it forks), one thread per worker in the main process receives the
messages as they arrive and copies each tensor once into memory of its own, keeping a dense layout such as
channels_last (tensorwire's buffer cache, so steady-state batches fault no fresh pages): batches are writable, as
torch's are, and the worker's pool buffers return at once, so a worker's sends do not wait for a main process that
is busy elsewhere (how far workers run ahead is torch's prefetch_factor, as with torch's loader). A failure on that
thread is raised where the batch is taken. Everything else (ordering, worker crashes, timeouts, shutdown) is
torch's own machinery.

Left to torch's pickling: tensors that are not on the CPU, not strided, nested, that require grad, or whose dtype
DLPack cannot carry both ways (float8, quantized...); tensors inside objects other than mappings, lists, tuples
(namedtuples included) and dataclasses, which are not walked; tensor-valued attributes of a subclass instance (they
travel in the skeleton).
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
_RECV_TIMEOUT = 60.0  # the data is sent before its skeleton is queued: waiting longer means something broke
_counter = itertools.count()


def _topic(token: str, worker_id: int) -> str:
    return f"twdl.{token}.{worker_id}"


class _Ref:
    """A tensor's place in a skeleton: the index of its plain data among the batch's sent tensors, its class and
    in-process state (the class is pickled by reference, like any object a worker returns to torch), and, for a
    tensor dense in another order than C (channels_last), the permutation it was sent in (see _dense_order)."""

    __slots__ = ("index", "cls", "state", "perm")

    def __init__(self, index: int, cls: type, state: Any, perm: tuple[int, ...] | None = None) -> None:
        self.index, self.cls, self.state, self.perm = index, cls, state, perm

    def __reduce__(self) -> Any:
        return (_Ref, (self.index, self.cls, self.state, self.perm))


def _dense_order(x: torch.Tensor) -> tuple[int, ...] | None:
    """The permutation that makes x C-contiguous when x is dense in another order (channels_last), else None.
    x is sent as x.permute(perm), a free C-contiguous view, and the receiver permutes back, so the batch keeps the
    worker's layout (as torch's loader, which shares storages, keeps it) whatever the transport does with other
    orders (a publisher copies a dense layout as it is today; it packed every copy in C order before)."""
    if x.ndim < 2 or x.numel() == 0 or x.is_contiguous():
        return None
    perm = tuple(sorted(range(x.ndim), key=lambda d: -x.stride(d)))  # stable: ties keep their order
    return perm if x.permute(perm).is_contiguous() else None


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
        # One subscriber, the main process: a stray subscriber to this predictable topic is refused, never waited for.
        pub = Publisher(
            _topic(token, worker_id), depth=depth, on_full="block", max_metadata_bytes=1024, max_subscribers=1
        )
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
    # id -> (the tensor, what it became): a tensor in two places of a batch is sent once, as torch's pickling sends
    # it (the main process then hands out one tensor in both places, as torch's loader does)
    seen: dict[int, tuple[Any, Any]] = {}

    def leaf(x: torch.Tensor) -> Any:
        if id(x) not in seen:
            seen[id(x)] = (x, one(x))  # (x kept: a leaf made afresh on each access must not free its id for another)
        return seen[id(x)][1]

    def one(x: torch.Tensor) -> Any:
        if x.device.type != "cpu" or x.requires_grad or not _twt._dlpack_carries(x):
            return x  # left to torch's own pickling (CUDA, sparse, autograd state, float8...)
        cls, state = _twt._state(x)
        plain = _twt._plain(x)
        perm = _dense_order(plain)
        try:
            t = asarray(plain if perm is None else plain.permute(perm))
        except BufferError:
            return x  # the export was refused (state DLPack cannot describe): torch's pickling
        tensors.append(t)
        return _Ref(len(tensors) - 1, cls, state, perm)

    skeleton = _twt._tree_map(batch, leaf, lambda v: isinstance(v, torch.Tensor))
    st = _publisher(token, worker_id, depth)
    pub, batch_no = st
    st[1] += 1
    parts = 0
    for i in range(0, len(tensors), _MAX_TENSORS_PER_MESSAGE):
        chunk = tensors[i : i + _MAX_TENSORS_PER_MESSAGE]
        # No timeout: the main process drains continuously, and a closed or dead subscriber is never waited for.
        pub.send(chunk, metadata={"batch": batch_no, "part": parts})
        parts += 1
    return _Batch(token, worker_id, batch_no, parts, len(tensors), skeleton)


# ---- the main side -----------------------------------------------------------------------------------------------

_transports: dict[str, "_Transport"] = {}
_transports_lock = threading.Lock()


def _own_copy(t: Any) -> torch.Tensor:
    """A received tensor copied into memory of our own, in the order its dense layout has (the worker sends a
    channels_last tensor as its C-order permutation: see _dense_order); the copy ends the lease on the worker's
    pool buffer."""
    return torch.from_dlpack(t.copy(order="any"))


class _Transport:
    """The main process's end: one subscriber per worker, each drained by its own thread as soon as messages
    arrive, so a worker's ring and pool never fill up while the main process is busy elsewhere (training, a
    checkpoint, a debugger), and batches torch discards between persistent-worker epochs are dropped.

    1. __init__ subscribes (before torch starts the workers, so that their first send finds us);
    2. start() starts the drain threads (after torch has forked the workers: no thread exists at the fork);
    3. begin_close() makes take() raise at once (torch's pin thread must not wait in it while torch shuts down),
       while the threads keep draining, and dropping, what workers still send, so that none blocks on a full ring;
    4. close() stops the threads and closes the subscribers.
    """

    def __init__(self, token: str, num_workers: int) -> None:
        self.token = token
        self.subs = [Subscriber(_topic(token, w)) for w in range(num_workers)]
        self.cv = threading.Condition()
        self.ready: list[dict[int, dict[int, list]]] = [{} for _ in range(num_workers)]
        self.failed: list[BaseException | None] = [None] * num_workers
        self.closing = False  # take() raises
        self.stopped = False  # the drain threads return
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        self.threads = [
            threading.Thread(target=self._drain, args=(w,), name=f"tensorwire-dataloader-{w}", daemon=True)
            for w in range(len(self.subs))
        ]
        for t in self.threads:
            t.start()

    def _drain(self, w: int) -> None:
        sub = self.subs[w]
        try:
            while not self.stopped:
                try:
                    msg = sub.recv(timeout=0.05)  # waits without the GIL
                except TimeoutError:
                    continue
                except EOFError:  # the worker exited (its publisher closed): nothing more comes
                    return
                if self.closing:  # shutting down: release the worker's buffers, keep nothing
                    del msg
                    continue
                tensors = msg if isinstance(msg, list) else [msg]
                md = tensors[0].metadata
                batch, part = md.get("batch"), md.get("part")
                # One copy into our own memory: batches are writable, as torch's are, and the leases end here.
                copies = [_own_copy(t) for t in tensors]
                del msg, tensors, md
                with self.cv:
                    self.ready[w].setdefault(batch, {})[part] = copies
                    self.cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            with self.cv:
                self.failed[w] = e
                self.cv.notify_all()

    def take(self, b: "_Batch") -> list:
        w = b.worker_id
        deadline = time.monotonic() + _RECV_TIMEOUT
        with self.cv:
            while True:
                parts = self.ready[w].get(b.batch_no) if b.parts else {}
                if parts is not None and len(parts) == b.parts:
                    self.ready[w].pop(b.batch_no, None)
                    for old in [k for k in self.ready[w] if not isinstance(k, int) or k < b.batch_no]:
                        del self.ready[w][old]  # batches torch discarded (an epoch left early)
                    return [t for p in range(b.parts) for t in parts.get(p, ())]
                if self.failed[w] is not None:
                    e = self.failed[w]
                    raise RuntimeError(
                        f"tensorwire DataLoader: receiving from worker {w} failed: {type(e).__name__}: {e}"
                    ) from e
                left = deadline - time.monotonic()
                if self.closing:
                    raise RuntimeError("tensorwire DataLoader: the iterator was shut down")
                if left <= 0:
                    raise RuntimeError(
                        f"tensorwire DataLoader: worker {w}'s batch {b.batch_no} did not arrive within "
                        f"{_RECV_TIMEOUT:.0f} s"
                    )
                self.cv.wait(min(left, 0.1))

    def pending(self) -> int:
        """Batches received and not yet taken (tests: batches torch discarded must not pile up)."""
        with self.cv:
            return sum(len(r) for r in self.ready)

    def begin_close(self) -> None:
        with self.cv:
            self.closing = True
            self.cv.notify_all()

    def close(self) -> None:
        self.begin_close()
        self.stopped = True
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(timeout=5.0)
        for s in self.subs:
            s.close()
        with self.cv:
            self.ready = [{} for _ in self.ready]


def _resolve(b: Any) -> Any:
    if not isinstance(b, _Batch):
        return b
    with _transports_lock:
        tr = _transports.get(b.token)
    if tr is None:
        raise RuntimeError("tensorwire DataLoader: a batch arrived after its iterator was shut down")
    received = tr.take(b)
    if len(received) != b.count:
        raise RuntimeError(f"tensorwire DataLoader: worker {b.worker_id} sent {len(received)} of {b.count} tensors")

    made: dict[int, Any] = {}

    def leaf(r: _Ref) -> Any:
        if r.index in made:  # one tensor in several places of the batch, as the worker had it
            return made[r.index]
        x = received[r.index]
        if r.perm is not None:  # sent C-contiguous in the permuted order: the view back has the worker's strides
            x = x.permute(sorted(range(len(r.perm)), key=r.perm.__getitem__))
        made[r.index] = y = _twt._rewrap(x, r.cls, r.state)
        return y

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


_iter_lock = threading.Lock()


class _MultiIter(_MultiProcessingDataLoaderIter):
    def __init__(self, loader: Any) -> None:
        token = f"{os.getpid()}.{next(_counter)}.{os.urandom(3).hex()}"
        depth = (_MAX_TENSORS_PER_MESSAGE + 1) * (loader.prefetch_factor + 2)
        self._tw_token = token
        tr = _Transport(token, loader.num_workers)  # subscribed before the workers start; no thread yet
        with _transports_lock:
            _transports[token] = tr
        with _iter_lock:  # the loader's collate_fn is swapped while torch's iterator reads it
            user = loader.collate_fn
            loader.collate_fn = _WorkerCollate(user, token, depth)
            try:
                super().__init__(loader)  # forks (or spawns) the workers
            except BaseException:
                self._tw_close()
                raise
            finally:
                loader.collate_fn = user
        tr.start()  # after the fork

    def _process_data(self, data: Any, *args: Any) -> Any:
        data = super()._process_data(data, *args)  # (data, worker_idx) in torch >= 2.10, (data,) before
        return _resolve(data)

    def _tw_close(self) -> None:
        with _transports_lock:
            tr = _transports.pop(self._tw_token, None)
        if tr is not None:
            tr.close()

    def _shutdown_workers(self) -> None:
        # take() raises from now on: torch joins its pin thread first, which must not sit in take() meanwhile.
        with _transports_lock:
            tr = _transports.get(getattr(self, "_tw_token", ""))
        if tr is not None:
            tr.begin_close()
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
