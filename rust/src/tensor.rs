//! `Tensor`: a strided view of memory plus the owner that keeps it alive, shared by every view and export.
use std::fmt;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use crate::dtype::{DType, Element, Pod};
use crate::error::{check, Error, ErrorKind, Result};
use crate::ffi::{self, DLDevice, DLManagedTensorVersioned};
use crate::metadata::{metadata_from_raw, metadata_to_raw, Metadata, RawValue};

/// Where a tensor's memory lives (DLPack's device type and ordinal).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    /// DLPack `DLDeviceType` (1: CPU, 2: CUDA, 3: CUDA pinned host, ...).
    pub kind: i32,
    pub id: i32,
}

impl Device {
    pub const CPU: Device = Device { kind: ffi::K_DL_CPU, id: 0 };
    /// CUDA device `id` (its ordinal in this process).
    pub const fn cuda(id: i32) -> Device {
        Device { kind: ffi::K_DL_CUDA, id }
    }
    /// True for memory the host can read (CPU and pinned host memory).
    pub fn is_host_accessible(self) -> bool {
        self.kind == ffi::K_DL_CPU || self.kind == ffi::K_DL_CUDA_HOST
    }
}

/// A tensor: dtype, shape, strides (in elements) and byte offset over memory shared with every view of it.
///
/// Cloning a `Tensor` makes another handle to the same view (no data is copied); `copy` and `contiguous` copy.
/// Memory is released when the last handle, view and DLPack export is gone — in Rust, C++, Python or C. Data is
/// read through `as_slice`, written through `as_mut_slice` only while no other owner can see it.
pub struct Tensor {
    raw: NonNull<ffi::tw_tensor>,
}

// SAFETY: a handle is an immutable view plus a thread-safe reference count; its data is only written through
// `&mut self` while the handle is the memory's only owner (tw_tensor_is_exclusive), so sharing `&Tensor` between
// threads can only read, and moving a handle to another thread moves nothing thread-bound (release callbacks of
// adopted memory are `Send`).
unsafe impl Send for Tensor {}
unsafe impl Sync for Tensor {}

pub(crate) fn dims_i64(shape: &[usize]) -> Result<Vec<i64>> {
    shape
        .iter()
        .map(|&d| i64::try_from(d).map_err(|_| Error::new(ErrorKind::Overflow, format!("extent {d} does not fit in i64"))))
        .collect()
}

pub(crate) fn ndim_i32(n: usize) -> Result<i32> {
    i32::try_from(n).map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("{n} dimensions are too many")))
}

fn dim_i64(d: usize) -> Result<i64> {
    i64::try_from(d).map_err(|_| Error::new(ErrorKind::OutOfRange, format!("dimension {d} is out of range")))
}

unsafe extern "C" fn drop_boxed_vec<T>(ctx: *mut c_void) {
    // SAFETY: ctx is the Box<Vec<T>> leaked by from_vec; the C ABI calls this exactly once.
    drop(unsafe { Box::from_raw(ctx as *mut Vec<T>) });
}

impl Tensor {
    /// Takes ownership of a raw handle the C ABI returned.
    pub(crate) unsafe fn from_raw(raw: *mut ffi::tw_tensor) -> Result<Tensor> {
        NonNull::new(raw)
            .map(|raw| Tensor { raw })
            .ok_or_else(|| Error::new(ErrorKind::Internal, "the C ABI returned no tensor"))
    }

    pub(crate) fn as_raw(&self) -> *const ffi::tw_tensor {
        self.raw.as_ptr()
    }

    pub(crate) fn into_raw(self) -> *mut ffi::tw_tensor {
        let p = self.raw.as_ptr();
        std::mem::forget(self);
        p
    }

