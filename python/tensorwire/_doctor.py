"""`tensorwire doctor`: what this machine supports, and why not where it doesn't.

Reads versions from package metadata (it imports none of PyTorch, JAX, PyArrow or CuPy; NumPy is imported, because
`import tensorwire` imports it), and the kernel's settings from /proc and /sys. Every check reports a value or the
reason it has none — in JSON, a section's value is null and its "why" maps the check to the reason — and none
raises: a missing file, unexpected content or a failing call becomes the reason.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
from typing import Any, Callable, Optional, Tuple

_DEPENDENCIES = ("numpy", "ml_dtypes", "torch", "torchvision", "jax", "jaxlib", "pyarrow", "cupy-cuda13x",
                 "cupy-cuda12x", "nanobind")

# (value, None), or (None, the reason there is no value): what each check below returns.
Check = Tuple[Any, Optional[str]]


def _version_of(dist: str) -> str | None:
    """The installed version, None when not installed, or "unknown: <why>" when the metadata cannot be read."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001 - a broken install is reported, not raised
        return f"unknown: {type(e).__name__}: {e}"


def _read(path: str) -> str:
    """The stripped text of a /proc or /sys file; raises OSError."""
    with open(path) as f:
        return f.read().strip()


def _file(path: str, parse: Callable[[str], Any] = str, expected: str = "") -> Check:
    """A /proc or /sys setting parsed by `parse`, or the reason there is none (missing, unreadable, unexpected)."""
    try:
        text = _read(path)
    except OSError as e:
        return None, f"not available: {path}: {e.strerror or e}"
    except Exception as e:  # noqa: BLE001
        return None, f"not available: {path}: {type(e).__name__}: {e}"
    try:
        return parse(text), None
    except ValueError:
        return None, f"not available: {path} holds {text[:60]!r}, not {expected}"


def _section(**checks: Check) -> dict[str, Any]:
    """{name: value, ..., "why": {name: reason}} — "why" names every check whose value is None."""
    out: dict[str, Any] = {name: value for name, (value, _) in checks.items()}
    out["why"] = {name: why for name, (value, why) in checks.items() if value is None}
    return out


def _nofile() -> Check:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError) as e:
        return None, f"not available: getrlimit(RLIMIT_NOFILE) failed: {e}"

    def shown(n: int) -> int | str:
        return "unlimited" if n == resource.RLIM_INFINITY else n

    return {"soft": shown(soft), "hard": shown(hard)}, None


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


def _meminfo() -> Callable[[str], Check]:
    """A lookup of /proc/meminfo fields in bytes, each (value, None) or (None, why)."""
    text, why = _file("/proc/meminfo")
    fields: dict[str, int] = {}
    for line in (text or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)

    def field(key: str) -> Check:
        if key in fields:
            return fields[key], None
        return None, why or f"not available: /proc/meminfo has no {key} line"

    return field


def _ucx() -> dict[str, Any]:
    # The UCX listen= and connect= use: the one this tensorwire loads (TW_UCX_LIBRARY, else the libucx wheel where
    # installed, else libucp.so.0 from the library path), and whether a crafted packet can abort it.
    from . import _tensorwire as ext

    info = ext._ucx_info()
    present = info["version"] is not None
    why: dict[str, str] = {}
    if not present:  # version and library null, each with the reason
        why = {"version": info["why"] or "no UCX library could be loaded"}
        if info["library"] is None:
            why["library"] = why["version"]
    elif info["why"]:  # loaded, yet unusable (its context cannot be made): listen= and connect= say this
        why["usable"] = info["why"]
    d: dict[str, Any] = {"present": present, "version": info["version"], "library": info["library"],
                         "usable": present and not info["why"], "why": why}
    if info["version"]:
        major, minor = (int(x) for x in info["version"].split(".")[:2])
        if (major, minor) < (1, 18):
            d["warning"] = ("this UCX aborts the process on crafted bytes sent to a listening port (its TCP code's "
                            "assertions): pip install libucx-cu13 (README, 'Security')")
    return d


def _cuda() -> dict[str, Any]:
    """The CUDA section: tensorwire.cuda's own answers (status() names the reason when it is unusable)."""
    from . import _tensorwire as ext

    try:
        available, status = bool(ext._cuda_is_available()), ext._cuda_status()
        kernels = bool(ext._cuda_kernels_built())  # (what the build compiled: known without a GPU)
    except Exception as e:  # noqa: BLE001
        available, status, kernels = False, f"unknown: tensorwire.cuda failed: {type(e).__name__}: {e}", False
    # (the rule of every section: a check's value, or null and its reason under "why")
    out = _section(driver=(status if available else None, status),
                   devices=(ext._cuda_device_count() if available else None, f"CUDA is unavailable: {status}"))
    return {"available": available, "kernels_built": kernels, **out}


def _shm() -> dict[str, Any]:
    try:
        shm = os.statvfs("/dev/shm")
        return {"size_bytes": shm.f_blocks * shm.f_frsize, "free_bytes": shm.f_bavail * shm.f_frsize}
    except OSError as e:
        return {"why": f"/dev/shm: {e.strerror} (tensorwire uses memfd, not /dev/shm; torch's DataLoader does)"}


