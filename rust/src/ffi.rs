//! Hand-written declarations of tensorwire's C ABI (`include/tensorwire/tensorwire.h`) and of the DLPack structs
//! it is built on (`include/tensorwire/dlpack.h`, DLPack 1.4). Layouts are checked against the C header's by
//! `tests/layout.rs` (and the C side freezes them with `static_assert(offsetof(...))` in tests/cpp/test_capi.cpp).
#![allow(non_camel_case_types, missing_docs)]

use std::os::raw::{c_char, c_int, c_void};

// ---- DLPack ---------------------------------------------------------------------------------------------------
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

pub const DLPACK_MAJOR_VERSION: u32 = 1;
pub const DLPACK_MINOR_VERSION: u32 = 4;
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

pub const K_DL_CPU: i32 = 1;
pub const K_DL_CUDA: i32 = 2;
pub const K_DL_CUDA_HOST: i32 = 3;

pub const K_DL_INT: u8 = 0;
pub const K_DL_UINT: u8 = 1;
pub const K_DL_FLOAT: u8 = 2;
pub const K_DL_BFLOAT: u8 = 4;
pub const K_DL_COMPLEX: u8 = 5;
pub const K_DL_BOOL: u8 = 6;

// ---- tensorwire.h ------------------------------------------------------------------------------------------------
pub type tw_status = c_int;
pub const TW_OK: tw_status = 0;
pub const TW_ERR_INVALID_ARGUMENT: tw_status = 1;
pub const TW_ERR_TYPE_MISMATCH: tw_status = 2;
pub const TW_ERR_OUT_OF_RANGE: tw_status = 3;
pub const TW_ERR_OVERFLOW: tw_status = 4;
pub const TW_ERR_UNSUPPORTED: tw_status = 5;
pub const TW_ERR_COPY_REQUIRED: tw_status = 6;
pub const TW_ERR_DEVICE_UNAVAILABLE: tw_status = 7;
pub const TW_ERR_VERSION_MISMATCH: tw_status = 8;
pub const TW_ERR_READ_ONLY: tw_status = 9;
pub const TW_ERR_INTERNAL: tw_status = 10;
pub const TW_ERR_OUT_OF_MEMORY: tw_status = 11;
pub const TW_ERR_TIMEOUT: tw_status = 12;
pub const TW_ERR_WOULD_BLOCK: tw_status = 13;
pub const TW_END_OF_STREAM: tw_status = 14;

/// The C ABI major version this crate was written for.
pub const TW_ABI_VERSION_MAJOR: u32 = 1;
/// The minor version whose declarations this file mirrors (1.2: listen/connect/token, tw_publisher_address,
/// loans on a device, per-send options; 1.3: tw_tensor_transport; 1.4: which UCX, tw_ucx_*).
pub const TW_ABI_VERSION_MINOR: u32 = 4;

pub const TW_COPY_IF_NEEDED: i32 = 0;
pub const TW_COPY_ALWAYS: i32 = 1;
pub const TW_COPY_NEVER: i32 = 2;
pub const TW_CONSUMER_PORTABLE: i32 = 0;
pub const TW_CONSUMER_STRIDED: i32 = 1;

pub const TW_ON_FULL_BLOCK: i32 = 0;
pub const TW_ON_FULL_DROP_OLDEST: i32 = 1;
pub const TW_ON_FULL_RAISE: i32 = 2;

pub const TW_VALUE_NONE: c_int = 0;
pub const TW_VALUE_BOOL: c_int = 1;
pub const TW_VALUE_INT: c_int = 2;
pub const TW_VALUE_FLOAT: c_int = 3;
pub const TW_VALUE_STRING: c_int = 4;
pub const TW_VALUE_BYTES: c_int = 5;
pub const TW_VALUE_LIST: c_int = 6;
pub const TW_VALUE_TUPLE: c_int = 7;
pub const TW_VALUE_DICT: c_int = 8;