    fn derive(&self, f: impl FnOnce(*const ffi::tw_tensor, *mut *mut ffi::tw_tensor) -> ffi::tw_status) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        check(f(self.as_raw(), &mut out))?;
        // SAFETY: on TW_OK the C ABI hands us a new handle.
        unsafe { Tensor::from_raw(out) }
    }

    /// Adopts `v` without copying it: the tensor (and every view and export of it) owns the `Vec`, which is dropped
    /// exactly once, when the last owner is released — wherever that happens. `shape` must hold exactly
    /// `v.len()` elements.
    pub fn from_vec<T: Element>(v: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        crate::check_abi()?;
        let dims = dims_i64(shape)?;
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel != Some(v.len()) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("a Vec of {} elements cannot have shape {:?}", v.len(), shape),
            ));
        }
        let ndim = ndim_i32(dims.len())?; // before the Vec is handed over: nothing after this leaks it
        let mut boxed = Box::new(v);
        let data = boxed.as_mut_ptr() as *mut c_void;
        let ctx = Box::into_raw(boxed) as *mut c_void;
        let mut out = std::ptr::null_mut();
        // SAFETY: data points at v.len() elements that live until drop_boxed_vec::<T>(ctx) runs, which the C ABI
        // calls exactly once (also when this call fails).
        check(unsafe {
            ffi::tw_tensor_adopt(
                data,
                ndim,
                dims.as_ptr(),
                std::ptr::null(),
                T::DTYPE.to_dl(),
                DLDevice { device_type: ffi::K_DL_CPU, device_id: 0 },
                Some(drop_boxed_vec::<T>),
                ctx,
                &mut out,
            )
        })?;
        // SAFETY: a new handle on TW_OK.
        unsafe { Tensor::from_raw(out) }
    }

    /// A new tensor holding a copy of `data` (what copying constructors elsewhere do; `from_vec` does not copy).
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize]) -> Result<Tensor> {
        Tensor::from_vec(data.to_vec(), shape)
    }

    /// A new zero-filled, C-contiguous host tensor.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Tensor> {
        crate::check_abi()?;
        let dims = dims_i64(shape)?;
        let mut out = std::ptr::null_mut();
        // SAFETY: dims outlives the call.
        check(unsafe { ffi::tw_tensor_zeros(ndim_i32(dims.len())?, dims.as_ptr(), dtype.to_dl(), &mut out) })?;
        unsafe { Tensor::from_raw(out) }
    }

    /// Takes ownership of a DLPack tensor from outside (NumPy, PyTorch, JAX, C...): zero-copy, under the same
    /// import policy as Python's `tw.from_dlpack`. The struct's deleter is called exactly once — when the last
    /// owner is released, or before this returns an error.
    ///
    /// # Safety
    /// `managed` must be null or point to a valid `DLManagedTensorVersioned` whose ownership the caller gives up
    /// (it must not be used or deleted afterwards), describing memory that stays valid until its deleter runs.
    /// That deleter may run on any thread (a `Tensor` is `Send`). Nobody may write the memory while any `Tensor`
    /// made from it lives, whatever the struct's read-only flag says: `as_slice` hands out shared references to it
    /// (a producer that keeps writing its array, as NumPy may, must not be imported this way).
    pub unsafe fn from_dlpack(managed: *mut DLManagedTensorVersioned) -> Result<Tensor> {
        crate::check_abi()?;
        if managed.is_null() {
            return Err(Error::new(ErrorKind::InvalidArgument, "from_dlpack: the DLManagedTensorVersioned pointer is null"));
        }
        let mut out = std::ptr::null_mut();
        // SAFETY: per this function's contract; the C ABI takes ownership even on failure.
        check(unsafe { ffi::tw_tensor_from_dlpack(managed, &mut out) })?;
        unsafe { Tensor::from_raw(out) }
    }

    /// Hands the tensor to a DLPack consumer: the caller owns the returned struct and must call its deleter
    /// exactly once (a consumer such as `np.from_dlpack`/`torch.from_dlpack` does). Follows the same policy as
    /// Python's `__dlpack__()`: a view with negative strides is exported as a copy (PyTorch aborts on them), every
    /// other layout as it is, without copying.
    ///
    /// The export is writable only when this tensor was the memory's only owner (`is_exclusive()`: ownership is
    /// handed over whole, as `as_mut_slice` would have allowed); memory that other tensors still share is exported
    /// with DLPack's read-only flag set, since they may be handing out `&[T]` over it. (PyTorch ignores that flag:
    /// a consumer must not write such memory, whatever it does with the flag.)
    ///
    /// # Panics
    /// When the export fails: the memory for such a copy cannot be allocated, or the copy is not possible (a
    /// device tensor with negative strides: the host copy engine cannot make it). `to_dlpack` returns those as
    /// errors instead.
    pub fn into_dlpack(self) -> *mut DLManagedTensorVersioned {
        let exclusive = self.is_exclusive();
        match self.export(&ExportOptions::default(), exclusive) {
            Ok(p) => p,
            Err(e) => panic!("Tensor::into_dlpack: {e}"),
        }
    }

    /// A DLPack export under explicit options (copy policy, consumer profile, highest version understood). The
    /// tensor stays usable and the export shares its memory, so the export is read-only (DLPack's read-only flag:
    /// `&[T]` slices of this tensor may be alive while the consumer holds it) unless it is a copy made for the
    /// consumer alone (its IS_COPIED flag: negative strides, or `CopyMode::Always`).
    pub fn to_dlpack(&self, options: &ExportOptions) -> Result<*mut DLManagedTensorVersioned> {
        self.export(options, false)
    }

    fn export(&self, options: &ExportOptions, writable: bool) -> Result<*mut DLManagedTensorVersioned> {
        let mut o = ffi::default_options(ffi::tw_export_options_init_sized);
        o.copy = options.copy as i32;
        o.consumer = if options.strided_consumer { ffi::TW_CONSUMER_STRIDED } else { ffi::TW_CONSUMER_PORTABLE };
        if let Some((major, minor)) = options.max_version {
            o.max_version = ffi::DLPackVersion { major, minor };
        }
        let mut out = std::ptr::null_mut();
        let mut copied: c_int = 0;
        // SAFETY: o, out and copied outlive the call.
        check(unsafe { ffi::tw_tensor_export_dlpack(self.as_raw(), &o, &mut out, &mut copied) })?;
        if !writable && copied == 0 {
            // SAFETY: a successful export returns a valid struct that the caller (this function) owns.
            unsafe { (*out).flags |= ffi::DLPACK_FLAG_BITMASK_READ_ONLY };
        }
        Ok(out)
    }

    pub fn ndim(&self) -> usize {
        // SAFETY: a live handle.
        unsafe { ffi::tw_tensor_ndim(self.as_raw()) as usize }
    }
    /// Extents, one per dimension.
    pub fn shape(&self) -> &[i64] {
        let n = self.ndim();
        if n == 0 {
            return &[];
        }
        // SAFETY: the C ABI's array lives as long as the handle (contract 4), i.e. as long as &self.
        unsafe { std::slice::from_raw_parts(ffi::tw_tensor_shape(self.as_raw()), n) }
    }
    /// Strides in elements (may be negative or zero).
    pub fn strides(&self) -> &[i64] {
        let n = self.ndim();
        if n == 0 {
            return &[];
        }
        // SAFETY: as for shape.
        unsafe { std::slice::from_raw_parts(ffi::tw_tensor_strides(self.as_raw()), n) }
    }
    /// Offset of element (0, ..., 0) from the start of the allocation, in bytes.
    pub fn byte_offset(&self) -> i64 {
        unsafe { ffi::tw_tensor_byte_offset(self.as_raw()) }
    }
    pub fn dtype(&self) -> DType {
        DType::from_dl(unsafe { ffi::tw_tensor_dtype(self.as_raw()) })
    }
    pub fn device(&self) -> Device {
        let d = unsafe { ffi::tw_tensor_device(self.as_raw()) };
        Device { kind: d.device_type, id: d.device_id }
    }
    /// How the memory arrived, when a transport made it: `"shm"` (a publisher's loan, no copy), `"shm-copy"`,
    /// `"cuda-ipc"`, `"cuda-vmm"`, `"cuda-copy"`, `"ucx"`, `"ucx-packed"`, `"ucx-cuda"`,
    /// `"ucx-staged"`; `None` otherwise.
    pub fn transport(&self) -> Option<&'static str> {
        // SAFETY: the C ABI returns a NUL-terminated string with static storage, never NULL.
        let s = unsafe { std::ffi::CStr::from_ptr(ffi::tw_tensor_transport(self.as_raw())) };
        s.to_str().ok().filter(|s| !s.is_empty())
    }
    pub fn numel(&self) -> usize {
        unsafe { ffi::tw_tensor_numel(self.as_raw()) as usize }
    }
    /// Bytes a dense copy takes.
    pub fn nbytes(&self) -> usize {
        unsafe { ffi::tw_tensor_nbytes(self.as_raw()) as usize }
    }
    pub fn is_contiguous(&self) -> bool {
        unsafe { ffi::tw_tensor_is_contiguous(self.as_raw()) != 0 }
    }
    pub fn is_readonly(&self) -> bool {
        unsafe { ffi::tw_tensor_readonly(self.as_raw()) != 0 }
    }
    /// True when this handle is the only owner of writable memory nobody else can see: `as_mut_slice` works.
    pub fn is_exclusive(&self) -> bool {
        unsafe { ffi::tw_tensor_is_exclusive(self.as_raw()) != 0 }
    }
    /// Address of element (0, ..., 0), for identity checks and FFI (borrowed: valid while `self` is).
    pub fn data_ptr(&self) -> *const c_void {
        unsafe { ffi::tw_tensor_data_borrowed(self.as_raw()) }
    }

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, dim0: usize, dim1: usize) -> Result<Tensor> {
        let (d0, d1) = (dim_i64(dim0)?, dim_i64(dim1)?);
        self.derive(|t, out| unsafe { ffi::tw_tensor_transpose(t, d0, d1, out) })
    }
    /// Reorders all dimensions (a view).
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let d = dims_i64(dims)?;
        let n = ndim_i32(d.len())?;
        self.derive(|t, out| unsafe { ffi::tw_tensor_permute(t, d.as_ptr(), n, out) })
    }
    /// Python's `t[..., start:stop:step, ...]` on `dim` (negative start/stop count from the end; a negative step
    /// walks backwards): a view. Out-of-range bounds are clamped as Python's are, which stands in for an omitted
    /// one: `slice(d, 0, i64::MAX, 1)` is `[:]`, and `slice(d, -1, i64::MIN, -1)` is `[::-1]`.
    pub fn slice(&self, dim: usize, start: i64, stop: i64, step: i64) -> Result<Tensor> {
        let d = dim_i64(dim)?;
        self.derive(|t, out| unsafe { ffi::tw_tensor_slice(t, d, start, stop, step, out) })
    }
    /// Indexes `dim` away (a negative index counts from the end): a view.
    pub fn select(&self, dim: usize, index: i64) -> Result<Tensor> {
        let d = dim_i64(dim)?;
        self.derive(|t, out| unsafe { ffi::tw_tensor_select(t, d, index, out) })
    }
    /// A view with a new shape (one extent may be -1), or `ErrorKind::CopyRequired` when the layout has none.
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        let n = ndim_i32(shape.len())?;
        self.derive(|t, out| unsafe { ffi::tw_tensor_view(t, n, shape.as_ptr(), out) })
    }
    /// Like `view`, copying when no view exists.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let n = ndim_i32(shape.len())?;
        self.derive(|t, out| unsafe { ffi::tw_tensor_reshape(t, n, shape.as_ptr(), out) })
    }
    /// The same tensor when C-contiguous, else a C-contiguous copy made by tensorwire's copy engine.
    pub fn contiguous(&self) -> Result<Tensor> {
        self.derive(|t, out| unsafe { ffi::tw_tensor_contiguous(t, out) })
    }
    /// A new C-contiguous, writable copy (always copies).
    pub fn copy(&self) -> Result<Tensor> {
        self.derive(|t, out| unsafe { ffi::tw_tensor_clone(t, out) })
    }
    /// A read-only view.
    pub fn as_readonly(&self) -> Result<Tensor> {
        self.derive(|t, out| unsafe { ffi::tw_tensor_as_readonly(t, out) })
    }
    /// Copies every element of `src` into this tensor (same shape and dtype, any layouts). Needs exclusive
    /// access, like `as_mut_slice`.
    pub fn copy_from(&mut self, src: &Tensor) -> Result<()> {
        self.require_exclusive()?;
        check(unsafe { ffi::tw_copy(src.as_raw(), self.as_raw()) })
    }

    fn require_slice<T: Element>(&self) -> Result<()> {
        if self.dtype() != T::DTYPE {
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                format!("a {} tensor cannot be viewed as a slice of {}", self.dtype(), T::DTYPE),
            ));
        }
        if !self.device().is_host_accessible() {
            return Err(Error::new(ErrorKind::Unsupported, "a slice of device memory cannot be read from the host"));
        }
        if self.numel() > 0 && (self.data_ptr() as usize) % std::mem::align_of::<T>() != 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("the data at {:p} is not aligned for {}: use to_vec()", self.data_ptr(), T::DTYPE),
            ));
        }
        if !self.is_contiguous() {
            return Err(self.not_contiguous("to_vec()"));
        }
        Ok(())
    }

    /// The error of a zero-copy read that needs C-contiguous memory, naming the copying `reader` that would do.
    fn not_contiguous(&self, reader: &str) -> Error {
        Error::new(
            ErrorKind::CopyRequired,
            format!(
                "a tensor of shape {:?} and strides {:?} is not C-contiguous: use contiguous() or {reader}",
                self.shape(),
                self.strides()
            ),
        )
    }

    fn require_exclusive(&self) -> Result<()> {
        if self.is_readonly() {
            return Err(Error::new(ErrorKind::ReadOnly, "the tensor is read-only"));
        }
        if !self.is_exclusive() {
            return Err(Error::new(
                ErrorKind::Shared,
                "another owner (a view, a clone, a DLPack export, a raw pointer or memory from outside) shares this \
                 tensor's memory: write to a copy() instead",
            ));
        }
        Ok(())
    }

    /// The elements in memory order, zero-copy. Needs a C-contiguous host tensor of element type `T`.
    pub fn as_slice<T: Pod>(&self) -> Result<&[T]> {
        self.require_slice::<T>()?;
        let n = self.numel();
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: n elements of T (any bit pattern valid) at an address aligned by tensorwire's checks on import
        // and allocation, alive as long as &self; nobody writes them while &self exists, because writers need
        // exclusive access, which a live &self to a shared handle rules out.
        Ok(unsafe { std::slice::from_raw_parts(self.data_ptr() as *const T, n) })
    }

    /// The raw bytes of a C-contiguous host tensor of any dtype, zero-copy: `nbytes()` of them, in memory order
    /// (for dtypes with no Rust element type here: complex, float8, sub-byte packed integers, ...). `to_bytes()`
    /// reads any layout.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        if !self.device().is_host_accessible() {
            return Err(Error::new(ErrorKind::Unsupported, "the bytes of device memory cannot be read from the host"));
        }
        if !self.is_contiguous() {
            return Err(self.not_contiguous("to_bytes()"));
        }
        let n = self.nbytes();
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: a C-contiguous tensor's nbytes bytes start at its data pointer and live as long as &self; nobody
        // writes them while &self exists (as for as_slice).
        Ok(unsafe { std::slice::from_raw_parts(self.data_ptr() as *const u8, n) })
    }

    /// `as_bytes`, writable: when this handle is the only owner of writable memory (as `as_mut_slice`).
    pub fn as_mut_bytes(&mut self) -> Result<&mut [u8]> {
        let n = self.as_bytes()?.len();
        self.require_exclusive()?;
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as for as_bytes, and no other owner exists while &mut self does.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data_ptr() as *mut u8, n) })
    }

    /// The bytes of a dense C-order copy as a new `Vec` (from any layout), for any dtype.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let dense = self.contiguous()?;
        Ok(dense.as_bytes()?.to_vec())
    }

    /// The elements as a mutable slice, zero-copy, when this handle is the only owner of writable memory
    /// (`ErrorKind::Shared` when a view, clone, export or foreign producer could see the writes).
    pub fn as_mut_slice<T: Pod>(&mut self) -> Result<&mut [T]> {
        self.require_slice::<T>()?;
        self.require_exclusive()?;
        let n = self.numel();
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as for as_slice, and no other owner exists while &mut self does.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.data_ptr() as *mut T, n) })
    }

    /// The elements in C order as a new `Vec`, from any layout (strided views are gathered by the copy engine).
    /// For `bool`, every byte is checked (0 or 1) and anything else is an error.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                format!("a {} tensor cannot be read as {}", self.dtype(), T::DTYPE),
            ));
        }
        let dense = self.contiguous()?;
        // (a byte copy: any alignment will do, where a slice needs T's)
        if !dense.device().is_host_accessible() {
            return Err(Error::new(ErrorKind::Unsupported, "a tensor in device memory cannot be read from the host"));
        }
        if !dense.is_contiguous() {
            return Err(dense.not_contiguous("to_vec()"));
        }
        let n = dense.numel();
        let mut out: Vec<T> = Vec::with_capacity(n);
        if n > 0 {
            let nbytes = n * std::mem::size_of::<T>();
            // SAFETY: the source holds nbytes; they are copied into memory we own before any is interpreted, and
            // for bool checked there (a concurrent writer of the source cannot change what was checked).
            unsafe {
                let dst = out.as_mut_ptr() as *mut u8;
                std::ptr::copy_nonoverlapping(dense.data_ptr() as *const u8, dst, nbytes);
                if T::DTYPE == DType::BOOL {
                    let bytes = std::slice::from_raw_parts(dst as *const u8, nbytes);
                    if let Some(i) = bytes.iter().position(|&b| b > 1) {
                        return Err(Error::new(
                            ErrorKind::InvalidArgument,
                            format!("bool element {i} holds byte {} (only 0 and 1 are booleans)", bytes[i]),
                        ));
                    }
                }
                out.set_len(n);
            }
        }
        Ok(out)
    }

    /// The tensor's metadata (a copy).
    pub fn metadata(&self) -> Result<Metadata> {
        let mut out = std::ptr::null_mut();
        check(unsafe { ffi::tw_tensor_metadata(self.as_raw(), &mut out) })?;
        let raw = unsafe { RawValue::new(out) }?;
        metadata_from_raw(raw.as_ptr())
    }

    /// Replaces this handle's metadata (other handles and views keep theirs).
    pub fn set_metadata(&mut self, metadata: &Metadata) -> Result<()> {
        let raw = metadata_to_raw(metadata)?;
        check(unsafe { ffi::tw_tensor_set_metadata(self.raw.as_ptr(), raw.as_ptr()) })
    }
}

