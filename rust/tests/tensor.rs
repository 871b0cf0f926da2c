//! The safe API: dtypes, views, copies, DLPack in and out under the C++ policy, metadata, and every misuse
//! refused with an Error naming it.
use tensorwire::ffi::{self, DLManagedTensorVersioned};
use tensorwire::{CopyMode, DType, Element, ErrorKind, ExportOptions, Metadata, Tensor, Value, BF16, F16};

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<Tensor>();
    assert_send_sync::<tensorwire::Publisher>();
    assert_send_sync::<tensorwire::Subscriber>();
}

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: Vec<T>) {
    let n = values.len();
    let expect = values.clone();
    let t = Tensor::from_vec(values, &[2, n / 2]).unwrap();
    assert_eq!(t.dtype(), T::DTYPE);
    assert_eq!(t.dtype().itemsize(), std::mem::size_of::<T>());
    let tr = t.transpose(0, 1).unwrap();
    let dl = tr.into_dlpack();
    unsafe {
        assert_eq!((*dl).dl_tensor.dtype.code, T::DTYPE.code);
        assert_eq!((*dl).flags & ffi::DLPACK_FLAG_BITMASK_IS_COPIED, 0, "a positive-stride view crosses as it is");
    }
    let back = unsafe { Tensor::from_dlpack(dl) }.unwrap();
    assert_eq!(back.strides(), &[1, (n / 2) as i64]);
    assert_eq!(back.transpose(0, 1).unwrap().to_vec::<T>().unwrap(), expect);
}

#[test]
fn every_dtype_round_trips_through_dlpack() {
    round_trip(vec![true, false, false, true]);
    round_trip(vec![-1i8, 2, -3, 4]);
    round_trip(vec![-1i16, 2, i16::MIN, i16::MAX]);
    round_trip(vec![-1i32, 2, i32::MIN, i32::MAX]);
    round_trip(vec![-1i64, 2, i64::MIN, i64::MAX]);
    round_trip(vec![1u8, 2, 0, 255]);
    round_trip(vec![1u16, 2, 0, u16::MAX]);
    round_trip(vec![1u32, 2, 0, u32::MAX]);
    round_trip(vec![1u64, 2, 0, u64::MAX]);
    round_trip(vec![1.5f32, -0.0, f32::MAX, f32::MIN_POSITIVE]);
    round_trip(vec![1.5f64, -0.0, f64::MAX, f64::MIN_POSITIVE]);
    round_trip(vec![F16(0x3C00), F16(0xC000), F16(0x7C00), F16(1)]);
    round_trip(vec![BF16::from_f32_truncated(1.0), BF16(0xC000), BF16(0x7F80), BF16(1)]);
    assert_eq!(BF16::from_f32_truncated(-2.0).to_f32(), -2.0);
    assert_eq!(DType::BF16.name(), "bfloat16");
    assert_eq!(DType::F32.to_string(), "float32");
    assert_eq!(DType::BOOL.to_string(), "bool");
}

#[test]
fn views_and_copies() {
    let t = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[2, 3, 4]).unwrap();
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert_eq!(p.shape(), &[4, 2, 3]);
    assert_eq!(p.strides(), &[1, 12, 4]);
    assert!(!p.is_contiguous());
    assert_eq!(p.view(&[-1]).unwrap_err().kind(), ErrorKind::CopyRequired);
    let flat = p.reshape(&[-1]).unwrap();
    assert_eq!(flat.as_slice::<f32>().unwrap()[..4], [0.0, 4.0, 8.0, 12.0]);
    let rev = t.select(0, -1).unwrap().slice(1, -1, -5, -1).unwrap(); // t[-1, :, ::-1]
    assert_eq!(rev.strides(), &[4, -1]);
    assert_eq!(rev.to_vec::<f32>().unwrap()[..4], [15.0, 14.0, 13.0, 12.0]);
    let dense = rev.contiguous().unwrap();
    assert!(dense.is_contiguous());
    let same = dense.contiguous().unwrap();
    assert_eq!(same.data_ptr(), dense.data_ptr(), "contiguous() of a contiguous tensor is free");
    let mut c = rev.copy().unwrap();
    assert_ne!(c.data_ptr(), rev.data_ptr());
    c.as_mut_slice::<f32>().unwrap()[0] = -1.0;
    assert_eq!(rev.to_vec::<f32>().unwrap()[0], 15.0, "a copy is independent");

    let mut z = Tensor::zeros(DType::I16, &[2, 2]).unwrap();
    let src = Tensor::from_vec(vec![1i16, 2, 3, 4], &[2, 2]).unwrap();
    z.copy_from(&src.transpose(0, 1).unwrap()).unwrap();
    assert_eq!(z.as_slice::<i16>().unwrap(), &[1, 3, 2, 4]);
}

