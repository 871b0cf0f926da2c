"""The tensorwire command line.

modes:
  demo      each tensor-crossing hazard tensorwire removes, and whether it came out right
  bench     inter-process transfer benchmark against multiprocessing, torch.multiprocessing and shared_memory
            (quick by default; `tensorwire bench --full` measures every size; `tensorwire bench --net`: across
            two network namespaces over UCX against ucx_perftest, torch.distributed and pickle — root only;
            `tensorwire bench --device cuda`: device copies and CUDA tensors between processes against PyTorch)
  doctor    what this machine supports, and why not (`--json` for a machine-readable report)
  version   versions (also `tensorwire --version`)
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorwire", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version_line())
    for flag, what in (("--cmake-dir", "tensorwireConfig.cmake"), ("--include-dir", "the C and C++ headers"),
                       ("--pkgconfig-dir", "tensorwire.pc and tensorwire_c.pc")):
        parser.add_argument(flag, action="store_true", help=f"print the directory of {what} and exit")
    # (the modes are described once, in the description above; each mode's --help has its own)
    sub = parser.add_subparsers(dest="command", metavar="{demo,bench,doctor,version}")
    d = sub.add_parser("demo", description="Each tensor-crossing hazard tensorwire removes, performed on real "
                       "libraries and checked element by element against the source: a table of whether each came "
                       "out right.")
    d.add_argument("--size", type=_positive_int, default=100_000_000,
                   help="elements in the large-buffer adoption row (default 100000000)")
    b = sub.add_parser("bench", description="Benchmarks: `tensorwire bench --help`.")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    doc = sub.add_parser("doctor", description="What this machine supports, and why not.")
    doc.add_argument("--json", action="store_true", help="print the report as JSON")
    sub.add_parser("version", description="Print tensorwire's version and the DLPack version it speaks.")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # argparse.REMAINDER refuses a leading --option: the benchmark parses its own
        try:
            from ._bench_ipc import main as bench_main
        except ImportError as e:
            print(f"tensorwire bench is unavailable: {e}", file=sys.stderr)
            return 2
        return bench_main(argv[1:])
    args = parser.parse_args(argv)
    for flag in ("cmake_dir", "include_dir", "pkgconfig_dir"):
        if getattr(args, flag):
            import tensorwire

            try:
                print(getattr(tensorwire, flag)())
            except FileNotFoundError as e:
                print(f"tensorwire: {e}", file=sys.stderr)
                return 1
            return 0
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("tensorwire: choose a mode (demo, bench, doctor, version) or --help", file=sys.stderr)
        return 2
    if args.command == "demo":
        from ._demo import main as demo_main

        return demo_main(size=args.size)
    if args.command == "doctor":
        from ._doctor import main as doctor_main

        return doctor_main(as_json=args.json)
    if args.command == "version":
        print(_version_line())
        return 0
    return 2


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: must be at least 1")
    return n


def _version_line() -> str:
    import tensorwire

    return f"tensorwire {tensorwire.__version__} (DLPack {tensorwire.DLPACK_VERSION[0]}.{tensorwire.DLPACK_VERSION[1]})"


if __name__ == "__main__":
    sys.exit(main())
