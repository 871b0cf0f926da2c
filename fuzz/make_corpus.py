#!/usr/bin/env python3
"""Writes the seed corpora in fuzz/corpus/<target>/ (small hand-made inputs, valid and invalid).

The byte layouts mirror the comments at the top of each fuzz_*.cpp. Re-running rewrites the same files, so the
committed corpus only changes when this script does. Usage: python3 fuzz/make_corpus.py [corpus dir]
"""
import pathlib
import struct
import sys

from corpus_util import clear_hand_made  # (fuzz/: the script's own folder is on sys.path)

HERE = pathlib.Path(__file__).resolve().parent


# ---- fuzz_dlpack ------------------------------------------------------------------------------------------------
KIND_TENSOR, KIND_VERSIONED, KIND_LEGACY = 0, 1, 2
STRIDES_NULL, DATA_NULL, SHAPE_NULL, DELETER_NULL, PADDED, WIDE = 4, 8, 16, 32, 64, 128
CPU, CUDA, CUDA_HOST = 1, 2, 3
F_READ_ONLY, F_IS_COPIED, F_PADDED = 1, 2, 4


def dlpack(kind, shape, strides=None, code=2, bits=32, lanes=1, device=CPU, device_id=0, byte_offset=0, flags=0,
           version=(1, 3), bufsize=256, pos=0, fake_addr=0, mode=0, wide=False, content=b""):
    mode |= kind
    if strides is None:
        mode |= STRIDES_NULL
    if wide:
        mode |= WIDE
    out = struct.pack("<BbBBHii", mode, len(shape), code, bits, lanes, device, device_id)
    if wide:
        out += struct.pack("<QQII", byte_offset, flags, *version)
    else:
        out += struct.pack("<BBBB", byte_offset, flags, *version)
    out += struct.pack("<HH", bufsize, pos)
    if wide:
        out += struct.pack("<Q", fake_addr)
    fmt = "<q" if wide else "<b"
    for v in list(shape) + list(strides or []):
        out += struct.pack(fmt, v)
    return out + content