#[test]
fn slice_bounds_clamp_as_pythons_do_so_extremes_stand_for_omitted_ones() {
    let t = Tensor::from_vec((0..4i32).collect(), &[4]).unwrap();
    let rev = t.slice(0, -1, i64::MIN, -1).unwrap().contiguous().unwrap(); // [::-1]
    assert_eq!(rev.as_slice::<i32>().unwrap(), &[3, 2, 1, 0]);
    let all = t.slice(0, i64::MIN, i64::MAX, 1).unwrap(); // [:]
    assert_eq!(all.as_slice::<i32>().unwrap(), &[0, 1, 2, 3]);
    let odd = t.slice(0, 1, i64::MAX, 2).unwrap().contiguous().unwrap(); // [1::2]
    assert_eq!(odd.as_slice::<i32>().unwrap(), &[1, 3]);
}

#[test]
fn negative_strides_follow_pythons_dlpack_rule() {
    let t = Tensor::from_vec((0..6).map(|i| i as f64).collect(), &[6]).unwrap();
    let rev = t.slice(0, 5, -7, -1).unwrap();
    assert_eq!(rev.strides(), &[-1]);
    // Any consumer (the default, like __dlpack__()): a copy, flagged as one.
    let dl = rev.to_dlpack(&ExportOptions::default()).unwrap();
    unsafe {
        assert_ne!((*dl).flags & ffi::DLPACK_FLAG_BITMASK_IS_COPIED, 0);
        assert_eq!(*(*dl).dl_tensor.strides, 1);
    }
    let back = unsafe { Tensor::from_dlpack(dl) }.unwrap();
    assert_eq!(back.as_slice::<f64>().unwrap(), &[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]);
    // A strided consumer takes the view as it is; copy=never refuses the portable copy with the policy's words.
    let dl = rev.to_dlpack(&ExportOptions { strided_consumer: true, ..Default::default() }).unwrap();
    unsafe {
        assert_eq!(*(*dl).dl_tensor.strides, -1);
        ((*dl).deleter.unwrap())(dl);
    }
    let err = rev.to_dlpack(&ExportOptions { copy: CopyMode::Never, ..Default::default() }).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CopyRequired);
    assert!(err.message().contains("negative"), "{err}");
    // A consumer that understands only DLPack 0.x gets no versioned struct.
    let err = rev.to_dlpack(&ExportOptions { max_version: Some((0, 8)), ..Default::default() }).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::VersionMismatch, "{err}");
}

#[test]
fn mutation_needs_exclusive_access() {
    let mut t = Tensor::from_vec(vec![0u8; 8], &[8]).unwrap();
    t.as_mut_slice::<u8>().unwrap()[0] = 1;
    let view = t.slice(0, 0, 4, 1).unwrap();
    let err = t.as_mut_slice::<u8>().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shared);
    assert!(err.message().contains("copy()"), "{err}");
    drop(view);
    assert!(t.as_mut_slice::<u8>().is_ok(), "exclusive again once the view is gone");
    let mut ro = t.as_readonly().unwrap();
    drop(t);
    assert_eq!(ro.as_mut_slice::<u8>().unwrap_err().kind(), ErrorKind::ReadOnly);
    assert_eq!(ro.as_slice::<u8>().unwrap()[0], 1);
}

#[test]
fn misuse_is_an_error_naming_it() {
    let t = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    let e = t.as_slice::<f64>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::TypeMismatch);
    assert!(e.message().contains("float32") && e.message().contains("float64"), "{e}");
    let e = t.transpose(0, 1).unwrap().as_slice::<f32>().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::CopyRequired);
    assert!(e.message().contains("contiguous()"), "{e}");
    fails(t.select(0, 2), ErrorKind::OutOfRange, "index 2 is out of range");
    fails(t.transpose(0, 5), ErrorKind::OutOfRange, "dimension 5");
    fails(t.transpose(usize::MAX, 0), ErrorKind::OutOfRange, "dimension 18446744073709551615 is out of range");
    fails(t.permute(&[0]), ErrorKind::InvalidArgument, "permute");
    fails(t.slice(0, 0, 1, 0), ErrorKind::InvalidArgument, "step");
    fails(t.to_vec::<i32>(), ErrorKind::TypeMismatch, "int32");
    fails(Tensor::from_vec(vec![1u8; 4], &[usize::MAX, 2]), ErrorKind::Overflow, "does not fit in i64");
    fails(Tensor::from_vec(vec![1u8; 4], &[3]), ErrorKind::InvalidArgument, "a Vec of 4 elements cannot have shape [3]");
    fails(unsafe { Tensor::from_dlpack(std::ptr::null_mut()) }, ErrorKind::InvalidArgument, "pointer is null");
}

