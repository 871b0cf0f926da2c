//! Publish/subscribe of tensors between processes on one machine through shared memory (`tensorwire/ipc.hpp`):
//! the same protocol as C++ and Python, so a Rust publisher serves Python subscribers and the reverse.
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::time::Duration;

use crate::dtype::Pod;
use crate::error::{check, Error, ErrorKind, Result};
use crate::ffi;
use crate::metadata::{metadata_to_raw, Metadata};
use crate::dtype::DType;
use crate::tensor::{CopyMode, Device, Tensor};

/// What `send` and `loan` do when a subscriber's ring is full or the pool is exhausted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFull {
    /// Wait until the subscriber makes room (a dead subscriber is never waited for).
    #[default]
    Block,
    /// Drop the subscriber's oldest unread message.
    DropOldest,
    /// Fail with `ErrorKind::WouldBlock`; nobody receives the message.
    Raise,
}

/// Publisher settings (`Default` gives tensorwire's defaults, the same as C++ and Python). `Debug` never shows the
/// token (a secret in a log is a leaked secret): it says whether there is one.
#[derive(Clone)]
pub struct PublisherOptions {
    /// Messages each subscriber's ring holds (>= 1).
    pub depth: usize,
    pub on_full: OnFull,
    /// Largest encoded metadata of one message, in bytes.
    pub max_metadata_bytes: usize,
    /// Pool buffers at most.
    pub max_buffers: usize,
    /// Shared memory the pool may hold at once, in bytes.
    pub pool_bytes: usize,
    /// Subscribers served at once.
    pub max_subscribers: usize,
    /// Make a sent tensor's memory read-only in this process when something could still write it (a loan sent
    /// by reference). Loans moved into `send` are not affected.
    pub protect_sent_loans: bool,
    /// Accept subscribers of other users.
    pub allow_other_users: bool,
    /// Also serve remote subscribers over UCX: `"host:port"` (`":port"` binds loopback only; port 0 picks a free one,
    /// see `Publisher::address`). `None`: this machine's shared memory only.
    pub listen: Option<String>,
    /// A shared secret remote subscribers must prove (challenge-response; it never crosses the network). Required
    /// for a listener other machines can reach, unless `insecure`. Data is never encrypted.
    pub token: Option<String>,
    /// Allow a non-loopback listener without a token (a network you trust).
    pub insecure: bool,
}

impl Default for PublisherOptions {
    fn default() -> PublisherOptions {
        // The C++ defaults (safe before check_abi: the library writes no more than this struct's size).
        let o = ffi::default_options(ffi::tw_publisher_options_init_sized);
        PublisherOptions {
            depth: o.depth as usize,
            on_full: OnFull::Block,
            max_metadata_bytes: o.max_metadata_bytes as usize,
            max_buffers: o.max_buffers as usize,
            pool_bytes: o.pool_bytes as usize,
            max_subscribers: o.max_subscribers as usize,
            protect_sent_loans: o.protect_sent_loans != 0,
            allow_other_users: o.allow_other_users != 0,
            listen: None,
            token: None,
            insecure: false,
        }
    }
}

/// Options of one `Publisher::send_options` call.
#[derive(Clone, Debug, Default)]
pub struct SendOptions {
    /// `IfNeeded` crosses without a copy where there is a way (a loan; a CUDA allocation the driver can share),
    /// else with exactly one copy into the pool; `Always` copies once (the caller may reuse its memory at once);
    /// `Never` fails with `ErrorKind::CopyRequired`, naming why, where there is no zero-copy way.
    pub copy: CopyMode,
    /// CUDA: the stream the data was produced on, whose work subscribers wait for (`None`: the tensor's own
    /// stream, else the legacy default stream). A raw `CUstream` handle, or 1 / 2 for the legacy / per-thread
    /// default streams.
    pub stream: Option<isize>,
    /// How long a full ring may hold the send (`None`: as long as it takes).
    pub timeout: Option<Duration>,
    /// Merged into the tensor's own metadata (these entries win).
    pub metadata: Metadata,
}

