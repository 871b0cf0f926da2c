//! Errors: every fallible call returns `Result<_, tensorwire::Error>`, carrying the C ABI's status and message.
use std::ffi::CStr;
use std::fmt;

use crate::ffi;

/// What went wrong, one variant per C ABI status (plus `Shared`, a refusal the crate makes itself).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A value is malformed (a negative extent, a bad topic name, an unknown option value).
    InvalidArgument,
    /// A value has the wrong type (a dtype that is not the slice's element type, a non-dict as metadata).
    TypeMismatch,
    /// An index or a span lies outside what it indexes.
    OutOfRange,
    /// A size, stride or offset does not fit in 64 bits.
    Overflow,
    /// Well-formed but not supported (a layout a consumer cannot take, device memory read from the host).
    Unsupported,
    /// The operation needs a copy and the caller forbade one.
    CopyRequired,
    /// The device is absent or its driver cannot be reached.
    DeviceUnavailable,
    /// A protocol's major version is not one this library understands.
    VersionMismatch,
    /// A write through a read-only tensor.
    ReadOnly,
    /// A bug in tensorwire.
    Internal,
    /// Memory that cannot be had: nothing was allocated.
    OutOfMemory,
    /// A bounded wait ended with nothing done.
    Timeout,
    /// `OnFull::Raise`: a subscriber's ring is full or the pool is exhausted; nobody received the message.
    WouldBlock,
    /// `Subscriber::recv`: the publisher closed or died and every message was received, or the subscriber was
    /// closed.
    EndOfStream,
    /// A mutable slice was asked of memory another owner (a view, a clone, an export, a raw pointer) can see.
    Shared,
}

/// An error from tensorwire: its kind and a message that names the problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// `std::result::Result` with tensorwire's `Error`.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }

    /// The error the C ABI just reported in this thread with `status`.
    pub(crate) fn from_status(status: ffi::tw_status) -> Error {
        // SAFETY: tw_last_error returns a valid NUL-terminated string owned by this thread's state.
        let message = unsafe { CStr::from_ptr(ffi::tw_last_error()) }.to_string_lossy().into_owned();
        let kind = match status {
            ffi::TW_ERR_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
            ffi::TW_ERR_TYPE_MISMATCH => ErrorKind::TypeMismatch,
            ffi::TW_ERR_OUT_OF_RANGE => ErrorKind::OutOfRange,
            ffi::TW_ERR_OVERFLOW => ErrorKind::Overflow,
            ffi::TW_ERR_UNSUPPORTED => ErrorKind::Unsupported,
            ffi::TW_ERR_COPY_REQUIRED => ErrorKind::CopyRequired,
            ffi::TW_ERR_DEVICE_UNAVAILABLE => ErrorKind::DeviceUnavailable,
            ffi::TW_ERR_VERSION_MISMATCH => ErrorKind::VersionMismatch,
            ffi::TW_ERR_READ_ONLY => ErrorKind::ReadOnly,
            ffi::TW_ERR_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
            ffi::TW_ERR_TIMEOUT => ErrorKind::Timeout,
            ffi::TW_ERR_WOULD_BLOCK => ErrorKind::WouldBlock,
            ffi::TW_END_OF_STREAM => ErrorKind::EndOfStream,
            _ => ErrorKind::Internal,
        };
        let message = if message.is_empty() { format!("tensorwire status {status}") } else { message };
        Error { kind, message }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, naming the problem (the same text Python and C++ users see).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// TW_OK or the error the C ABI described.
pub(crate) fn check(status: ffi::tw_status) -> Result<()> {
    if status == ffi::TW_OK {
        Ok(())
    } else {
        Err(Error::from_status(status))
    }
}
