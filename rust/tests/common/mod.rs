//! Shared by the tests that run Python next to Rust: which interpreter, and where the tensorwire package is.
#![allow(dead_code)]
use std::path::PathBuf;
use std::process::Command;

/// `$TENSORWIRE_PYTHON`, else the project's virtualenv, else `python3`; with `$TENSORWIRE_PYTHONPATH` (default: the
/// project's build tree, ../build/release/pkg) on PYTHONPATH. Panics, naming what to set, when that Python cannot
/// import tensorwire and NumPy: these tests never pass by not running.
pub fn python() -> Command {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let exe = std::env::var_os("TENSORWIRE_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        let venv = root.join(".venv/bin/python");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        }
    });
    let pkg = std::env::var_os("TENSORWIRE_PYTHONPATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("build/release/pkg"));
    let mut probe = Command::new(&exe);
    probe.env("PYTHONPATH", &pkg).args(["-c", "import tensorwire, numpy"]);
    let ok = probe.status().map(|s| s.success()).unwrap_or(false);
    assert!(
        ok,
        "{} cannot import tensorwire and numpy with PYTHONPATH={}: build the Python module (`make build`) or set \
         TENSORWIRE_PYTHON / TENSORWIRE_PYTHONPATH",
        exe.display(),
        pkg.display()
    );
    let mut c = Command::new(exe);
    c.env("PYTHONPATH", pkg);
    c
}

/// A topic name unique to this process and purpose.
pub fn topic(what: &str) -> String {
    format!("rs_{what}_{}", std::process::id())
}