#[repr(C)]
#[derive(Debug)]
pub struct tw_tensor {
    _opaque: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct tw_value {
    _opaque: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct tw_publisher {
    _opaque: [u8; 0],
}
#[repr(C)]
#[derive(Debug)]
pub struct tw_subscriber {
    _opaque: [u8; 0],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tw_export_options {
    pub struct_size: u32,
    pub copy: i32,
    pub consumer: i32,
    pub has_device: i32,
    pub device: DLDevice,
    pub has_stream: i32,
    pub stream: i64,
    pub max_version: DLPackVersion,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tw_import_options {
    pub struct_size: u32,
    pub copy: i32,
    pub has_device: i32,
    pub device: DLDevice,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tw_publisher_options {
    pub struct_size: u32,
    pub on_full: i32,
    pub depth: u64,
    pub max_metadata_bytes: u64,
    pub max_buffers: u64,
    pub pool_bytes: u64,
    pub max_subscribers: u64,
    pub protect_sent_loans: i32,
    pub allow_other_users: i32,
    // ABI 1.2
    pub listen: *const c_char,
    pub token: *const c_char,
    pub insecure: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tw_subscriber_options {
    pub struct_size: u32,
    pub allow_other_users: i32,
    // ABI 1.2
    pub connect: *const c_char,
    pub token: *const c_char,
    pub has_device: i32,
    pub device: DLDevice,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tw_send_options {
    pub struct_size: u32,
    pub copy: i32,
    pub timeout_ns: i64,
    pub extra: *const tw_value,
    pub stream: isize,
}

pub type ReleaseFn = unsafe extern "C" fn(ctx: *mut c_void);

extern "C" {
    pub fn tw_abi_version() -> u32;
    pub fn tw_version() -> *const c_char;
    pub fn tw_last_error() -> *const c_char;
    pub fn tw_status_name(status: tw_status) -> *const c_char;

    pub fn tw_tensor_from_dlpack(managed: *mut DLManagedTensorVersioned, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_export_options_init_sized(options: *mut tw_export_options, size: usize);
    pub fn tw_import_options_init_sized(options: *mut tw_import_options, size: usize);
    pub fn tw_tensor_export_dlpack(
        t: *const tw_tensor,
        options: *const tw_export_options,
        out: *mut *mut DLManagedTensorVersioned,
        copied: *mut c_int,
    ) -> tw_status;
    pub fn tw_tensor_import_dlpack(
        managed: *mut DLManagedTensorVersioned,
        options: *const tw_import_options,
        out: *mut *mut tw_tensor,
    ) -> tw_status;
    pub fn tw_tensor_as_readonly(t: *const tw_tensor, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_adopt(
        data: *mut c_void,
        ndim: i32,
        shape: *const i64,
        strides: *const i64,
        dtype: DLDataType,
        device: DLDevice,
        release: Option<ReleaseFn>,
        ctx: *mut c_void,
        out: *mut *mut tw_tensor,
    ) -> tw_status;
    pub fn tw_tensor_zeros(ndim: i32, shape: *const i64, dtype: DLDataType, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_empty(ndim: i32, shape: *const i64, dtype: DLDataType, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_share(t: *const tw_tensor, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_free(t: *mut tw_tensor);

    pub fn tw_tensor_ndim(t: *const tw_tensor) -> i32;
    pub fn tw_tensor_shape(t: *const tw_tensor) -> *const i64;
    pub fn tw_tensor_strides(t: *const tw_tensor) -> *const i64;
    pub fn tw_tensor_byte_offset(t: *const tw_tensor) -> i64;
    pub fn tw_tensor_data_borrowed(t: *const tw_tensor) -> *mut c_void;
    pub fn tw_tensor_numel(t: *const tw_tensor) -> i64;
    pub fn tw_tensor_nbytes(t: *const tw_tensor) -> i64;
    pub fn tw_tensor_dtype(t: *const tw_tensor) -> DLDataType;
    pub fn tw_tensor_device(t: *const tw_tensor) -> DLDevice;
    pub fn tw_tensor_is_contiguous(t: *const tw_tensor) -> c_int;
    pub fn tw_tensor_readonly(t: *const tw_tensor) -> c_int;
    pub fn tw_tensor_is_exclusive(t: *const tw_tensor) -> c_int;

    pub fn tw_tensor_contiguous(t: *const tw_tensor, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_slice(
        t: *const tw_tensor,
        dim: i64,
        start: i64,
        stop: i64,
        step: i64,
        out: *mut *mut tw_tensor,
    ) -> tw_status;
    pub fn tw_tensor_permute(t: *const tw_tensor, dims: *const i64, ndim: i32, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_transpose(t: *const tw_tensor, dim0: i64, dim1: i64, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_select(t: *const tw_tensor, dim: i64, index: i64, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_view(t: *const tw_tensor, ndim: i32, shape: *const i64, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_tensor_reshape(t: *const tw_tensor, ndim: i32, shape: *const i64, out: *mut *mut tw_tensor)
        -> tw_status;
    pub fn tw_tensor_clone(t: *const tw_tensor, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_copy(src: *const tw_tensor, dst: *const tw_tensor) -> tw_status;

    pub fn tw_value_none() -> *mut tw_value;
    pub fn tw_value_bool(b: c_int) -> *mut tw_value;
    pub fn tw_value_int(v: i64) -> *mut tw_value;
    pub fn tw_value_float(v: f64) -> *mut tw_value;
    pub fn tw_value_string(s: *const c_char, len: usize) -> *mut tw_value;
    pub fn tw_value_bytes(data: *const c_void, len: usize) -> *mut tw_value;
    pub fn tw_value_list() -> *mut tw_value;
    pub fn tw_value_tuple() -> *mut tw_value;
    pub fn tw_value_dict() -> *mut tw_value;
    pub fn tw_value_free(v: *mut tw_value);
    pub fn tw_value_append(container: *mut tw_value, item: *mut tw_value) -> tw_status;
    pub fn tw_value_dict_set(dict: *mut tw_value, key: *const c_char, key_len: usize, value: *mut tw_value)
        -> tw_status;
    pub fn tw_value_get_kind(v: *const tw_value) -> c_int;
    pub fn tw_value_get_bool(v: *const tw_value, out: *mut c_int) -> tw_status;
    pub fn tw_value_get_int(v: *const tw_value, out: *mut i64) -> tw_status;
    pub fn tw_value_get_float(v: *const tw_value, out: *mut f64) -> tw_status;
    pub fn tw_value_get_data(v: *const tw_value, data: *mut *const c_char, len: *mut usize) -> tw_status;
    pub fn tw_value_len(v: *const tw_value) -> usize;
    pub fn tw_value_item(v: *const tw_value, i: usize) -> *const tw_value;
    pub fn tw_value_key(v: *const tw_value, i: usize, key: *mut *const c_char, len: *mut usize) -> tw_status;
    pub fn tw_tensor_metadata(t: *const tw_tensor, out: *mut *mut tw_value) -> tw_status;
    pub fn tw_tensor_set_metadata(t: *mut tw_tensor, dict: *const tw_value) -> tw_status;

    pub fn tw_publisher_options_init_sized(options: *mut tw_publisher_options, size: usize);
    pub fn tw_subscriber_options_init_sized(options: *mut tw_subscriber_options, size: usize);
    pub fn tw_send_options_init_sized(options: *mut tw_send_options, size: usize);
    pub fn tw_publisher_loan_on(
        p: *mut tw_publisher,
        ndim: i32,
        shape: *const i64,
        dtype: DLDataType,
        device: DLDevice,
        timeout_ns: i64,
        out: *mut *mut tw_tensor,
    ) -> tw_status;
    pub fn tw_publisher_send_with(
        p: *mut tw_publisher,
        t: *const tw_tensor,
        options: *const tw_send_options,
        delivered: *mut usize,
    ) -> tw_status;
    pub fn tw_tensor_transport(t: *const tw_tensor) -> *const c_char;
    pub fn tw_publisher_new(
        name: *const c_char,
        options: *const tw_publisher_options,
        out: *mut *mut tw_publisher,
    ) -> tw_status;
    pub fn tw_publisher_free(p: *mut tw_publisher);
    pub fn tw_publisher_close(p: *mut tw_publisher);
    pub fn tw_publisher_loan(
        p: *mut tw_publisher,
        ndim: i32,
        shape: *const i64,
        dtype: DLDataType,
        timeout_ns: i64,
        out: *mut *mut tw_tensor,
    ) -> tw_status;
    pub fn tw_publisher_send(
        p: *mut tw_publisher,
        t: *const tw_tensor,
        extra: *const tw_value,
        timeout_ns: i64,
        delivered: *mut usize,
    ) -> tw_status;
    pub fn tw_publisher_send_move(
        p: *mut tw_publisher,
        t: *mut *mut tw_tensor,
        extra: *const tw_value,
        timeout_ns: i64,
        delivered: *mut usize,
    ) -> tw_status;
    pub fn tw_publisher_address(p: *const tw_publisher, buf: *mut c_char, len: usize) -> usize;
    pub fn tw_ucx_library(buf: *mut c_char, len: usize) -> usize;
    pub fn tw_ucx_version(buf: *mut c_char, len: usize) -> usize;
    pub fn tw_ucx_unavailable_reason(buf: *mut c_char, len: usize) -> usize;
    pub fn tw_prefer_ucx_library(path: *const c_char) -> c_int;
    pub fn tw_publisher_subscriber_count(p: *const tw_publisher) -> usize;
    pub fn tw_publisher_dropped(p: *const tw_publisher) -> u64;
    pub fn tw_publisher_closed(p: *const tw_publisher) -> c_int;

    pub fn tw_subscriber_new(
        name: *const c_char,
        options: *const tw_subscriber_options,
        out: *mut *mut tw_subscriber,
    ) -> tw_status;
    pub fn tw_subscriber_free(s: *mut tw_subscriber);
    pub fn tw_subscriber_close(s: *mut tw_subscriber);
    pub fn tw_subscriber_recv(s: *mut tw_subscriber, timeout_ns: i64, out: *mut *mut tw_tensor) -> tw_status;
    pub fn tw_subscriber_closed(s: *const tw_subscriber) -> c_int;
    pub fn tw_subscriber_connected(s: *const tw_subscriber) -> c_int;
    pub fn tw_subscriber_dropped(s: *const tw_subscriber) -> u64;
    pub fn tw_subscriber_fileno(s: *mut tw_subscriber) -> c_int;
}

/// The defaults of a size-versioned options struct: the library fills exactly `size_of::<T>()` bytes (this crate's
/// view of the struct), never more, so a newer library cannot write past it.
pub(crate) fn default_options<T>(init: unsafe extern "C" fn(*mut T, usize)) -> T {
    let mut o = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: init writes at most size_of::<T>() bytes into o; the options structs are integer fields and raw
    // pointers, for which the zeroed bytes it might leave are valid values (0, null).
    unsafe {
        init(o.as_mut_ptr(), std::mem::size_of::<T>());
        o.assume_init()
    }
}