def _guarded(what: str, f: Callable[[], dict[str, Any]], failed: dict[str, Any]) -> dict[str, Any]:
    """f(), or `failed` with the reason f raised: one failing probe must not end the report."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001
        return {**failed, "why": f"{what} failed: {type(e).__name__}: {e}"}


def _guarded_section(what: str, f: Callable[[], dict[str, Any]], failed: dict[str, Any]) -> dict[str, Any]:
    """_guarded for a section whose "why" maps checks to reasons: a failed probe is the reason of each."""
    try:
        return f()
    except Exception as e:  # noqa: BLE001
        return {**failed, "why": {k: f"{what} failed: {type(e).__name__}: {e}" for k, v in failed.items() if v is None}}


def collect() -> dict[str, Any]:
    """Everything `tensorwire doctor` reports, as a JSON-ready dict."""
    import tensorwire as tw

    meminfo = _meminfo()
    cpus = os.cpu_count()
    return {
        "tensorwire": {"version": tw.__version__, "dlpack": "%d.%d" % tw.DLPACK_VERSION,
                       "location": os.path.dirname(os.path.abspath(tw.__file__))},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": _section(system=(platform.platform(), None), machine=(platform.machine(), None),
                             cpus=(cpus, None if cpus else "os.cpu_count() cannot tell")),
        "dependencies": _section(**{name: (_version_of(name), "not installed") for name in _DEPENDENCIES}),
        "cuda": _cuda(),
        "memfd": _guarded("memfd_create", _memfd, {"ok": False}),
        "limits": _section(**{
            "RLIMIT_NOFILE": _nofile(),
            "vm.max_map_count": _file("/proc/sys/vm/max_map_count", int, "an integer"),
            "vm.overcommit_memory": _file("/proc/sys/vm/overcommit_memory"),
            "cgroup memory.max": _file("/sys/fs/cgroup/memory.max"),
            "MemAvailable_bytes": meminfo("MemAvailable"),
        }),
        "shared_memory": {"/dev/shm": _shm()},
        "huge_pages": _section(
            transparent=_file("/sys/kernel/mm/transparent_hugepage/enabled"),
            shmem_transparent=_file("/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
            HugePages_Total=meminfo("HugePages_Total"),
            HugePages_Free=meminfo("HugePages_Free"),
            Hugepagesize_bytes=meminfo("Hugepagesize"),
        ),
        "ucx": _guarded_section("probing UCX", _ucx, {"present": False, "usable": False, "version": None,
                                                      "library": None}),
    }


def _human(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _shown(section: dict[str, Any], key: str, fmt: Callable[[Any], str] = str) -> str:
    """A check's value as text, or the reason it has none."""
    v = section.get(key)
    if v is None:
        return section.get("why", {}).get(key, "unknown")
    return fmt(v)


def render(d: dict[str, Any]) -> str:
    t = d["tensorwire"]
    p = d["platform"]
    cpus = f"{p['cpus']} CPUs" if p["cpus"] else f"CPU count unknown: {p['why'].get('cpus')}"
    lines = [f"tensorwire {t['version']} (DLPack {t['dlpack']}) at {t['location']}",
             f"Python {d['python']['version']} on {p['system']} ({cpus})", "",
             "dependencies:"]
    for k, v in d["dependencies"].items():
        if k != "why":
            lines.append(f"  {k:14s} {v or d['dependencies']['why'].get(k, 'not installed')}")
    c = d["cuda"]
    kernels = "built in" if c["kernels_built"] else "not built (the build had no nvcc)"
    lines += ["", f"CUDA:            {'available' if c['available'] else 'unavailable'} — {c['driver'] or c['why']['driver']}; strided "
                  f"copy kernels {kernels}"]
    m = d["memfd"]
    lines.append("memfd + seals:   " + (f"yes (F_SEAL_FUTURE_WRITE: {'yes' if m.get('future_write_seal') else 'no'})"
                                       if m["ok"] else f"no — {m['why']}"))
    lim = d["limits"]
    nofile = lim["RLIMIT_NOFILE"]
    if nofile is None:
        nofile_line = lim["why"]["RLIMIT_NOFILE"]
    else:
        low = isinstance(nofile["soft"], int) and nofile["soft"] < 4096
        nofile_line = (f"soft {nofile['soft']}, hard {nofile['hard']}"
                       + ("  (low: a subscriber holds one fd per pool segment; raise with ulimit -n)" if low else ""))
    lines += [
        f"RLIMIT_NOFILE:   {nofile_line}",
        f"vm.max_map_count: {_shown(lim, 'vm.max_map_count')}",
        f"overcommit:      vm.overcommit_memory={_shown(lim, 'vm.overcommit_memory')}; "
        f"cgroup memory.max={_shown(lim, 'cgroup memory.max')}; available {_shown(lim, 'MemAvailable_bytes', _human)}",
    ]
    shm = d["shared_memory"]["/dev/shm"]
    lines.append("/dev/shm:        " + (f"{_human(shm['size_bytes'])} ({_human(shm['free_bytes'])} free)"
                                         if "size_bytes" in shm else shm["why"]))
    hp = d["huge_pages"]
    keys = ("HugePages_Free", "HugePages_Total", "Hugepagesize_bytes")
    missing = [hp["why"][k] for k in keys if k in hp["why"]]
    reserved = (missing[0] if missing else
                f"{hp['HugePages_Free']}/{hp['HugePages_Total']} free of size {_human(hp['Hugepagesize_bytes'])}")
    lines.append(f"huge pages:      THP {_shown(hp, 'transparent')}; shmem THP {_shown(hp, 'shmem_transparent')}; "
                 f"reserved {reserved}")
    u = d["ucx"]
    lines.append("UCX:             " + (f"{u['version']} ({u['library']})" if u["present"] else "not usable")
                 + (f" — {u['why'].get('version') or u['why'].get('usable')}"
                    if u["why"].get("version") or u["why"].get("usable") else "")
                 + (f"; {u['warning']}" if u.get("warning") else ""))
    return "\n".join(lines)


def main(as_json: bool = False) -> int:
    d = collect()
    print(json.dumps(d, indent=1) if as_json else render(d))
    return 0
