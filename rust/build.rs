// Finds libtensorwire_c.so (tensorwire's C ABI) and links it, with an rpath so tests and binaries run in place.
//
// Where it looks, in order:
//  1. $TENSORWIRE_DIR, when set: an install prefix (`cmake --install ... --prefix DIR`: DIR/lib, DIR/lib64, ...) or
//     a CMake build tree (the directory holding libtensorwire_c.so). Nothing else is tried when it is set.
//  2. The project's own build tree next to this crate (../build/release, what `make build` makes).
//  3. Every prefix in $CMAKE_PREFIX_PATH, then /usr/local and /usr (an installed CMake package).
use std::env;
use std::path::{Path, PathBuf};

const LIB: &str = "libtensorwire_c.so";

fn lib_dirs_of(prefix: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![prefix.to_path_buf()];
    for sub in ["lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"] {
        dirs.push(prefix.join(sub));
    }
    dirs
}

fn main() {
    println!("cargo:rerun-if-env-changed=TENSORWIRE_DIR");
    println!("cargo:rerun-if-env-changed=CMAKE_PREFIX_PATH");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));

    let (candidates, origin): (Vec<PathBuf>, &str) = match env::var_os("TENSORWIRE_DIR") {
        Some(dir) if !dir.is_empty() => (lib_dirs_of(Path::new(&dir)), "TENSORWIRE_DIR"),
        _ => {
            let mut c = lib_dirs_of(&manifest.join("..").join("build").join("release"));
            if let Some(paths) = env::var_os("CMAKE_PREFIX_PATH") {
                for p in env::split_paths(&paths) {
                    c.extend(lib_dirs_of(&p));
                }
            }
            c.extend(lib_dirs_of(Path::new("/usr/local")));
            c.extend(lib_dirs_of(Path::new("/usr")));
            (c, "the default search")
        }
    };

    let found = candidates.iter().find(|d| d.join(LIB).is_file());
    let Some(dir) = found else {
        let looked: Vec<String> = candidates.iter().map(|d| d.display().to_string()).collect();
        panic!(
            "\n\ntensorwire: {LIB} not found by {origin} (looked in: {}).\n\
             Build tensorwire first (`make build` in the project root makes build/release), or install it \
             (`cmake --install build/release --prefix /some/prefix`), then set TENSORWIRE_DIR to that build \
             directory or install prefix, e.g.\n    TENSORWIRE_DIR=/path/to/tensorwire/build/release cargo build\n\n",
            looked.join(", ")
        );
    };
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.clone());
    println!("cargo:rerun-if-changed={}", dir.join(LIB).display());
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=tensorwire_c");
    // Every binary of this package (tests, examples, doc tests) finds the library where it was linked from.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    // Dependent crates can read DEP_TENSORWIRE_C_LIB_DIR to set their own rpath.
    println!("cargo:lib_dir={}", dir.display());
}