impl Clone for Tensor {
    /// Another handle to the same view (shares memory; no data copied).
    fn clone(&self) -> Tensor {
        self.derive(|t, out| unsafe { ffi::tw_tensor_share(t, out) })
            .unwrap_or_else(|e| panic!("Tensor::clone: {e}"))
    }
}

impl Drop for Tensor {
    fn drop(&mut self) {
        // SAFETY: we own the handle.
        unsafe { ffi::tw_tensor_free(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("byte_offset", &self.byte_offset())
            .field("device", &self.device())
            .field("readonly", &self.is_readonly())
            .finish()
    }
}

/// Whether an operation may copy (Python's `copy=None / True / False`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(i32)]
pub enum CopyMode {
    /// Copy only when no view can serve.
    #[default]
    IfNeeded = ffi::TW_COPY_IF_NEEDED,
    /// Always copy.
    Always = ffi::TW_COPY_ALWAYS,
    /// Never copy: a needed copy is `ErrorKind::CopyRequired`.
    Never = ffi::TW_COPY_NEVER,
}

/// Options of `Tensor::to_dlpack`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExportOptions {
    pub copy: CopyMode,
    /// The consumer takes every strided layout, negative strides included (NumPy, tensorwire). The default
    /// (false) is any DLPack consumer: negative strides are copied, as Python's `__dlpack__` does.
    pub strided_consumer: bool,
    /// The newest DLPack version the consumer understands (default: tensorwire's, 1.4).
    pub max_version: Option<(u32, u32)>,
}
