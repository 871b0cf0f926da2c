"""`tensorwire doctor`: what this machine supports, and why not where it doesn't.

Reads versions from package metadata (it imports none of NumPy, PyTorch, JAX or PyArrow), and the kernel's
settings from /proc and /sys. Every check reports a value or the reason it has none; none raises.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import subprocess
import sys
from typing import Any

_DEPENDENCIES = ("numpy", "ml_dtypes", "torch", "torchvision", "jax", "jaxlib", "pyarrow", "cupy-cuda13x",
                 "cupy-cuda12x", "nanobind")


def _version_of(dist: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _memfd() -> dict[str, Any]:
    if not hasattr(os, "memfd_create"):
        return {"ok": False, "why": "os.memfd_create is not available on this platform"}
    import fcntl

    try:
        fd = os.memfd_create("tensorwire-doctor", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as e:
        return {"ok": False, "why": f"memfd_create failed: {e.strerror}"}
    try:
        os.ftruncate(fd, 4096)
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
        future_write = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x10)
        fd2 = os.memfd_create("tensorwire-doctor-fw", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            fcntl.fcntl(fd2, fcntl.F_ADD_SEALS, future_write)
            fw = True
        except OSError:
            fw = False
        finally:
            os.close(fd2)
        return {"ok": True, "seals": True, "future_write_seal": fw}
    except OSError as e:
        return {"ok": False, "why": f"sealing a memfd failed: {e.strerror}"}
    finally:
        os.close(fd)


def _meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    text = _read("/proc/meminfo") or ""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def _ucx() -> dict[str, Any]:
    info = shutil.which("ucx_info")
    if info is None:
        import ctypes.util

        lib = ctypes.util.find_library("ucp")
        return {"present": lib is not None, "library": lib,
                "why": None if lib else "no ucx_info and no libucp (Debian: apt-get install libucx-dev)"}
    try:
        out = subprocess.run([info, "-v"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"present": True, "why": f"ucx_info -v failed: {e}"}
    first = next((line.strip("# ").strip() for line in out.splitlines() if "Version" in line), out.strip()[:80])
    return {"present": True, "version": first}


def collect() -> dict[str, Any]:
    """Everything `tensorwire doctor` reports, as a JSON-ready dict."""
    import tensorwire as tw
    from . import _tensorwire as ext

    meminfo = _meminfo()
    try:
        shm = os.statvfs("/dev/shm")
        shm_info: dict[str, Any] = {"size_bytes": shm.f_blocks * shm.f_frsize, "free_bytes": shm.f_bavail * shm.f_frsize}
    except OSError as e:
        shm_info = {"why": f"/dev/shm: {e.strerror} (tensorwire uses memfd, not /dev/shm; torch's DataLoader does)"}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    driver = ext.cuda_driver_status()
    cgroup_mem = _read("/sys/fs/cgroup/memory.max")
    return {
        "tensorwire": {"version": tw.__version__, "dlpack": "%d.%d" % tw.DLPACK_VERSION,
                       "location": os.path.dirname(os.path.abspath(tw.__file__))},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": {"system": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "dependencies": {name: _version_of(name) for name in _DEPENDENCIES},
        "cuda": {
            "driver": driver,
            "available": driver == "ok",
            "devices": None if driver != "ok" else "listed by tensorwire.cuda once the CUDA layer lands",
        },
        "memfd": _memfd(),
        "limits": {
            "RLIMIT_NOFILE": {"soft": soft, "hard": hard},
            "vm.max_map_count": int(_read("/proc/sys/vm/max_map_count") or 0) or None,
            "vm.overcommit_memory": _read("/proc/sys/vm/overcommit_memory"),
            "cgroup memory.max": cgroup_mem,
            "MemAvailable_bytes": meminfo.get("MemAvailable"),
        },
        "shared_memory": {"/dev/shm": shm_info},
        "huge_pages": {
            "transparent": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
            "shmem_transparent": _read("/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
            "HugePages_Total": meminfo.get("HugePages_Total"),
            "HugePages_Free": meminfo.get("HugePages_Free"),
            "Hugepagesize_bytes": meminfo.get("Hugepagesize"),
        },
        "ucx": _ucx(),
    }


def _human(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def render(d: dict[str, Any]) -> str:
    t = d["tensorwire"]
    lines = [f"tensorwire {t['version']} (DLPack {t['dlpack']}) at {t['location']}",
             f"Python {d['python']['version']} on {d['platform']['system']} ({d['platform']['cpus']} CPUs)", "",
             "dependencies:"]
    for k, v in d["dependencies"].items():
        lines.append(f"  {k:14s} {v or 'not installed'}")
    c = d["cuda"]
    lines += ["", f"CUDA:            {'available' if c['available'] else 'unavailable'} — driver: {c['driver']}"]
    m = d["memfd"]
    lines.append("memfd + seals:   " + (f"yes (F_SEAL_FUTURE_WRITE: {'yes' if m.get('future_write_seal') else 'no'})"
                                       if m["ok"] else f"no — {m['why']}"))
    lim = d["limits"]
    nofile = lim["RLIMIT_NOFILE"]
    lines += [
        f"RLIMIT_NOFILE:   soft {nofile['soft']}, hard {nofile['hard']}"
        + ("  (low: a subscriber holds one fd per pool segment; raise with ulimit -n)" if nofile["soft"] < 4096 else ""),
        f"vm.max_map_count: {lim['vm.max_map_count']}",
        f"overcommit:      vm.overcommit_memory={lim['vm.overcommit_memory']}; cgroup memory.max={lim['cgroup memory.max']}; "
        f"available {_human(lim['MemAvailable_bytes'])}",
    ]
    shm = d["shared_memory"]["/dev/shm"]
    lines.append("/dev/shm:        " + (f"{_human(shm['size_bytes'])} ({_human(shm['free_bytes'])} free)"
                                         if "size_bytes" in shm else shm["why"]))
    hp = d["huge_pages"]
    lines.append(f"huge pages:      THP {hp['transparent']}; shmem THP {hp['shmem_transparent']}; "
                 f"{hp['HugePages_Free']}/{hp['HugePages_Total']} free of size {_human(hp['Hugepagesize_bytes'])}")
    u = d["ucx"]
    lines.append("UCX:             " + (u.get("version") or u.get("library") or "present" if u["present"]
                                         else f"not found — {u['why']}"))
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    d = collect()
    print(json.dumps(d, indent=1) if as_json else render(d))
    return 0
