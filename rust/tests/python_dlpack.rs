//! Every dtype round-trips Rust -> Python (np.from_dlpack) -> Rust through DLPack in one process, zero-copy all the
//! way, and the adopted Vec is dropped exactly once when Python lets go last. The Rust side is the `dlpack_py`
//! example (a cdylib cargo builds with the tests), loaded by a real Python interpreter with ctypes.
mod common;

const SCRIPT: &str = r#"
import ctypes, gc, sys
import numpy as np, ml_dtypes, tensorwire as tw
lib = ctypes.CDLL(sys.argv[1])
lib.twrs_make.restype = ctypes.c_void_p
lib.twrs_make.argtypes = [ctypes.c_char_p]
lib.twrs_last_data.restype = ctypes.c_size_t
lib.twrs_check.restype = ctypes.c_size_t
lib.twrs_check.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
lib.twrs_frees.restype = ctypes.c_size_t
api = ctypes.pythonapi
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

k = np.arange(12).reshape(3, 4).T
for i, name in enumerate(sys.argv[2].split(",")):
    ptr = lib.twrs_make(name.encode())
    assert ptr, name
    data = lib.twrs_last_data()
    t = tw.from_dlpack(api.PyCapsule_New(ptr, b"dltensor_versioned", None))
    assert str(t.dtype) == name and t.shape == (4, 3) and t.strides == (1, 4), (name, t.dtype, t.shape, t.strides)
    a = np.asarray(t) if name == "bfloat16" else np.from_dlpack(t)      # NumPy views Rust's Vec
    assert a.ctypes.data == data, (name, "not zero-copy into NumPy")
    want = (k % 2 == 1) if name == "bool" else (k % 5).astype(getattr(ml_dtypes, name, None) or np.dtype(name))
    assert np.array_equal(a.astype(np.float64), want.astype(np.float64)), (name, a)
    del t
    gc.collect()
    # ... and back to Rust, through NumPy's own DLPack export (tensorwire's for bfloat16, which NumPy cannot export).
    cap = (tw.asarray(a) if name == "bfloat16" else a).__dlpack__(max_version=(1, 0))
    p = api.PyCapsule_GetPointer(cap, b"dltensor_versioned")
    api.PyCapsule_SetName(cap, b"used_dltensor_versioned")
    assert lib.twrs_check(name.encode(), p) == data, (name, "not the same memory back in Rust")
    del cap
    gc.collect()
    assert lib.twrs_frees() == i, (name, "the Vec was dropped while NumPy still viewed it")
    del a
    gc.collect()
    assert lib.twrs_frees() == i + 1, (name, lib.twrs_frees(), "Python released last: the Vec must go now, once")
    print("ok", name, flush=True)
"#;

#[test]
fn every_dtype_round_trips_through_python() {
    let exe = std::env::current_exe().unwrap();
    let examples = exe.parent().unwrap().parent().unwrap().join("examples");
    let lib = examples.join("libdlpack_py.so");
    assert!(lib.exists(), "{} was not built (cargo test builds the examples)", lib.display());
    let names = "bool,int8,int16,int32,int64,uint8,uint16,uint32,uint64,float16,bfloat16,float32,float64";
    let out = common::python().args(["-c", SCRIPT, lib.to_str().unwrap(), names]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "Python failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let want: Vec<String> = names.split(',').map(|n| format!("ok {n}")).collect();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), want);
}
