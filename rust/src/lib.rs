//! # tensorwire for Rust
//!
//! Safe, zero-copy tensors over tensorwire's C ABI (`tensorwire.h`): a `Vec` becomes a tensor without being copied
//! (its owner travels with the data and drops it exactly once, whoever releases it last — Rust, C++, Python or a
//! DLPack consumer), views share that owner, DLPack moves tensors in and out, and shared-memory publish/subscribe
//! talks to C++ and Python peers with dtype, layout and metadata intact.
//!
//! ```
//! use std::time::Duration;
//! use tensorwire::{Metadata, Publisher, Subscriber, Tensor};
//!
//! # fn main() -> Result<(), tensorwire::Error> {
//! let v: Vec<f64> = (0..12).map(f64::from).collect();
//! let ptr = v.as_ptr();
//! let t = Tensor::from_vec(v, &[3, 4])?;                  // zero-copy
//! assert_eq!(t.data_ptr(), ptr.cast());
//! let col = t.transpose(0, 1)?.slice(1, 0, 3, 2)?;         // views share the owner
//! let dense = col.contiguous()?;                           // tensorwire's copy engine
//! assert_eq!(dense.as_slice::<f64>()?, &[0.0, 8.0, 1.0, 9.0, 2.0, 10.0, 3.0, 11.0]);
//! let dl = dense.into_dlpack();                            // ownership handed over
//! let back = unsafe { Tensor::from_dlpack(dl) }?;          // the only unsafe: a raw pointer from outside
//! assert_eq!(back.shape(), &[4, 2]);
//!
//! let topic = format!("doc_points_{}", std::process::id());
//! let sub = Subscriber::new(&topic)?;
//! let pub_ = Publisher::new(&topic, Default::default())?;
//! let mut buf = pub_.loan::<f32>(&[1024, 3])?;
//! buf.as_mut_slice().fill(1.0);
//! # let _ = sub.recv(Some(Duration::from_millis(1)));    // completes the connection
//! pub_.send_with(buf, &Metadata::new().with("step", 7), None)?;   // moved: cannot be written again
//! let t = sub.recv(Some(Duration::from_secs(5)))?;
//! assert_eq!(t.as_slice::<f32>()?[3071], 1.0);
//! assert_eq!(t.metadata()?.get("step"), Some(&tensorwire::Value::Int(7)));
//! # Ok(()) }
//! ```
//!
//! Linking: `build.rs` finds `libtensorwire_c.so` through `TENSORWIRE_DIR` (a build directory or an install
//! prefix); see the project README.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_debug_implementations)]

mod dtype;
mod error;
// The README's Rust example runs as a doc test (`make test-rust`): the README's examples run as written.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;

pub mod ffi;
mod ipc;
mod metadata;
mod tensor;

pub use dtype::{DType, Element, Pod, BF16, F16};
pub use error::{Error, ErrorKind, Result};
pub use ipc::{
    Loan, Messages, OnFull, Outgoing, Publisher, PublisherOptions, SendError, SendOptions, Subscriber, SubscriberOptions,
};
pub use metadata::{Metadata, Value};
pub use tensor::{CopyMode, Device, ExportOptions, Tensor};

use std::sync::OnceLock;

/// The linked library's version ("MAJOR.MINOR.PATCH").
pub fn version() -> String {
    // SAFETY: a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(ffi::tw_version()) }.to_string_lossy().into_owned()
}

/// Text the C ABI writes into a caller's buffer (`f(buf, len)` returns its full length): None when empty.
fn c_text(f: impl Fn(*mut std::os::raw::c_char, usize) -> usize) -> Option<String> {
    let n = f(std::ptr::null_mut(), 0);
    if n == 0 {
        return None;
    }
    let mut buf = vec![0u8; n + 1];
    let m = f(buf.as_mut_ptr().cast(), buf.len());
    buf.truncate(m.min(n));
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// Which UCX carries `listen` / `connect` (loaded on first use): `TW_UCX_LIBRARY`, else one the process already
/// loaded, else the one [`prefer_ucx_library`] gave, else `libucp.so.0` from the library path.
pub mod net {
    use std::ffi::CString;

    /// The file of the UCX in use; None when none can be loaded ([`ucx_unavailable_reason`] says why).
    pub fn ucx_library() -> Option<String> {
        // SAFETY: the library writes at most `len` bytes into `buf`, or only returns the length for a null one.
        super::c_text(|buf, len| unsafe { crate::ffi::tw_ucx_library(buf, len) })
    }
    /// Its version, "major.minor.release".
    pub fn ucx_version() -> Option<String> {
        // SAFETY: as above.
        super::c_text(|buf, len| unsafe { crate::ffi::tw_ucx_version(buf, len) })
    }
    /// Why `listen` / `connect` cannot be used; None when they can.
    pub fn ucx_unavailable_reason() -> Option<String> {
        // SAFETY: as above.
        super::c_text(|buf, len| unsafe { crate::ffi::tw_ucx_unavailable_reason(buf, len) })
    }
    /// Prefers `path` (a libucp.so) over the library path's UCX, e.g. the libucx wheel's: UCX before 1.18 (Debian
    /// 12's 1.13) aborts the whole process on crafted bytes sent to its listening ports. False once UCX is loaded
    /// (too late: nothing changes) or for a path with a NUL byte.
    pub fn prefer_ucx_library(path: &str) -> bool {
        let Ok(c) = CString::new(path) else { return false };
        // SAFETY: a NUL-terminated string that outlives the call (the library copies it).
        unsafe { crate::ffi::tw_prefer_ucx_library(c.as_ptr()) != 0 }
    }
}

/// Refuses a linked C ABI whose major version differs from the one this crate declares.
pub(crate) fn check_abi() -> Result<()> {
    static ABI: OnceLock<u32> = OnceLock::new();
    // SAFETY: no arguments, no state.
    let v = *ABI.get_or_init(|| unsafe { ffi::tw_abi_version() });
    if v >> 16 != ffi::TW_ABI_VERSION_MAJOR || (v & 0xFFFF) < ffi::TW_ABI_VERSION_MINOR {
        return Err(Error::new(
            ErrorKind::VersionMismatch,
            format!(
                "libtensorwire_c has C ABI {}.{}, but this crate was written for {}.{} or a newer {}.x: rebuild it \
                 against the library",
                v >> 16,
                v & 0xFFFF,
                ffi::TW_ABI_VERSION_MAJOR,
                ffi::TW_ABI_VERSION_MINOR,
                ffi::TW_ABI_VERSION_MAJOR
            ),
        ));
    }
    Ok(())
}