/// `r` failed with `kind`, and its message says `text`.
fn fails<T: std::fmt::Debug>(r: tensorwire::Result<T>, kind: ErrorKind, text: &str) {
    let e = r.unwrap_err();
    assert_eq!(e.kind(), kind, "{e}");
    assert!(e.message().contains(text), "expected {text:?} in {:?}", e.message());
}

struct Foreign {
    bytes: [u8; 4],
    shape: [i64; 1],
}

unsafe extern "C" fn free_managed(m: *mut DLManagedTensorVersioned) {
    // SAFETY: both boxes were leaked by the test below and are freed exactly once, here.
    unsafe {
        drop(Box::from_raw((*m).manager_ctx as *mut Foreign));
        drop(Box::from_raw(m));
    }
}

#[test]
fn foreign_bool_bytes_are_checked() {
    // A producer claims bool for bytes that are not 0 or 1 (another process, a C library): to_vec refuses them.
    let owned = Box::into_raw(Box::new(Foreign { bytes: [0, 1, 2, 1], shape: [4] }));
    let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: ffi::DLPackVersion { major: 1, minor: 0 },
        manager_ctx: owned.cast(),
        deleter: Some(free_managed),
        flags: ffi::DLPACK_FLAG_BITMASK_READ_ONLY,
        dl_tensor: ffi::DLTensor {
            data: unsafe { (*owned).bytes.as_mut_ptr() }.cast(),
            device: ffi::DLDevice { device_type: ffi::K_DL_CPU, device_id: 0 },
            ndim: 1,
            dtype: ffi::DLDataType { code: ffi::K_DL_BOOL, bits: 8, lanes: 1 },
            shape: unsafe { (*owned).shape.as_mut_ptr() },
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
    }));
    let t = unsafe { Tensor::from_dlpack(m) }.unwrap();
    assert!(t.is_readonly());
    let e = t.to_vec::<bool>().unwrap_err();
    assert!(e.message().contains("bool element 2 holds byte 2"), "{e}");
}

#[test]
fn metadata_round_trips_every_kind() {
    let inner = Metadata::new().with("format", "XYXY").with("canvas", Value::Tuple(vec![480.into(), 640.into()]));
    let m = Metadata::new()
        .with("step", 7)
        .with("scale", 0.25)
        .with("ok", true)
        .with("none", Value::None)
        .with("name", "caméra\u{0}2")
        .with("raw", Value::Bytes(vec![0, 255, 10]))
        .with("list", Value::List(vec![1.into(), "two".into(), Value::List(vec![])]))
        .with("boxes", inner);
    let mut t = Tensor::zeros(DType::F32, &[1]).unwrap();
    t.set_metadata(&m).unwrap();
    let got = t.metadata().unwrap();
    assert_eq!(got, m);
    assert_eq!(got.keys().collect::<Vec<_>>(), ["step", "scale", "ok", "none", "name", "raw", "list", "boxes"]);
    // Views copy it; a handle's own changes stay its own.
    let v = t.slice(0, 0, 1, 1).unwrap();
    t.set_metadata(&Metadata::new().with("step", 8)).unwrap();
    assert_eq!(v.metadata().unwrap().get("step"), Some(&Value::Int(7)));
    assert_eq!(t.metadata().unwrap().len(), 1);
}

#[test]
fn metadata_deeper_than_the_encoding_is_an_error_not_an_overflowed_stack() {
    // Converting to the C ABI's tree recursed without a limit: 30 000 levels aborted a spawned thread.
    let nest = |levels: usize| {
        let mut v = Value::List(vec![]);
        for _ in 1..levels {
            v = Value::List(vec![v]);
        }
        Metadata::new().with("deep", v)
    };
    let mut t = Tensor::zeros(DType::F32, &[1]).unwrap();
    t.set_metadata(&nest(64)).unwrap(); // the dict and 64 lists: as deep as the encoding goes
    // (a large stack: building and dropping a deep Rust value recurse too, which is not tensorwire's to fix)
    let e = std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || {
            let deep = nest(10_000);
            let mut u = Tensor::zeros(DType::F32, &[1]).unwrap();
            u.set_metadata(&deep).map_err(|e| (e.kind(), e.message().to_string()))
        })
        .unwrap()
        .join()
    .unwrap()
    .unwrap_err();
    assert_eq!(e.0, ErrorKind::InvalidArgument);
    assert!(e.1.contains("nested deeper than 64 levels"), "{}", e.1);
}