def dlpack_seeds():
    v, legacy, dl = KIND_VERSIONED, KIND_LEGACY, KIND_TENSOR
    return {
        # valid imports over the harness buffer
        "f32_2x3_c": dlpack(v, [2, 3], [3, 1], content=bytes(range(24))),
        "f32_2x3_null_strides": dlpack(v, [2, 3], None, bufsize=24),
        "f32_3x4_transposed": dlpack(v, [4, 3], [1, 4], bufsize=48),
        "f32_stride2": dlpack(v, [8], [2], bufsize=60),
        "f64_stride2_legacy": dlpack(legacy, [4], [2], bits=64, bufsize=56),
        "i8_negative_stride": dlpack(v, [5], [-1], code=0, bits=8, bufsize=16, pos=8),
        "u16_offset": dlpack(v, [3, 2], [2, 1], code=1, bits=16, byte_offset=10, bufsize=22),
        "broadcast_row": dlpack(v, [4, 3], [0, 1], bufsize=12),
        "scalar_ndim0": dlpack(v, [], [], code=2, bits=64, bufsize=8),
        "zero_size": dlpack(v, [0, 5], [5, 1], bufsize=0, mode=DATA_NULL),
        "readonly_flag": dlpack(v, [6], [1], code=6, bits=8, flags=F_READ_ONLY | F_IS_COPIED, bufsize=6),
        "int4_packed": dlpack(v, [2, 4], [4, 1], code=0, bits=4, bufsize=4),
        "int4_packed_negative": dlpack(v, [3], [-1], code=1, bits=4, bufsize=2, pos=1),
        "int4_padded": dlpack(v, [4], [1], code=0, bits=4, flags=F_PADDED, bufsize=4),
        "float6_packed_odd": dlpack(v, [5], [1], code=15, bits=6, bufsize=4),
        "bf16_on_cuda": dlpack(v, [16, 16], [16, 1], code=4, bits=16, device=CUDA, bufsize=8),
        "complex128_legacy": dlpack(legacy, [2, 2], [1, 2], code=5, bits=128, bufsize=64),
        "f32x4_lanes": dlpack(v, [3], [1], lanes=4, bufsize=48),
        "cuda_host_device": dlpack(v, [4], [1], device=CUDA_HOST, bufsize=16),
        "deleter_null": dlpack(v, [2], [1], mode=DELETER_NULL, bufsize=8),
        "validate_only": dlpack(dl, [2, 2], [2, 1], bufsize=16),
        "validate_only_padded": dlpack(dl, [3], [1], code=1, bits=2, mode=PADDED, bufsize=3),
        "wide_huge_offset": dlpack(v, [2], [1], byte_offset=(1 << 63) + 5, wide=True, bufsize=8),
        "wide_fake_addr": dlpack(v, [4], [-1], device=CUDA, fake_addr=8, wide=True, bufsize=0),
        "wide_big_shape": dlpack(v, [1 << 40, 1 << 30], [0, 0], code=0, bits=8, wide=True, bufsize=1),
        # regressions: each of these once crashed (see the commit that added it)
        "f32_stride2_exact_block": dlpack(v, [16], [2], bufsize=124),
        "f64_stride2_exact_block": dlpack(v, [8], [2], bits=64, bufsize=120),
        "broadcast_nbytes_overflow": dlpack(v, [1 << 30, 1 << 30], [0, 0], wide=True, bufsize=4),
        "fake_addr_wraps_past_top": dlpack(v, [3], [-1], device=CUDA, byte_offset=8, fake_addr=(1 << 64) - 4,
                                           wide=True, bufsize=0),
        # invalid: each must be refused with the deleter called once
        "bad_major_version": dlpack(v, [2], [1], version=(2, 0), bufsize=8),
        "bad_dtype_code": dlpack(v, [2], [1], code=99, bufsize=8),
        "opaque_handle": dlpack(v, [2], [1], code=3, bits=64, bufsize=16),
        "bad_device": dlpack(legacy, [2], [1], device=42, bufsize=8),
        "negative_device_id": dlpack(v, [2], [1], device_id=-1, bufsize=8),
        "negative_shape": dlpack(v, [-3], [1], bufsize=8),
        "negative_ndim": dlpack(v, [], [], bufsize=8)[:1] + b"\xff" + dlpack(v, [], [], bufsize=8)[2:],
        "rank_65": dlpack(v, [1] * 65, [1] * 65, bufsize=8),
        "shape_null": dlpack(v, [2], [1], mode=SHAPE_NULL, bufsize=8),
        "data_null_with_elements": dlpack(v, [2], [1], mode=DATA_NULL, bufsize=8),
        "stride_overflow": dlpack(v, [3, 3], [1 << 62, 1], wide=True, bufsize=8),
        "span_too_big_for_buffer": dlpack(v, [10], [1], bufsize=8),
        "zero_lanes": dlpack(v, [2], [1], lanes=0, bufsize=8),
    }


# ---- fuzz_typestr -----------------------------------------------------------------------------------------------
def typestr_seeds():
    def t(itemsize, text):
        return struct.pack("<b", itemsize) + text.encode("latin-1")

    return {
        "f4_le": t(4, "<f4"), "f8_be": t(8, ">f8"), "b1": t(1, "|b1"), "u1": t(1, "|u1"), "i8": t(8, "<i8"),
        "c16": t(16, "<c16"), "f2": t(2, "<f2"), "native_eq": t(2, "=i2"),
        "fmt_f": t(4, "f"), "fmt_d_le": t(8, "<d"), "fmt_e": t(2, "=e"), "fmt_bool": t(1, "?"),
        "fmt_Zf": t(8, "Zf"), "fmt_Zd": t(16, "Zd"), "fmt_net_I": t(4, "!I"), "fmt_B": t(1, "B"),
        "fmt_q": t(8, "q"), "fmt_l_native": t(8, "l"), "fmt_l_std": t(4, "<l"), "fmt_N": t(8, "@N"),
        "fmt_repeat_one": t(4, "1f"),
        # refused
        "void": t(2, "<V2"), "object": t(8, "|O8"), "string": t(5, "|S5"), "unicode": t(12, "<U3"),
        "datetime": t(8, "<M8[ns]"), "long_double": t(16, "<f16"), "bad_order": t(4, "#f4"),
        "short": t(4, "<f"), "size_zero": t(1, "<i0"), "size_huge": t(4, "<f99999999999999999999"),
        "fmt_struct": t(8, "T{f:x:f:y:}"), "fmt_pointer": t(8, "P"), "fmt_mismatch": t(8, "f"),
        "fmt_empty": t(1, ""), "fmt_n_std": t(8, "<n"), "fmt_multi": t(8, "2f"), "fmt_chars": t(4, "4s"),
        "negative_itemsize": t(-4, "f"),
    }


