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
    assert_eq!(size_of::<tw_publisher_options>(), 56);
    assert_eq!(size_of::<tw_subscriber_options>(), 8);
    // The library agrees: its _init writes exactly struct_size bytes of our declaration.
    let mut o = std::mem::MaybeUninit::<tw_publisher_options>::uninit();
    let o = unsafe {
        tw_publisher_options_init(o.as_mut_ptr());
        o.assume_init()
    };
    assert_eq!(o.struct_size as usize, size_of::<tw_publisher_options>());
    assert_eq!(o.depth, 8);
    let mut e = std::mem::MaybeUninit::<tw_export_options>::uninit();
    let e = unsafe {
        tw_export_options_init(e.as_mut_ptr());
        e.assume_init()
    };
    assert_eq!(e.struct_size as usize, size_of::<tw_export_options>());
    assert_eq!((e.max_version.major, e.max_version.minor), (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION));
}

#[test]
fn abi_version_is_the_declared_one() {
    assert_eq!(unsafe { tw_abi_version() } >> 16, TW_ABI_VERSION_MAJOR);
    assert!(tensorwire::version().split('.').count() == 3);
}
