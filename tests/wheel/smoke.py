"""Smoke test of an installed tensorwire wheel, run by `make test-wheel` inside a fresh virtualenv that has nothing
but the wheel and its dependencies: the package imports from site-packages (not the source tree), works across two
processes, and ships what C and C++ users need inside its own directory (CMake package, pkg-config files, headers,
static and shared libraries), which this script builds real programs against."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

import tensorwire as tw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
site = sysconfig.get_paths()["platlib"]


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"wheel smoke test: FAILED: {what}")
    print(f"ok  {what}")


pkg = os.path.dirname(tw.__file__)
check(pkg == os.path.join(site, "tensorwire"), f"tensorwire imports from the virtualenv's site-packages ({pkg})")
check(not os.path.exists(os.path.join(site, "include")) and not os.path.exists(os.path.join(site, "lib")),
      "nothing installed at the root of site-packages (no include/ or lib/ there)")

# Python: zero-copy import, strided view, a copy, DLPack out
a = np.arange(12.0).reshape(3, 4)
t = tw.asarray(a.T)
check(t.data_ptr == a.ctypes.data and t.strides == (1, 4), "tw.asarray is zero-copy and keeps strides")
check(np.array_equal(np.from_dlpack(t.contiguous()), a.T), "contiguous() + DLPack export round-trip the values")

# Between two processes
name = f"wheel-smoke-{os.getpid()}"
sub_code = (
    "import sys, numpy as np, tensorwire as tw\n"
    f"s = tw.Subscriber({name!r}); print('ready', flush=True)\n"
    "t = s.recv(timeout=10.0)\n"
    "assert np.array_equal(np.asarray(t), np.arange(12.0).reshape(3, 4)[:, ::2]), np.asarray(t)\n"
    "assert t.metadata['step'] == 7 and t.readonly, (dict(t.metadata), t.readonly)\n"
    "print('received', t.shape, dict(t.metadata), flush=True)\n"
)
pub = tw.Publisher(name)
proc = subprocess.Popen([sys.executable, "-c", sub_code], stdout=subprocess.PIPE, text=True)
assert proc.stdout is not None
check(proc.stdout.readline().strip() == "ready", "subscriber process started")
deadline = time.monotonic() + 10
while pub.subscribers < 1 and time.monotonic() < deadline:
    time.sleep(0.01)
check(pub.subscribers == 1, "the subscriber connected")
pub.send(a[:, ::2], metadata={"step": 7})
out, _ = proc.communicate(timeout=30)
check(proc.returncode == 0 and "received (3, 2) {'step': 7}" in out, f"a strided view crossed processes ({out.strip()})")
pub.close()

# The command line entry point
ver = subprocess.run([os.path.join(os.path.dirname(sys.executable), "tensorwire"), "--version"],
                     capture_output=True, text=True, check=True).stdout
check(ver.startswith(f"tensorwire {tw.__version__}"), f"`tensorwire --version`: {ver.strip()}")

# C and C++ users: everything inside the package directory
cmake_dir, include_dir, lib_dir, pc_dir = tw.cmake_dir(), tw.include_dir(), tw.lib_dir(), tw.pkgconfig_dir()
for d in (cmake_dir, include_dir, lib_dir, pc_dir):
    check(d.startswith(pkg + os.sep), f"{d} lies inside the package directory")
check(os.path.isfile(os.path.join(cmake_dir, "tensorwireConfig.cmake")), "tensorwire.cmake_dir() has tensorwireConfig.cmake")
check(os.path.isfile(os.path.join(include_dir, "tensorwire", "tensorwire.hpp")), "headers under tensorwire.include_dir()")
libs = set(os.listdir(lib_dir))
check({"libtensorwire.a", "libtensorwire.so", "libtensorwire_c.so"} <= libs, f"static and shared libraries ({sorted(libs)})")
for flag, want in (("--cmake-dir", cmake_dir), ("--include-dir", include_dir), ("--pkgconfig-dir", pc_dir)):
    cli = subprocess.run([os.path.join(os.path.dirname(sys.executable), "tensorwire"), flag],
                         capture_output=True, text=True, check=True).stdout.strip()
    check(cli == want, f"`tensorwire {flag}` agrees with the Python function ({cli})")

with tempfile.TemporaryDirectory() as tmp:
    build = os.path.join(tmp, "consumer")
    subprocess.run(["cmake", "-S", os.path.join(ROOT, "examples", "consumer"), "-B", build, "-G", "Ninja",
                    f"-Dtensorwire_DIR={cmake_dir}"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build], check=True, stdout=subprocess.DEVNULL)
    for exe in ("consumer", "consumer_c", "consumer_shared", "consumer_c_abi"):
        r = subprocess.run([os.path.join(build, exe)], capture_output=True, text=True)
        check(r.returncode == 0, f"examples/consumer's {exe} built with find_package(tensorwire) against the wheel ran: "
              f"{(r.stdout + r.stderr).strip()}")
    check(shutil.which("pkg-config") is not None, "pkg-config is installed (make's apt step installs pkgconf)")
    env = dict(os.environ, PKG_CONFIG_PATH=pc_dir)
    for pc, compiler, src in (("tensorwire", ["g++", "-std=c++20"], "main.cpp"), ("tensorwire_c", ["gcc", "-std=c11"], "capi.c")):
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", pc], env=env, capture_output=True,
                               text=True, check=True).stdout.split()
        exe = os.path.join(tmp, f"pc_{pc}")
        subprocess.run([*compiler, "-o", exe, os.path.join(ROOT, "examples", "consumer", src), *flags], check=True)
        r = subprocess.run([exe], capture_output=True, text=True)
        check(r.returncode == 0, f"a program built with `pkg-config --cflags --libs {pc}` ran: {r.stdout.strip()}")

print("wheel smoke test: all passed")
