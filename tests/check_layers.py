#!/usr/bin/env python3
"""Refuses #includes that cross tensorwire's layers the wrong way (../shared/DESIGN.md; CMakeLists.txt).

Every file under src/<layer>/ may include its own layer's headers and those of the layers below it; public headers
under include/tensorwire/ belong to the layer named in HEADER_LAYER and obey the same rule; the C header includes
no C++ header. Exit status 1 with one line per violation.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEPS = {
    "core": set(),
    "copy": {"core"},
    "interop": {"core", "copy"},
    "os": {"core"},
    "net": {"core", "copy", "os"},
    "ipc": {"core", "copy", "os", "net"},
    "cuda": {"core", "copy"},
    "capi": {"core", "copy", "interop", "os", "net", "ipc", "cuda", "umbrella"},
    "umbrella": {"core", "copy", "interop", "os", "net", "ipc", "cuda"},
}
HEADER_LAYER = {
    "buffer.hpp": "core", "device.hpp": "core", "device_runtime.hpp": "core", "dlpack.h": "core",
    "dlpack.hpp": "core", "dtype.hpp": "core", "error.hpp": "core", "layout.hpp": "core", "metadata.hpp": "core",
    "tensor.hpp": "core", "version.hpp": "core", "copy.hpp": "copy", "interop.hpp": "interop", "arrow.hpp": "interop",
    "ipc.hpp": "ipc", "net.hpp": "net", "cuda.hpp": "cuda", "tensorwire.h": "capi", "tensorwire.hpp": "umbrella",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of_include(path: str, here_layer: str):
    if path.startswith("tensorwire/"):
        return HEADER_LAYER.get(path[len("tensorwire/"):], "?")
    first = path.split("/")[0]
    if first in DEPS:  # a private header by layer: "os/os_internal.hpp"
        return first
    return here_layer  # a sibling header of the same folder


def main() -> int:
    bad = []
    files = [(p, p.parent.name) for p in (ROOT / "src").glob("*/*") if p.suffix in (".cpp", ".hpp", ".h")]
    files += [(p, HEADER_LAYER.get(p.name, "?")) for p in (ROOT / "include" / "tensorwire").iterdir()]
    for path, layer in files:
        if layer not in DEPS:
            bad.append(f"{path.relative_to(ROOT)}: belongs to no known layer (add it to tests/check_layers.py)")
            continue
        for inc in INCLUDE.findall(path.read_text()):
            to = layer_of_include(inc, layer)
            if to == "?":
                bad.append(f"{path.relative_to(ROOT)}: includes {inc}, which belongs to no known layer")
            elif to != layer and to not in DEPS[layer]:
                bad.append(f"{path.relative_to(ROOT)} ({layer}) includes {inc} ({to}): {layer} may use only "
                           f"{', '.join(sorted(DEPS[layer])) or 'nothing of ours'}")
            if path.suffix == ".h" and inc.endswith(".hpp"):
                bad.append(f"{path.relative_to(ROOT)}: a C header includes the C++ header {inc}")
    for line in bad:
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