/// Subscriber settings. `Debug` never shows the token.
#[derive(Clone, Default)]
pub struct SubscriberOptions {
    /// Accept a publisher of another user.
    pub allow_other_users: bool,
    /// Subscribe to a remote publisher at `"host:port"` (its `PublisherOptions::listen`) over UCX instead of this
    /// machine's shared memory; it connects in the background and retries until a publisher listens there.
    pub connect: Option<String>,
    /// The remote publisher's token.
    pub token: Option<String>,
    /// Deliver every tensor on this device, copying what arrives elsewhere (`Device::CPU` receives CUDA tensors
    /// as host copies). `None`: tensors arrive where they were sent. A CUDA device this process does not have, or
    /// a kind other than CPU, CUDA and pinned host memory, is refused by `with_options`.
    pub device: Option<Device>,
}

/// How a token shows in `Debug`: whether there is one, never what it is.
fn redacted(token: &Option<String>) -> Option<&'static str> {
    token.as_ref().map(|_| "<redacted>")
}

impl std::fmt::Debug for PublisherOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherOptions")
            .field("depth", &self.depth)
            .field("on_full", &self.on_full)
            .field("max_metadata_bytes", &self.max_metadata_bytes)
            .field("max_buffers", &self.max_buffers)
            .field("pool_bytes", &self.pool_bytes)
            .field("max_subscribers", &self.max_subscribers)
            .field("protect_sent_loans", &self.protect_sent_loans)
            .field("allow_other_users", &self.allow_other_users)
            .field("listen", &self.listen)
            .field("token", &redacted(&self.token))
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl std::fmt::Debug for SubscriberOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberOptions")
            .field("allow_other_users", &self.allow_other_users)
            .field("connect", &self.connect)
            .field("token", &redacted(&self.token))
            .field("device", &self.device)
            .finish()
    }
}

fn c_option(what: &str, s: &Option<String>) -> Result<Option<CString>> {
    s.as_deref()
        .map(|v| CString::new(v).map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("{what} {v:?} contains NUL"))))
        .transpose()
}

fn c_ptr(s: &Option<CString>) -> *const std::os::raw::c_char {
    s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

fn topic(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("topic name {name:?} contains NUL")))
}

fn timeout_ns(t: Option<Duration>) -> i64 {
    t.map_or(-1, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The sending end of a topic. Dropping it ends the stream: subscribers drain what is queued, then see
/// `ErrorKind::EndOfStream`; tensors they received stay valid.
#[derive(Debug)]
pub struct Publisher {
    raw: NonNull<ffi::tw_publisher>,
    name: String,
}

// SAFETY: the C++ Publisher is thread-safe (its own lock orders messages).
unsafe impl Send for Publisher {}
unsafe impl Sync for Publisher {}

/// A writable shared-memory buffer of a publisher's pool, filled in place and then moved into `send` — so it
/// crosses with no copy, and nothing can write it once sent:
///
/// ```compile_fail,E0382
/// # fn main() -> Result<(), tensorwire::Error> {
/// let pub_ = tensorwire::Publisher::new("doc_loan", Default::default())?;
/// let mut buf = pub_.loan::<f32>(&[4])?;
/// pub_.send(buf)?;
/// buf.as_mut_slice()[0] = 1.0; // error[E0382]: borrow of moved value: `buf`
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Loan<T: Pod> {
    tensor: Tensor,
    _t: PhantomData<T>,
}

impl<T: Pod> Loan<T> {
    /// The buffer's elements (C order), to fill. The pool's memory is initialised (zeros or an earlier message's
    /// bytes), never uninitialised.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // A loan is exclusive by construction: no view, clone or raw pointer of it is ever handed out.
        self.tensor.as_mut_slice::<T>().unwrap_or_else(|e| panic!("Loan::as_mut_slice: {e}"))
    }
    pub fn as_slice(&self) -> &[T] {
        self.tensor.as_slice::<T>().unwrap_or_else(|e| panic!("Loan::as_slice: {e}"))
    }
    pub fn shape(&self) -> &[i64] {
        self.tensor.shape()
    }
    /// Metadata sent with the buffer (merged with `send_with`'s).
    pub fn set_metadata(&mut self, metadata: &Metadata) -> Result<()> {
        self.tensor.set_metadata(metadata)
    }
    /// The loan as a plain tensor, to make views of or send by reference (`send(&tensor)`). It stays writable
    /// (`as_mut_slice`) only while it has no other owner; once sent by reference, subscribers read it, so it
    /// never is again (and with `protect_sent_loans` its memory is read-only here).
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

mod sealed {
    pub trait Sealed {}
    /// Extra metadata for one send: only this crate can make one (a raw tree pointer it owns for the call).
    #[derive(Debug)]
    pub struct Extra(pub(crate) *const crate::ffi::tw_value);
}
use sealed::Extra;

/// A send that failed, with the message handed back (a moved loan keeps its contents: retry it, or drop it to
/// return the buffer to the pool). Converts into `Error` with `?`.
#[derive(Debug)]
pub struct SendError<M> {
    pub error: Error,
    pub message: M,
}

impl<M> From<SendError<M>> for Error {
    fn from(e: SendError<M>) -> Error {
        e.error
    }
}

impl<M> std::fmt::Display for SendError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.error, f)
    }
}