#[test]
fn to_vec_reads_contiguous_data_at_any_alignment() {
    // A float32 view one byte into a buffer (NumPy hands these out: np.frombuffer(b, np.float32, offset=1)):
    // to_vec refused it as misaligned and said "use to_vec()"; it copies bytes, so any alignment will do.
    let want = [1.5f32, -2.0, 3.25, 1e-3];
    let mut bytes = vec![0u8; 1];
    for x in want {
        bytes.extend_from_slice(&x.to_ne_bytes());
    }
    let dl = Tensor::from_vec(bytes, &[17]).unwrap().into_dlpack();
    unsafe {
        (*dl).dl_tensor.dtype = ffi::DLDataType { code: ffi::K_DL_FLOAT, bits: 32, lanes: 1 };
        *(*dl).dl_tensor.shape = 4;
        (*dl).dl_tensor.strides = std::ptr::null_mut();
        (*dl).dl_tensor.byte_offset += 1;
    }
    let t = unsafe { Tensor::from_dlpack(dl) }.unwrap();
    assert_eq!(t.data_ptr() as usize % 4, 1, "the view is misaligned");
    assert_eq!(t.to_vec::<f32>().unwrap(), want);
    let e = t.as_slice::<f32>().unwrap_err(); // a slice does need alignment
    assert!(e.message().contains("not aligned"), "{e}");
}

fn flags(dl: *mut DLManagedTensorVersioned) -> u64 {
    unsafe { (*dl).flags }
}

fn delete(dl: *mut DLManagedTensorVersioned) {
    unsafe { ((*dl).deleter.unwrap())(dl) }
}

#[test]
fn an_export_is_writable_only_when_it_takes_the_only_owner() {
    const RO: u64 = ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
    const COPIED: u64 = ffi::DLPACK_FLAG_BITMASK_IS_COPIED;
    // to_dlpack(&self): the tensor stays, and may hand out &[T] while the consumer holds the export.
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let s = t.as_slice::<f32>().unwrap();
    let dl = t.to_dlpack(&ExportOptions::default()).unwrap();
    assert_eq!(flags(dl) & (RO | COPIED), RO, "a shared export is read-only");
    assert_eq!(unsafe { (*dl).dl_tensor.data } as *const f32, s.as_ptr(), "and zero-copy");
    let back = unsafe { Tensor::from_dlpack(dl) }.unwrap();
    assert!(back.is_readonly(), "the flag is honoured on the way back in");
    assert_eq!(s, &[1.0; 4]);
    // A copy made for the consumer is its own: writable.
    let dl = t.to_dlpack(&ExportOptions { copy: CopyMode::Always, ..Default::default() }).unwrap();
    assert_eq!(flags(dl) & (RO | COPIED), COPIED);
    delete(dl);
    // into_dlpack of the only owner hands the memory over whole: writable, as as_mut_slice was.
    let mut only = Tensor::from_vec(vec![2u8; 8], &[8]).unwrap();
    only.as_mut_slice::<u8>().unwrap()[0] = 3;
    let dl = only.into_dlpack();
    assert_eq!(flags(dl) & RO, 0);
    delete(dl);
    // into_dlpack while a view (or a clone) still shares the memory: read-only.
    let a = Tensor::from_vec(vec![5i32; 6], &[2, 3]).unwrap();
    let view = a.transpose(0, 1).unwrap();
    let dl = a.into_dlpack();
    assert_eq!(flags(dl) & RO, RO);
    delete(dl);
    assert_eq!(view.to_vec::<i32>().unwrap(), vec![5; 6]);
}

#[test]
fn bytes_of_any_dtype() {
    // complex64 has no Rust element type here: its bytes are still reachable, and writable, without unsafe.
    let mut c = Tensor::zeros(DType::C64, &[2]).unwrap();
    assert_eq!(c.as_bytes().unwrap(), &[0u8; 16]);
    c.as_mut_bytes().unwrap()[4..8].copy_from_slice(&(-2.0f32).to_ne_bytes()); // element 0's imaginary part
    let b = c.as_bytes().unwrap();
    assert_eq!(b.len(), 16);
    assert_eq!(&b[4..8], &(-2.0f32).to_ne_bytes());
    let shared = c.clone();
    assert_eq!(c.as_mut_bytes().unwrap_err().kind(), ErrorKind::Shared);
    drop(shared);
    let t = Tensor::from_vec((0u16..6).collect(), &[2, 3]).unwrap();
    let tt = t.transpose(0, 1).unwrap();
    let err = tt.as_bytes().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CopyRequired);
    assert!(err.message().contains("to_bytes()"), "{err}");
    let expect: Vec<u8> = [0u16, 3, 1, 4, 2, 5].iter().flat_map(|v| v.to_ne_bytes()).collect();
    assert_eq!(tt.to_bytes().unwrap(), expect);
    assert_eq!(Tensor::zeros(DType::U8, &[0]).unwrap().as_bytes().unwrap(), &[] as &[u8]);
}