# ---- fuzz_interface ---------------------------------------------------------------------------------------------
AI, CAI, BUF = 0, 1, 2
I_STRIDES, I_DATA_ZERO, I_EXTENT, I_MASK, I_READONLY, I_WIDE = 4, 8, 16, 32, 64, 128


def interface(typestr, shape, strides=None, protocol=AI, version=3, bufsize=256, pos=0, extent=None, mode=0,
              wide=False, stride_count=0, dtype=None, content=b""):
    """extent: None (absent), "honest", or (extent_lie, before_lie) added to the honest values.
    dtype: None or a DLPack (code, bits, lanes) triple given as InterfaceDesc::dtype."""
    mode |= protocol
    if strides is not None:
        mode |= I_STRIDES
    if extent is not None:
        mode |= I_EXTENT
    if wide:
        mode |= I_WIDE
    fmt = "<q" if wide else "<b"
    out = struct.pack("<B", mode) + struct.pack("<i" if wide else "<b", version)
    out += b"\x00" if dtype is None else b"\x01" + struct.pack("<BBH", *dtype)
    ts = typestr.encode("latin-1")
    out += struct.pack("<B", len(ts)) + ts + struct.pack("<B", len(shape))
    for v in shape:
        out += struct.pack(fmt, v)
    if strides is not None:
        out += struct.pack("<B", stride_count)
        for v in strides:
            out += struct.pack(fmt, v)
    out += struct.pack("<HH", bufsize, pos)
    if extent == "honest":
        out += b"\x00"
    elif extent is not None:
        out += b"\x01" + struct.pack(fmt, extent[0]) + struct.pack(fmt, extent[1])
    return out + content


def interface_seeds():
    return {
        "ai_f4_c": interface("<f4", [2, 3], bufsize=24, extent="honest", content=bytes(range(24))),
        "ai_f8_strided": interface("<f8", [3, 2], [32, 8], bufsize=88, extent="honest"),
        "ai_negative_stride": interface("<i4", [4], [-4], bufsize=16, pos=12, extent="honest"),
        "ai_big_endian_swap": interface(">i4", [2, 2], [4, 8], bufsize=16, extent="honest"),
        "ai_complex_swap": interface(">c8", [3], bufsize=24),
        "ai_u1_transposed": interface("|u1", [5, 6], [1, 5], bufsize=30, extent="honest"),
        "ai_broadcast": interface("<f2", [4, 4], [0, 2], bufsize=8, extent="honest"),
        "ai_scalar": interface("<f8", [], bufsize=8),
        "ai_zero_size_null": interface("<f4", [0, 3], mode=I_DATA_ZERO, bufsize=0),
        "ai_readonly": interface("|b1", [7], mode=I_READONLY, bufsize=7, extent="honest"),
        "cai_v2": interface("<f4", [8], [8], protocol=CAI, version=2, bufsize=60, extent="honest"),
        "buffer_stride_unused": interface("<i8", [1, 3], [3, 8], protocol=BUF, bufsize=24, extent="honest"),
        "wide_shape": interface("<f4", [2, 2], [8, 4], wide=True, bufsize=16, extent="honest"),
        "f8_stride2_exact_block": interface("<f8", [4], [16], bufsize=56, extent="honest"),
        "swapped_f4_stride2": interface(">f4", [9], [8], bufsize=68, extent="honest"),
        "override_bf16": interface("<V2", [3, 2], [2, 6], dtype=(4, 16, 1), bufsize=18, extent="honest"),
        "override_int4_padded": interface("|V1", [5], dtype=(0, 4, 1), bufsize=5, extent="honest"),
        "override_float8": interface("|f1", [4], [-1], dtype=(10, 8, 1), bufsize=4, pos=3, extent="honest"),
        # refused
        "mask": interface("<f4", [2], mode=I_MASK, bufsize=8),
        "version_2_ai": interface("<f4", [2], version=2, bufsize=8),
        "cai_version_4": interface("<f4", [2], protocol=CAI, version=4, bufsize=8),
        "void_typestr": interface("<V2", [2], bufsize=4),
        "stride_not_multiple": interface("<f4", [3], [6], bufsize=16),
        "stride_count_mismatch": interface("<f4", [3], [4, 4], stride_count=3, bufsize=16),
        "negative_shape": interface("<f4", [-1], bufsize=16),
        "null_data": interface("<f4", [3], mode=I_DATA_ZERO, bufsize=16),
        "extent_too_small": interface("<f4", [4], bufsize=16, extent=(-1, 0)),
        "before_too_small": interface("<f4", [4], [-4], bufsize=16, pos=12, extent=(0, -1)),
        "extent_lie_large": interface("<f4", [8], bufsize=16, extent=(100, 0)),
        "rank_65": interface("|u1", [1] * 65, bufsize=1),
        "overflow": interface("<f8", [1 << 40, 1 << 40], wide=True, bufsize=8),
        "override_size_mismatch": interface("<V4", [2], dtype=(4, 16, 1), bufsize=8),
        "override_invalid_dtype": interface("<V2", [2], dtype=(99, 16, 1), bufsize=8),
        # regression: a zero-itemsize override once reached a division by zero
        "override_zero_itemsize": interface("<V0", [2], [4], dtype=(2, 0, 1), bufsize=8),
    }


