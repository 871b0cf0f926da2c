//! The FFI module's struct layouts equal the C header's (tests/cpp/test_capi.cpp and test_abi_layout.cpp freeze
//! the same offsets on the C side), and the linked library speaks the C ABI this crate declares.
use std::mem::{offset_of, size_of};
use tensorwire::ffi::*;

#[test]
fn dlpack_layouts_match_the_header() {
    assert_eq!((offset_of!(DLDevice, device_id), size_of::<DLDevice>()), (4, 8));
    assert_eq!((offset_of!(DLDataType, bits), offset_of!(DLDataType, lanes), size_of::<DLDataType>()), (1, 2, 4));
    assert_eq!(offset_of!(DLTensor, device), 8);
    assert_eq!(offset_of!(DLTensor, ndim), 16);
    assert_eq!(offset_of!(DLTensor, dtype), 20);
    assert_eq!(offset_of!(DLTensor, shape), 24);
    assert_eq!(offset_of!(DLTensor, strides), 32);
    assert_eq!(offset_of!(DLTensor, byte_offset), 40);
    assert_eq!(size_of::<DLTensor>(), 48);
    assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
    assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
    assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
    assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
}

#[test]
fn option_structs_match_the_header() {
    assert_eq!(offset_of!(tw_export_options, stream), 32);
    assert_eq!(offset_of!(tw_export_options, max_version), 40);
    assert_eq!(size_of::<tw_export_options>(), 48);
    assert_eq!(offset_of!(tw_import_options, device), 12);
    assert_eq!(size_of::<tw_import_options>(), 20);
    assert_eq!(offset_of!(tw_publisher_options, depth), 8);
    assert_eq!(offset_of!(tw_publisher_options, max_subscribers), 40);
    assert_eq!(offset_of!(tw_publisher_options, protect_sent_loans), 48);
    assert_eq!(offset_of!(tw_publisher_options, allow_other_users), 52);
    assert_eq!(offset_of!(tw_publisher_options, listen), 56); // ABI 1.2
    assert_eq!(offset_of!(tw_publisher_options, token), 64);
    assert_eq!(offset_of!(tw_publisher_options, insecure), 72);
    assert_eq!(size_of::<tw_publisher_options>(), 80);
    assert_eq!(offset_of!(tw_subscriber_options, connect), 8);
    assert_eq!(offset_of!(tw_subscriber_options, token), 16);
    assert_eq!(offset_of!(tw_subscriber_options, has_device), 24);
    assert_eq!(offset_of!(tw_subscriber_options, device), 28);
    assert_eq!(size_of::<tw_subscriber_options>(), 40);
    assert_eq!(offset_of!(tw_send_options, copy), 4);
    assert_eq!(offset_of!(tw_send_options, timeout_ns), 8);
    assert_eq!(offset_of!(tw_send_options, extra), 16);
    assert_eq!(offset_of!(tw_send_options, stream), 24);
    assert_eq!(size_of::<tw_send_options>(), 32);
    let mut sb = [0xEFu8; 32 + 16];
    let s = sb.as_mut_ptr() as *mut tw_send_options;
    unsafe { tw_send_options_init_sized(s, size_of::<tw_send_options>()) };
    let s = unsafe { std::ptr::read_unaligned(s) };
    assert_eq!(s.struct_size as usize, size_of::<tw_send_options>());
    assert_eq!((s.copy, s.timeout_ns, s.stream), (TW_COPY_IF_NEEDED, -1, 0));
    assert!(s.extra.is_null());
    assert!(sb[32..].iter().all(|&b| b == 0xEF), "the library wrote past the struct");
    // The library agrees: its _init_sized fills our declaration's size and not one byte more.
    let mut buf = [0xABu8; 80 + 16];
    let o = buf.as_mut_ptr() as *mut tw_publisher_options;
    unsafe { tw_publisher_options_init_sized(o, size_of::<tw_publisher_options>()) };
    let o = unsafe { std::ptr::read_unaligned(o) };
    assert_eq!(o.struct_size as usize, size_of::<tw_publisher_options>());
    assert_eq!(o.depth, 8);
    assert!(o.listen.is_null() && o.token.is_null() && o.insecure == 0);
    assert!(buf[80..].iter().all(|&b| b == 0xAB), "the library wrote past the struct");
    let mut eb = [0xCDu8; 48 + 16];
    let e = eb.as_mut_ptr() as *mut tw_export_options;
    unsafe { tw_export_options_init_sized(e, size_of::<tw_export_options>()) };
    let e = unsafe { std::ptr::read_unaligned(e) };
    assert_eq!(e.struct_size as usize, size_of::<tw_export_options>());
    assert_eq!((e.max_version.major, e.max_version.minor), (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION));
    assert!(eb[48..].iter().all(|&b| b == 0xCD), "the library wrote past the struct");
}

#[test]
fn status_numbers_match_the_library() {
    let name = |s| unsafe { std::ffi::CStr::from_ptr(tw_status_name(s)) }.to_str().unwrap().to_string();
    let want = [
        (TW_OK, "ok"),
        (TW_ERR_INVALID_ARGUMENT, "invalid_argument"),
        (TW_ERR_TYPE_MISMATCH, "type_mismatch"),
        (TW_ERR_OUT_OF_RANGE, "out_of_range"),
        (TW_ERR_OVERFLOW, "overflow"),
        (TW_ERR_UNSUPPORTED, "unsupported"),
        (TW_ERR_COPY_REQUIRED, "copy_required"),
        (TW_ERR_DEVICE_UNAVAILABLE, "device_unavailable"),
        (TW_ERR_VERSION_MISMATCH, "version_mismatch"),
        (TW_ERR_READ_ONLY, "read_only"),
        (TW_ERR_INTERNAL, "internal"),
        (TW_ERR_OUT_OF_MEMORY, "out_of_memory"),
        (TW_ERR_TIMEOUT, "timeout"),
        (TW_ERR_WOULD_BLOCK, "would_block"),
        (TW_END_OF_STREAM, "end_of_stream"),
    ];
    for (status, n) in want {
        assert_eq!(name(status), n, "status {status}");
    }
}

#[test]
fn abi_version_is_the_declared_one() {
    assert_eq!(unsafe { tw_abi_version() } >> 16, TW_ABI_VERSION_MAJOR);
    assert!(tensorwire::version().split('.').count() == 3);
}
