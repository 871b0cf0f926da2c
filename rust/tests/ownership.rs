//! Zero-copy adoption and drop-exactly-once, proven with a counting allocator: the Vec's buffer is freed once,
//! when its last owner (a view, a clone, a DLPack export, a thread) lets go — never before, never twice.
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use tensorwire::{Tensor, DType};

struct Counting;
static TRACKED: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);
static ALLOCATED_BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ptr as usize == TRACKED.load(Ordering::SeqCst) {
            FREES.fetch_add(1, Ordering::SeqCst);
        }
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// The tracked address is process-wide: tests that use it take turns (a failed test's poisoned lock does not fail
// the others).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn track<T>(v: &[T]) {
    FREES.store(0, Ordering::SeqCst);
    TRACKED.store(v.as_ptr() as usize, Ordering::SeqCst);
}

fn frees() -> usize {
    FREES.load(Ordering::SeqCst)
}

#[test]
fn from_vec_is_zero_copy_and_constant_space() {
    let _g = serial();
    let v: Vec<f64> = vec![6.0; 10_000_000];
    let ptr = v.as_ptr();
    track(&v);
    let before = ALLOCATED_BYTES.load(Ordering::SeqCst);
    let t = Tensor::from_vec(v, &[1_000, 10_000]).unwrap();
    let allocated = ALLOCATED_BYTES.load(Ordering::SeqCst) - before;
    assert_eq!(t.data_ptr(), ptr.cast(), "the tensor views the Vec's own buffer");
    assert!(allocated < 4096, "adoption allocated {allocated} bytes: it must not copy 80 MB");
    assert_eq!(t.shape(), &[1_000, 10_000]);
    assert_eq!(t.dtype(), DType::F64);
    assert!(t.is_exclusive());
    drop(t);
    assert_eq!(frees(), 1);
}

#[test]
fn views_keep_the_owner_alive_after_the_original_is_dropped() {
    let _g = serial();
    let v: Vec<i32> = (0..24).collect();
    track(&v);
    let t = Tensor::from_vec(v, &[4, 6]).unwrap();
    let col = t.transpose(0, 1).unwrap().slice(1, 0, 4, 2).unwrap();
    let clone = col.clone();
    drop(t);
    assert_eq!(frees(), 0, "views still hold the Vec");
    assert_eq!(col.to_vec::<i32>().unwrap(), vec![0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17]);
    drop(col);
    assert_eq!(frees(), 0);
    assert_eq!(clone.strides(), &[1, 12]);
    drop(clone);
    assert_eq!(frees(), 1);
}

#[test]
fn a_dlpack_export_owns_it_until_its_deleter_runs() {
    let _g = serial();
    let v: Vec<u16> = vec![7; 100];
    track(&v);
    let t = Tensor::from_vec(v, &[10, 10]).unwrap();
    let dl = t.into_dlpack();
    assert_eq!(frees(), 0);
    // A C consumer that never imports it just calls the deleter: the Vec goes then, once.
    unsafe { ((*dl).deleter.unwrap())(dl) };
    assert_eq!(frees(), 1);

    let v: Vec<u16> = vec![9; 100];
    let ptr = v.as_ptr();
    track(&v);
    let t = Tensor::from_vec(v, &[100]).unwrap();
    let dl = t.into_dlpack();
    assert_eq!(unsafe { (*dl).dl_tensor.data } as *const u16, ptr, "the export is the Vec's own buffer");
    let back = unsafe { Tensor::from_dlpack(dl) }.unwrap();
    assert_eq!(back.data_ptr(), ptr.cast(), "and so is the tensor imported back");
    assert_eq!(back.as_slice::<u16>().unwrap()[99], 9);
    assert!(!back.is_exclusive(), "memory from DLPack belongs to its producer");
    drop(back);
    assert_eq!(frees(), 1);
}

#[test]
fn the_last_owner_may_be_another_thread() {
    let _g = serial();
    let v: Vec<f32> = vec![1.5; 4096];
    track(&v);
    let t = Tensor::from_vec(v, &[64, 64]).unwrap();
    let views: Vec<Tensor> = (0..4).map(|i| t.select(0, i).unwrap()).collect();
    drop(t);
    let handles: Vec<_> = views
        .into_iter()
        .map(|view| std::thread::spawn(move || view.to_vec::<f32>().unwrap().iter().sum::<f32>()))
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), 96.0);
    }
    assert_eq!(frees(), 1);
}

#[test]
fn a_failed_adoption_drops_the_vec_once() {
    let _g = serial();
    let v: Vec<f32> = vec![0.0; 10];
    track(&v);
    let err = Tensor::from_vec(v, &[3, 4]).unwrap_err();
    assert_eq!(err.kind(), tensorwire::ErrorKind::InvalidArgument);
    assert!(err.message().contains("10 elements"), "{err}");
    assert_eq!(frees(), 1);
}

#[test]
fn an_adoption_the_c_abi_refuses_drops_the_vec_once() {
    // Rust's own checks pass (0 elements, shape of 65 zeros); the C ABI refuses rank 65 and runs the release.
    let _g = serial();
    let v: Vec<f32> = Vec::with_capacity(8);
    track(&v);
    let err = Tensor::from_vec(v, &[0; 65]).unwrap_err();
    assert_eq!(err.kind(), tensorwire::ErrorKind::InvalidArgument);
    assert!(err.message().contains("rank 65 exceeds the maximum of 64"), "{err}");
    assert_eq!(frees(), 1, "the C ABI's failure path released the Vec exactly once");
}