# ---- fuzz_metadata ----------------------------------------------------------------------------------------------
def md_value(v):
    if v is None:
        return b"\x00"
    if v is False:
        return b"\x01"
    if v is True:
        return b"\x02"
    if isinstance(v, int):
        return b"\x03" + struct.pack("<q", v)
    if isinstance(v, float):
        return b"\x04" + struct.pack("<d", v)
    if isinstance(v, str):
        b = v.encode()
        return b"\x05" + struct.pack("<I", len(b)) + b
    if isinstance(v, bytes):
        return b"\x06" + struct.pack("<I", len(v)) + v
    if isinstance(v, list):
        return b"\x07" + struct.pack("<I", len(v)) + b"".join(md_value(x) for x in v)
    if isinstance(v, tuple):
        return b"\x08" + struct.pack("<I", len(v)) + b"".join(md_value(x) for x in v)
    if isinstance(v, dict):
        out = b"\x09" + struct.pack("<I", len(v))
        for k, x in v.items():
            kb = k.encode()
            out += struct.pack("<I", len(kb)) + kb + md_value(x)
        return out
    raise TypeError(v)


def md(root):
    return b"TWMD\x01" + md_value(root)


def metadata_seeds():
    nested = []
    for _ in range(10):
        nested = [nested]
    deep = {}
    for _ in range(70):
        deep = {"d": deep}
    return {
        "empty": md({}),
        "scalars": md({"none": None, "t": True, "f": False, "i": -7, "x": 1.5, "nan": float("nan")}),
        "strings": md({"fmt": "xyxy", "blob": b"\x00\xff\x10", "unicode": "\u00e9\u4e2d"}),
        "containers": md({"l": [1, "a", None], "t": (2.0, b"b"), "d": {"k": [(), {}]}}),
        "nested_lists": md({"n": nested}),
        "int_extremes": md({"min": -(1 << 63), "max": (1 << 63) - 1}),
        # refused
        "bad_magic": b"TWMX\x01" + md_value({}),
        "bad_version": b"TWMD\x02" + md_value({}),
        "root_not_dict": md([1, 2]),
        "truncated": md({"key": "value"})[:-2],
        "trailing": md({}) + b"\x00",
        "unknown_tag": b"TWMD\x01\x09\x01\x00\x00\x00\x01\x00\x00\x00k\x0a",
        "duplicate_key": b"TWMD\x01\x09\x02\x00\x00\x00" + (b"\x01\x00\x00\x00k\x00") * 2,
        "huge_count": b"TWMD\x01\x07\xff\xff\xff\xff",
        "huge_string": b"TWMD\x01\x09\x01\x00\x00\x00\xff\xff\xff\x7fk",
        "too_deep": md(deep),
        "short": b"TWM",
    }


def main():
    root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "corpus"
    for target, seeds in (("fuzz_dlpack", dlpack_seeds()), ("fuzz_typestr", typestr_seeds()),
                          ("fuzz_interface", interface_seeds()), ("fuzz_metadata", metadata_seeds())):
        d = root / target
        clear_hand_made(d)
        for name, data in seeds.items():
            (d / name).write_bytes(data)
        print(f"{d}: {len(seeds)} seeds")


if __name__ == "__main__":
    main()