impl<M: std::fmt::Debug> std::error::Error for SendError<M> {}

/// What `Publisher::send` accepts: a `Loan` or a `Tensor` moved in (consumed), or a `&Tensor` (the caller keeps
/// it; a loan it views is read by subscribers from then on, so it is never exclusive again, and its memory is made
/// read-only here when `protect_sent_loans` is on).
pub trait Outgoing: sealed::Sealed + Sized {
    #[doc(hidden)]
    fn deliver(self, p: &Publisher, extra: Option<&Extra>, timeout_ns: i64) -> std::result::Result<usize, SendError<Self>>;
}

/// Sends an owned handle; on failure the C ABI leaves it intact and it is handed back through `rebuild`.
fn deliver_moved<M>(
    t: Tensor,
    p: &Publisher,
    extra: Option<&Extra>,
    timeout_ns: i64,
    rebuild: impl FnOnce(Tensor) -> M,
) -> std::result::Result<usize, SendError<M>> {
    let mut raw = t.into_raw();
    let mut delivered = 0usize;
    // SAFETY: raw is an owned handle; on success the C ABI frees it and sets it to NULL, on failure it stays ours.
    let extra = extra.map_or(std::ptr::null(), |e| e.0);
    let status = unsafe { ffi::tw_publisher_send_move(p.raw.as_ptr(), &mut raw, extra, timeout_ns, &mut delivered) };
    // Read the error before anything else can run (a drop could call into the C ABI and replace the message).
    let result = check(status);
    match result {
        Ok(()) => Ok(delivered),
        Err(error) => {
            // SAFETY: on failure raw is still a live handle we own.
            let t = unsafe { Tensor::from_raw(raw) }.map_err(|e| SendError { error: e, message: () });
            match t {
                Ok(t) => Err(SendError { error, message: rebuild(t) }),
                Err(_) => panic!("tw_publisher_send_move failed and returned no handle: {error}"),
            }
        }
    }
}

impl<T: Pod> sealed::Sealed for Loan<T> {}
impl<T: Pod> Outgoing for Loan<T> {
    fn deliver(self, p: &Publisher, extra: Option<&Extra>, timeout_ns: i64) -> std::result::Result<usize, SendError<Self>> {
        deliver_moved(self.tensor, p, extra, timeout_ns, |tensor| Loan { tensor, _t: PhantomData })
    }
}
impl sealed::Sealed for Tensor {}
impl Outgoing for Tensor {
    fn deliver(self, p: &Publisher, extra: Option<&Extra>, timeout_ns: i64) -> std::result::Result<usize, SendError<Self>> {
        deliver_moved(self, p, extra, timeout_ns, |t| t)
    }
}
impl sealed::Sealed for &Tensor {}
impl Outgoing for &Tensor {
    fn deliver(self, p: &Publisher, extra: Option<&Extra>, timeout_ns: i64) -> std::result::Result<usize, SendError<Self>> {
        let mut delivered = 0usize;
        let extra = extra.map_or(std::ptr::null(), |e| e.0);
        // SAFETY: live handles and a tree this crate owns for the call; the C ABI takes none of them.
        match check(unsafe { ffi::tw_publisher_send(p.raw.as_ptr(), self.as_raw(), extra, timeout_ns, &mut delivered) }) {
            Ok(()) => Ok(delivered),
            Err(error) => Err(SendError { error, message: self }),
        }
    }
}

