#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_arrow_schema in fuzz/corpus/fuzz_arrow_schema/ (valid and invalid inputs).

The byte layout mirrors the comment at the top of fuzz/fuzz_arrow_schema.cpp. Re-running rewrites the same files.
Usage: python3 fuzz/make_corpus_arrow.py [corpus dir]
"""
import pathlib
import struct
import sys

from corpus_util import clear_hand_made  # (fuzz/: the script's own folder is on sys.path)

HERE = pathlib.Path(__file__).resolve().parent
FORMATS = ["c", "C", "s", "S", "i", "I", "l", "L", "e", "f", "g", "b", "+w:4", "+w:6", "+w:0", "+w:2", "+w:1",
           "+w:24", "+s", "+l", "+L", "u", "n", "tdD", "+w:3", "+w:12"]
EXT_NAME, EXT_META, TW_META, OTHER = 0, 1, 2, 3
V_FIXED, V_VARIABLE, V_BOOL8, V_EMPTY = 0, 1, 2, 3


def md_pairs(pairs):
    out = struct.pack("<i", len(pairs))
    for k, v in pairs:
        out += struct.pack("<i", len(k)) + k + struct.pack("<i", len(v)) + v
    return out


def value(v):
    """A metadata value: an index into the harness's table, or raw bytes."""
    if isinstance(v, int):
        return bytes([v])
    return b"\xff" + struct.pack("<H", len(v)) + v


def node(fmt, name=b"", pairs=(), children=(), dictionary=None, flags=2):
    out = bytes([FORMATS.index(fmt)]) if fmt in FORMATS else b"\xff" + bytes([len(fmt)]) + fmt.encode()
    out += bytes([len(name)]) + name + bytes([flags, len(pairs)])
    for key, v in pairs:
        out += bytes([key]) + value(v)
    out += bytes([len(children), 1 if dictionary else 0])
    for c in children:
        out += c
    if dictionary:
        out += dictionary
    return out


def ext(name, meta):
    return [(EXT_NAME, name), (EXT_META, meta)]


def twmd_empty():
    return b"TWMD\x01\x09\x00\x00\x00\x00"


def seeds():
    f32 = node("f", b"item")
    tree = {
        "fixed_2x3": node("+w:6", b"t", ext(b"arrow.fixed_shape_tensor", b'{"shape":[2,3]}'), [f32]),
        "fixed_permuted_named": node("+w:24", b"", ext(V_FIXED, b'{"shape":[2,3,4],"permutation":[2,0,1],'
                                                                 b'"dim_names":["C","H","W"]}'), [f32]),
        "fixed_bool8": node("+w:4", b"", ext(V_FIXED, b'{"shape":[2,2]}'),
                            [node("c", b"item", ext(V_BOOL8, V_EMPTY))]),
        "fixed_tw_metadata": node("+w:2", b"", ext(V_FIXED, b'{"shape":[2]}') + [(TW_META, twmd_empty())], [f32]),
        "variable": node("+s", b"", ext(V_VARIABLE, b'{"uniform_shape":[null,3]}'),
                         [node("+l", b"data", (), [f32]), node("+w:2", b"shape", (), [node("i", b"item")])]),
        "variable_large_list": node("+s", b"", ext(V_VARIABLE, V_EMPTY),
                                    [node("+L", b"data", (), [f32]), node("+w:1", b"shape", (), [node("i")])]),
        "record_batch": node("+s", b"", (), [node("g", b"x"), node("+w:2", b"y", (), [node("b")])]),
        "bool8": node("c", b"", ext(V_BOOL8, V_EMPTY)),
        "primitive": node("L", b"n"),
        # refused
        "bad_json": node("+w:6", b"", ext(V_FIXED, b'{"shape":[2,3],}'), [f32]),
        "duplicate_key": node("+w:6", b"", ext(V_FIXED, b'{"shape":[6],"shape":[6]}'), [f32]),
        "shape_mismatch": node("+w:6", b"", ext(V_FIXED, b'{"shape":[4,2]}'), [f32]),
        "bad_permutation": node("+w:6", b"", ext(V_FIXED, b'{"shape":[2,3],"permutation":[1,1]}'), [f32]),
        "dictionary": node("i", b"", (), (), node("u")),
        "string": node("u"),
        "bad_list_format": node("+w:x1", b"", (), [f32]),
        "nested_struct": node("+s", b"", (), [node("+s", b"", (), [f32])]),
        "bad_tw_metadata": node("f", b"", [(TW_META, b"TWMD\x02")]),
        "unknown_extension": node("f", b"", ext(b"geoarrow.point", b"")),
    }
    out = {"tree_" + k: b"\x01" + v for k, v in tree.items()}
    out["framing_two_pairs"] = b"\x00" + md_pairs([(b"a", b"1"), (b"ARROW:extension:name", b"arrow.bool8")])
    out["framing_empty"] = b"\x00" + md_pairs([])
    out["framing_negative_length"] = b"\x00" + struct.pack("<ii", 1, -5)
    out["framing_trailing"] = b"\x00" + md_pairs([(b"k", b"v")]) + b"!"
    for name, text, size in [("json_ok", b'{"shape":[3,4],"dim_names":["a","\\u00e9"]}', 12),
                             ("json_escapes", b'{"shape":[1],"x":"\\ud83d\\ude00\\n\\"","y":[1.5e-3,-0,true,null]}', 1),
                             ("json_deep", b'{"shape":[1],"x":' + b"[" * 40 + b"]" * 40 + b"}", 1),
                             ("json_leading_zero", b'{"shape":[01]}', 1),
                             ("json_bad_utf8", b'{"shape":[1],"dim_names":["\xc0\xaf"]}', 1),
                             ("json_lone_surrogate", b'{"shape":[1],"dim_names":["\\udc00"]}', 1)]:
        out[name] = b"\x02" + struct.pack("<H", size) + text
    return out


def main():
    d = (pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "corpus") / "fuzz_arrow_schema"
    clear_hand_made(d)
    s = seeds()
    for name, data in s.items():
        (d / name).write_bytes(data)
    print(f"{d}: {len(s)} seeds")


if __name__ == "__main__":
    main()
