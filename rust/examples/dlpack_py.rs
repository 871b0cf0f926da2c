//! A cdylib that a Python process loads with ctypes (tests/python_dlpack.rs): Rust tensors cross into Python as
//! DLPack structs and come back, with a counting allocator that proves each adopted Vec is dropped exactly once,
//! whichever side lets go last.
use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CStr;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorwire::ffi::DLManagedTensorVersioned;
use tensorwire::{Element, Tensor, BF16, F16};

const SLOTS: usize = 64;
#[allow(clippy::declare_interior_mutable_const)] // a repeat-expression seed (inline const blocks need Rust 1.79)
const UNTRACKED: AtomicUsize = AtomicUsize::new(0);
static TRACKED: [AtomicUsize; SLOTS] = [UNTRACKED; SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);
static LAST_DATA: AtomicUsize = AtomicUsize::new(0);

struct Counting;
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        for slot in &TRACKED {
            if slot.compare_exchange(ptr as usize, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                FREES.fetch_add(1, Ordering::SeqCst);
            }
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

fn adopt<T: Element>(f: impl Fn(usize) -> T) -> Tensor {
    let v: Vec<T> = (0..12).map(f).collect();
    let addr = v.as_ptr() as usize;
    TRACKED[NEXT.fetch_add(1, Ordering::SeqCst) % SLOTS].store(addr, Ordering::SeqCst);
    LAST_DATA.store(addr, Ordering::SeqCst);
    Tensor::from_vec(v, &[3, 4]).unwrap()
}

/// Element k of a 3x4 matrix is k % 5 (bool: k % 2 == 1); the tensor crosses transposed (strided).
fn pattern(name: &str, track: bool) -> Option<Tensor> {
    let half = |k: usize| [0x0000u16, 0x3C00, 0x4000, 0x4200, 0x4400][k % 5];
    let t = match (name, track) {
        ("bool", _) => adopt(|k| k % 2 == 1),
        ("int8", _) => adopt(|k| (k % 5) as i8),
        ("int16", _) => adopt(|k| (k % 5) as i16),
        ("int32", _) => adopt(|k| (k % 5) as i32),
        ("int64", _) => adopt(|k| (k % 5) as i64),
        ("uint8", _) => adopt(|k| (k % 5) as u8),
        ("uint16", _) => adopt(|k| (k % 5) as u16),
        ("uint32", _) => adopt(|k| (k % 5) as u32),
        ("uint64", _) => adopt(|k| (k % 5) as u64),
        ("float16", _) => adopt(|k| F16(half(k))),
        ("bfloat16", _) => adopt(|k| BF16::from_f32_truncated((k % 5) as f32)),
        ("float32", _) => adopt(|k| (k % 5) as f32),
        ("float64", _) => adopt(|k| (k % 5) as f64),
        _ => return None,
    };
    if !track {
        // An expected value only: forget its address so its own drop is not counted.
        for slot in &TRACKED {
            let _ = slot.compare_exchange(t.data_ptr() as usize, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    Some(t.transpose(0, 1).unwrap())
}

fn bytes_of(t: &Tensor) -> Vec<u8> {
    let d = t.contiguous().unwrap();
    unsafe { std::slice::from_raw_parts(d.data_ptr() as *const u8, d.nbytes()) }.to_vec()
}

/// A new tensor of dtype `name` handed over as DLPack (the caller owns it), or null for an unknown name.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn twrs_make(name: *const c_char) -> *mut DLManagedTensorVersioned {
    let name = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    match pattern(name, true) {
        Some(t) => t.into_dlpack(),
        None => std::ptr::null_mut(),
    }
}

/// Address of the last made tensor's Vec buffer.
#[no_mangle]
pub extern "C" fn twrs_last_data() -> usize {
    LAST_DATA.load(Ordering::SeqCst)
}

/// Takes ownership of `managed` and checks it holds the pattern of `name` (dtype, shape, values); returns its data
/// address (0 on mismatch, with the reason on stderr).
///
/// # Safety
/// `name` is a NUL-terminated string; `managed` a DLPack struct whose ownership the caller gives up.
#[no_mangle]
pub unsafe extern "C" fn twrs_check(name: *const c_char, managed: *mut DLManagedTensorVersioned) -> usize {
    let name = unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("");
    let t = match unsafe { Tensor::from_dlpack(managed) } {
        Ok(t) => t,
        Err(e) => {
            eprintln!("twrs_check({name}): {e}");
            return 0;
        }
    };
    let want = pattern(name, false).expect("a known dtype");
    if t.dtype() != want.dtype() || t.shape() != want.shape() || bytes_of(&t) != bytes_of(&want) {
        eprintln!("twrs_check({name}): got {t:?}, want {want:?}");
        return 0;
    }
    t.data_ptr() as usize
}

/// Tracked Vec buffers freed so far.
#[no_mangle]
pub extern "C" fn twrs_frees() -> usize {
    FREES.load(Ordering::SeqCst)
}