impl Publisher {
    /// Binds topic `name` (1 to 64 of `[A-Za-z0-9_.:/-]`) and connects to subscribers already waiting.
    pub fn new(name: &str, options: PublisherOptions) -> Result<Publisher> {
        crate::check_abi()?;
        let c = topic(name)?;
        let mut o = ffi::default_options(ffi::tw_publisher_options_init_sized);
        o.depth = options.depth as u64;
        o.on_full = match options.on_full {
            OnFull::Block => ffi::TW_ON_FULL_BLOCK,
            OnFull::DropOldest => ffi::TW_ON_FULL_DROP_OLDEST,
            OnFull::Raise => ffi::TW_ON_FULL_RAISE,
        };
        o.max_metadata_bytes = options.max_metadata_bytes as u64;
        o.max_buffers = options.max_buffers as u64;
        o.pool_bytes = options.pool_bytes as u64;
        o.max_subscribers = options.max_subscribers as u64;
        o.protect_sent_loans = i32::from(options.protect_sent_loans);
        o.allow_other_users = i32::from(options.allow_other_users);
        let listen = c_option("listen", &options.listen)?;
        let token = c_option("token", &options.token)?;
        o.listen = c_ptr(&listen);
        o.token = c_ptr(&token);
        o.insecure = i32::from(options.insecure);
        let mut out = std::ptr::null_mut();
        // SAFETY: the strings live until the call returns; the library copies them.
        check(unsafe { ffi::tw_publisher_new(c.as_ptr(), &o, &mut out) })?;
        let raw = NonNull::new(out).ok_or_else(|| Error::new(ErrorKind::Internal, "no publisher returned"))?;
        Ok(Publisher { raw, name: name.to_string() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address remote subscribers connect to (`"host:port"`, with the port bound when 0 was asked for); `None`
    /// without `listen`.
    pub fn address(&self) -> Option<String> {
        // SAFETY: a live handle; a null buffer asks for the length only.
        let n = unsafe { ffi::tw_publisher_address(self.raw.as_ptr(), std::ptr::null_mut(), 0) };
        if n == 0 {
            return None;
        }
        let mut buf = vec![0u8; n + 1];
        // SAFETY: `buf` holds n + 1 bytes; the library writes at most that, NUL included.
        let m = unsafe { ffi::tw_publisher_address(self.raw.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        buf.truncate(m.min(n));
        String::from_utf8(buf).ok()
    }

    /// A writable, C-contiguous buffer from the shared-memory pool (waits while the pool is exhausted, under the
    /// `OnFull` policy), for as long as it takes. Buffers come back when subscribers release what they received,
    /// or when a `Loan` of this process is dropped; a thread whose own live loans hold every buffer (`max_buffers`,
    /// `pool_bytes`) waits forever, since only another thread could drop one: use `loan_timeout`, whose error
    /// counts the loans alive in this process.
    pub fn loan<T: Pod>(&self, shape: &[usize]) -> Result<Loan<T>> {
        self.loan_timeout(shape, None)
    }

    /// `loan`, giving up after `timeout` (`ErrorKind::Timeout`).
    pub fn loan_timeout<T: Pod>(&self, shape: &[usize], timeout: Option<Duration>) -> Result<Loan<T>> {
        let dims = crate::tensor::dims_i64(shape)?;
        let ndim = crate::tensor::ndim_i32(dims.len())?;
        let mut out = std::ptr::null_mut();
        check(unsafe {
            ffi::tw_publisher_loan(
                self.raw.as_ptr(),
                ndim,
                dims.as_ptr(),
                T::DTYPE.to_dl(),
                timeout_ns(timeout),
                &mut out,
            )
        })?;
        Ok(Loan { tensor: unsafe { Tensor::from_raw(out) }?, _t: PhantomData })
    }

    /// A writable, C-contiguous, uninitialised buffer on `device`: `Device::CPU` as `loan` (shared memory);
    /// `Device::cuda(n)` a buffer of the publisher's IPC-capable device pool, which local subscribers receive
    /// without a copy (fill it on a stream, then send it with `SendOptions::stream`). Device memory cannot be read
    /// as a slice here: hand it to CUDA code through `to_dlpack` / the data pointer.
    pub fn loan_on(&self, dtype: DType, shape: &[usize], device: Device, timeout: Option<Duration>) -> Result<Tensor> {
        let dims = crate::tensor::dims_i64(shape)?;
        let ndim = crate::tensor::ndim_i32(dims.len())?;
        let mut out = std::ptr::null_mut();
        let dl = ffi::DLDevice { device_type: device.kind, device_id: device.id };
        // SAFETY: live publisher; dims outlives the call; the library writes one handle to out.
        check(unsafe {
            ffi::tw_publisher_loan_on(
                self.raw.as_ptr(),
                ndim,
                dims.as_ptr(),
                dtype.to_dl(),
                dl,
                timeout_ns(timeout),
                &mut out,
            )
        })?;
        // SAFETY: on success out is an owned handle.
        unsafe { Tensor::from_raw(out) }
    }

    /// `send` of a tensor the caller keeps, with per-send options: the copy mode (`CopyMode::Never` makes a send
    /// that would copy an error instead), the CUDA stream subscribers wait on, a timeout and metadata. Returns how
    /// many subscribers got it.
    pub fn send_options(&self, tensor: &Tensor, options: &SendOptions) -> Result<usize> {
        let mut o = ffi::default_options(ffi::tw_send_options_init_sized);
        o.copy = options.copy as i32;
        o.timeout_ns = timeout_ns(options.timeout);
        o.stream = options.stream.unwrap_or(0);
        let extra = if options.metadata.is_empty() { None } else { Some(metadata_to_raw(&options.metadata)?) };
        o.extra = extra.as_ref().map_or(std::ptr::null(), |e| e.as_ptr());
        let mut delivered = 0usize;
        // SAFETY: live handles; the metadata tree lives until the call returns, and the library takes none of them.
        check(unsafe { ffi::tw_publisher_send_with(self.raw.as_ptr(), tensor.as_raw(), &o, &mut delivered) })?;
        Ok(delivered)
    }

    /// Delivers a message to every current subscriber, or to none; returns how many got it. A `Loan` (moved in)
    /// crosses with no copy; any other host tensor with one copy into the pool: a dense layout of any order (a
    /// transpose) as it is, with its strides, anything else packed C-contiguous (`as_slice` on the receiving side
    /// needs C order: `contiguous()` first when unsure). Waits while a ring is
    /// full (`OnFull::Block`). On failure nobody received it (and a moved loan goes back to the pool; use
    /// `try_send_with` to keep it).
    pub fn send<M: Outgoing>(&self, message: M) -> Result<usize> {
        Ok(message.deliver(self, None, -1)?)
    }

    /// `send` with metadata merged into the tensor's own (these entries win) and a bound on the wait
    /// (`ErrorKind::Timeout`: nobody got it).
    pub fn send_with<M: Outgoing>(&self, message: M, metadata: &Metadata, timeout: Option<Duration>) -> Result<usize> {
        Ok(self.try_send_with(message, metadata, timeout)?)
    }

    /// `send_with` that hands the message back when it fails (`ErrorKind::WouldBlock` under `OnFull::Raise`,
    /// `ErrorKind::Timeout`, ...), so a filled loan can be sent again.
    pub fn try_send_with<M: Outgoing>(
        &self,
        message: M,
        metadata: &Metadata,
        timeout: Option<Duration>,
    ) -> std::result::Result<usize, SendError<M>> {
        // The common case, no metadata: no tree to build, and nothing for C++ to merge.
        if metadata.is_empty() {
            return message.deliver(self, None, timeout_ns(timeout));
        }
        let extra = match metadata_to_raw(metadata) {
            Ok(e) => e,
            Err(error) => return Err(SendError { error, message }),
        };
        message.deliver(self, Some(&Extra(extra.as_ptr())), timeout_ns(timeout))
    }

    /// Subscribers currently connected.
    pub fn subscriber_count(&self) -> usize {
        unsafe { ffi::tw_publisher_subscriber_count(self.raw.as_ptr()) }
    }
    /// Messages dropped so far (`OnFull::DropOldest`), summed over subscribers.
    pub fn dropped(&self) -> u64 {
        unsafe { ffi::tw_publisher_dropped(self.raw.as_ptr()) }
    }
    /// Ends the stream now (idempotent); `drop` does the same.
    pub fn close(&self) {
        unsafe { ffi::tw_publisher_close(self.raw.as_ptr()) }
    }
    pub fn is_closed(&self) -> bool {
        unsafe { ffi::tw_publisher_closed(self.raw.as_ptr()) != 0 }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        unsafe { ffi::tw_publisher_free(self.raw.as_ptr()) }
    }
}

/// The receiving end of a topic; it may be created before or after the publisher. Several threads may `recv` on
/// one subscriber (each message goes to one of them).
#[derive(Debug)]
pub struct Subscriber {
    raw: NonNull<ffi::tw_subscriber>,
}

// SAFETY: the C++ Subscriber is thread-safe.
unsafe impl Send for Subscriber {}
unsafe impl Sync for Subscriber {}

impl Subscriber {
    /// Subscribes to topic `name`.
    pub fn new(name: &str) -> Result<Subscriber> {
        Subscriber::with_options(name, SubscriberOptions::default())
    }

    pub fn with_options(name: &str, options: SubscriberOptions) -> Result<Subscriber> {
        crate::check_abi()?;
        let c = topic(name)?;
        let mut o = ffi::default_options(ffi::tw_subscriber_options_init_sized);
        o.allow_other_users = i32::from(options.allow_other_users);
        let connect = c_option("connect", &options.connect)?;
        let token = c_option("token", &options.token)?;
        o.connect = c_ptr(&connect);
        o.token = c_ptr(&token);
        if let Some(d) = options.device {
            o.has_device = 1;
            o.device = ffi::DLDevice { device_type: d.kind, device_id: d.id };
        }
        let mut out = std::ptr::null_mut();
        // SAFETY: the strings live until the call returns; the library copies them.
        check(unsafe { ffi::tw_subscriber_new(c.as_ptr(), &o, &mut out) })?;
        let raw = NonNull::new(out).ok_or_else(|| Error::new(ErrorKind::Internal, "no subscriber returned"))?;
        Ok(Subscriber { raw })
    }

    /// The next message: a read-only tensor with the sender's dtype, shape, strides and metadata, zero-copy (it
    /// holds the publisher's buffer until dropped). `timeout: None` waits as long as it takes. The memory is the
    /// publisher's: a peer that turned `protect_sent_loans` off and keeps writing a loan it sent breaks the
    /// read-only promise `as_slice` relies on (tensorwire's publishers never write a buffer a subscriber holds).
    /// Errors: `ErrorKind::Timeout` (nothing arrived), `ErrorKind::EndOfStream` (the publisher closed or died and
    /// everything was received).
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        check(unsafe { ffi::tw_subscriber_recv(self.raw.as_ptr(), timeout_ns(timeout), &mut out) })?;
        unsafe { Tensor::from_raw(out) }
    }

    /// `recv` without waiting: `Ok(None)` when nothing is there yet.
    pub fn try_recv(&self) -> Result<Option<Tensor>> {
        match self.recv(Some(Duration::ZERO)) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == ErrorKind::Timeout => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// True once the stream has ended and everything was received (or after `close`).
    pub fn is_closed(&self) -> bool {
        unsafe { ffi::tw_subscriber_closed(self.raw.as_ptr()) != 0 }
    }
    /// True while connected to a live publisher.
    pub fn is_connected(&self) -> bool {
        unsafe { ffi::tw_subscriber_connected(self.raw.as_ptr()) != 0 }
    }
    /// Messages this subscriber missed because a queue was full (`OnFull::DropOldest`): a remote subscriber
    /// counts those the publisher dropped for it and those its own queue dropped.
    pub fn dropped(&self) -> u64 {
        unsafe { ffi::tw_subscriber_dropped(self.raw.as_ptr()) }
    }
    /// Received tensors until end-of-stream.
    pub fn iter(&self) -> Messages<'_> {
        Messages { sub: self, done: false }
    }
    /// Disconnects (a `recv` blocked in another thread returns `EndOfStream`); messages queued but not yet received
    /// are discarded (the `EndOfStream` error says how many); received tensors stay valid.
    pub fn close(&self) {
        unsafe { ffi::tw_subscriber_close(self.raw.as_ptr()) }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        unsafe { ffi::tw_subscriber_free(self.raw.as_ptr()) }
    }
}

/// Received tensors until end-of-stream (`Subscriber::iter`). Each `next` waits as long as it takes; the
/// iteration ends after end-of-stream or after the first error (which it yields), except `ErrorKind::Unsupported`:
/// a message of several tensors (a Python or C++ peer's dict, list or tuple) is skipped, yielded as that error, and
/// the iteration goes on.
#[derive(Debug)]
pub struct Messages<'a> {
    sub: &'a Subscriber,
    done: bool,
}

impl Iterator for Messages<'_> {
    type Item = Result<Tensor>;
    fn next(&mut self) -> Option<Result<Tensor>> {
        if self.done {
            return None;
        }
        match self.sub.recv(None) {
            Ok(t) => Some(Ok(t)),
            Err(e) if e.kind() == ErrorKind::Unsupported => Some(Err(e)),
            Err(e) => {
                self.done = true;
                if e.kind() == ErrorKind::EndOfStream {
                    None
                } else {
                    Some(Err(e))
                }
            }
        }
    }
}
