"""The TensorRT plugin's TensorRT-independent logic (plugins/core/plugin_fields.h) through
libepifuse_core.so's C ABI: the creator's field list, createPlugin's parsing of the fields the ONNX
parser forwards, getFieldsToSerialize's round trip, the profile's tactic list and the timing-cache
id. The adapter in plugins/tensorrt only converts types around these."""
from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

from optimizer import runtime
from optimizer.contract import ACTIVATIONS, RESIDUAL_MODES
from optimizer.registry import BFLOAT16, FLOAT, FLOAT16, ConvDesc, _CDesc

# nvinfer1::PluginFieldType values
FLOAT32, FLOAT64, INT32, CHAR, INT64 = 1, 2, 5, 6, 10
RESIDUAL_NAMES = {0: "none", 1: "pre", 2: "post"}


class _CField(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("data", ctypes.c_void_p), ("type", ctypes.c_int32),
                ("length", ctypes.c_int32)]


class _CAttrs(ctypes.Structure):
    _fields_ = [*[(f, ctypes.c_int64) for f in ("stride_h", "stride_w", "dil_h", "dil_w", "pad_top", "pad_left",
                                                 "pad_bottom", "pad_right", "group")],
                ("activation", ctypes.c_char_p), ("activation_params", ctypes.c_float * 2),
                ("residual", ctypes.c_int32), ("allow_tf32", ctypes.c_int32)]


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(runtime.library_path(runtime.CORE_LIBRARY)))
    err = (ctypes.c_char_p, ctypes.c_size_t)
    lib.epifuse_plugin_field_spec.argtypes = [ctypes.c_int32, ctypes.POINTER(ctypes.c_char_p),
                                              ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)]
    lib.epifuse_plugin_fields_create.argtypes = [ctypes.POINTER(_CField), ctypes.c_int32, *err]
    lib.epifuse_plugin_fields_create.restype = ctypes.c_void_p
    lib.epifuse_plugin_fields_destroy.argtypes = [ctypes.c_void_p]
    lib.epifuse_plugin_fields_attrs.argtypes = [ctypes.c_void_p, ctypes.POINTER(_CAttrs)]
    lib.epifuse_plugin_fields_serialized.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(_CField)),
                                                     ctypes.POINTER(ctypes.c_int32)]
    lib.epifuse_plugin_fields_timing_cache_id.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.epifuse_plugin_tactic_id.argtypes = [ctypes.c_char_p]
    lib.epifuse_plugin_tactic_id.restype = ctypes.c_int32
    desc_p = ctypes.POINTER(_CDesc)
    lib.epifuse_plugin_tactics.argtypes = [desc_p, desc_p, desc_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32),
                                           ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t, *err]
    lib.epifuse_plugin_tactics.restype = ctypes.c_int32
    return lib


# ------------------------------------------------------------------------------ field helpers
def field(name: str, value, ftype: int | None = None):
    """(name, type, bytes, length) the way the ONNX parser builds a PluginField from an attribute."""
    if isinstance(value, str):
        data = value.encode() + b"\0"
        return name, CHAR if ftype is None else ftype, data, len(data)
    if isinstance(value, (int, np.integer)):
        value = [value]
    value = list(value)
    if ftype is None:
        ftype = FLOAT32 if any(isinstance(v, float) for v in value) else INT32
    np_type = {FLOAT32: np.float32, FLOAT64: np.float64, INT32: np.int32, INT64: np.int64}[ftype]
    return name, ftype, np.asarray(value, dtype=np_type).tobytes(), len(value)


class Fields:
    """A parsed plugin: what createPlugin keeps and getFieldsToSerialize writes."""

    def __init__(self, fields):
        self._buffers = [ctypes.create_string_buffer(data, max(1, len(data))) for _, _, data, _ in fields]
        arr = (_CField * max(1, len(fields)))()
        for i, ((name, ftype, _, length), buf) in enumerate(zip(fields, self._buffers)):
            arr[i] = _CField(name.encode(), ctypes.cast(buf, ctypes.c_void_p), ftype, length)
        err = ctypes.create_string_buffer(1024)
        self._h = _lib().epifuse_plugin_fields_create(arr, len(fields), err, len(err))
        if not self._h:
            raise ValueError(err.value.decode())

    def __del__(self):
        if getattr(self, "_h", None):
            _lib().epifuse_plugin_fields_destroy(self._h)

    def attrs(self) -> dict:
        a = _CAttrs()
        _lib().epifuse_plugin_fields_attrs(self._h, ctypes.byref(a))
        return dict(strides=(a.stride_h, a.stride_w), dilations=(a.dil_h, a.dil_w),
                    pads=(a.pad_top, a.pad_left, a.pad_bottom, a.pad_right), group=a.group,
                    activation=a.activation.decode(), activation_params=tuple(a.activation_params),
                    residual=RESIDUAL_NAMES[a.residual], allow_tf32=a.allow_tf32)

    def serialized(self) -> list[tuple[str, int, bytes, int]]:
        """getFieldsToSerialize's fields, copied out."""
        p, n = ctypes.POINTER(_CField)(), ctypes.c_int32()
        _lib().epifuse_plugin_fields_serialized(self._h, ctypes.byref(p), ctypes.byref(n))
        size = {FLOAT32: 4, FLOAT64: 8, INT32: 4, CHAR: 1, INT64: 8}
        return [(p[i].name.decode(), p[i].type, ctypes.string_at(p[i].data, p[i].length * size[p[i].type]),
                 p[i].length) for i in range(n.value)]

    def timing_cache_id(self) -> str:
        buf = ctypes.create_string_buffer(512)
        _lib().epifuse_plugin_fields_timing_cache_id(self._h, buf, len(buf))
        return buf.value.decode()


def onnx_fields(**attrs):
    return [field(k, v) for k, v in attrs.items()]


def tactics(*corners: ConvDesc, sm: int = 0) -> tuple[list[int], list[str], str]:
    """(ids, kernel names, reason when none) for a profile given as (min, [opt,] max) problems."""
    cs = [c._to_c() for c in corners]
    lo, hi = cs[0], cs[-1]
    opt = cs[1] if len(cs) == 3 else None
    ids = (ctypes.c_int32 * 64)()
    names, err = ctypes.create_string_buffer(1 << 14), ctypes.create_string_buffer(4096)
    n = _lib().epifuse_plugin_tactics(ctypes.byref(lo), ctypes.byref(opt) if opt else None, ctypes.byref(hi), sm,
                                      ids, 64, names, len(names), err, len(err))
    return list(ids[:n]), names.value.decode().split(",") if n else [], err.value.decode()


# ------------------------------------------------------------------------------------- tests
def test_field_names_are_the_contract_attributes():
    specs = {}
    for i in range(32):
        name, ftype, length = ctypes.c_char_p(), ctypes.c_int32(), ctypes.c_int32()
        if _lib().epifuse_plugin_field_spec(i, ctypes.byref(name), ctypes.byref(ftype), ctypes.byref(length)):
            break
        specs[name.value.decode()] = (ftype.value, length.value)
    assert specs == {"strides": (INT32, 2), "pads": (INT32, 4), "dilations": (INT32, 2), "group": (INT32, 1),
                     "activation": (CHAR, 0), "activation_params": (FLOAT32, 0), "residual": (CHAR, 0),
                     "allow_tf32": (INT32, 1)}


def test_missing_fields_take_the_contract_defaults():
    assert Fields([]).attrs() == dict(strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0), group=1,
                                      activation="identity", activation_params=(0.0, 0.0), residual="none",
                                      allow_tf32=0)


def test_fields_as_the_onnx_parser_forwards_them():
    a = Fields(onnx_fields(strides=[2, 1], pads=[1, 0, 2, 3], dilations=[1, 2], group=4,
                           activation="leaky_relu", activation_params=[0.2], residual="post")).attrs()
    assert a["strides"] == (2, 1) and a["pads"] == (1, 0, 2, 3) and a["dilations"] == (1, 2)
    assert a["group"] == 4 and a["activation"] == "leaky_relu" and a["residual"] == "post"
    assert a["activation_params"][0] == pytest.approx(0.2)


def test_int64_and_float64_fields_are_accepted():
    """The Python API's PluginField may carry int64/float64 arrays; the parser narrows to 32 bits."""
    a = Fields([field("strides", [2, 2], INT64), field("group", 2, INT64), field("activation", "clip"),
                field("activation_params", [0.0, 6.0], FLOAT64)]).attrs()
    assert a["strides"] == (2, 2) and a["group"] == 2 and a["activation_params"] == (0.0, 6.0)


def test_char_field_without_terminating_nul():
    name, ftype, data, _ = field("activation", "relu")
    assert Fields([(name, ftype, data[:-1], 4)]).attrs()["activation"] == "relu"


@pytest.mark.parametrize("fields, message", [
    ([field("stride", [1, 1])], "unknown field 'stride'"),
    ([field("strides", [1.0, 1.0])], "field 'strides' (FLOAT32 x 2): expected INT32 or INT64"),
    ([field("strides", [1, 1, 1])], "attribute 'strides' needs 2 values"),
    ([field("pads", [1, 1])], "attribute 'pads' needs 4 values"),
    ([field("group", [1, 2])], "field 'group' (INT32 x 2): expected one value"),
    ([field("activation", [1])], "field 'activation' (INT32 x 1): expected a CHAR string"),
    ([field("activation", "swish")], "unknown activation 'swish'"),
    ([field("activation", "clip"), field("activation_params", [1.0])], "takes 2 activation_params, got 1"),
    ([field("activation_params", [1, 2])], "expected FLOAT32 or FLOAT64"),
    ([field("residual", "both")], "unknown residual 'both'"),
    ([field("strides", [0, 1])], "strides must be in [1, 2^31 - 1]"),
    ([field("pads", [0, -1, 0, 0])], "pads must be in [0, 2^31 - 1]"),
    ([field("group", 0)], "group must be in [1, 2^31 - 1]"),
    ([field("group", 1), field("group", 2)], "field 'group' is given twice"),
    ([field("allow_tf32", 2)], "allow_tf32 must be 0 or 1, got 2"),
    ([field("allow_tf32", [1, 1])], "field 'allow_tf32' (INT32 x 2): expected one value"),
    ([("strides", INT32, b"", -1)], "negative length"),
])
def test_bad_fields_are_errors_that_name_the_field(fields, message):
    with pytest.raises(ValueError) as e:
        Fields(fields)
    assert message in str(e.value)


def _round_trip_cases():
    for act, defaults in ACTIVATIONS.items():
        params = [[]] if not defaults else [[], [0.25 + i for i in range(len(defaults))]]
        for p in params:
            yield dict(activation=act, **({"activation_params": p} if p else {}))
    for res in RESIDUAL_MODES:
        yield dict(residual=res, strides=[2, 3], pads=[0, 1, 2, 3], dilations=[3, 2], group=8)
    yield dict(allow_tf32=1, activation="relu")


@pytest.mark.parametrize("attrs", list(_round_trip_cases()), ids=lambda a: "-".join(f"{k}={v}" for k, v in a.items()))
def test_serialize_then_create_runtime_round_trip(attrs):
    """getFieldsToSerialize -> createPlugin(kRUNTIME) gives back the same plugin, and serializing
    that one writes the same bytes (a null or lossy getFieldsToSerialize still builds silently)."""
    built = Fields(onnx_fields(**attrs))
    written = built.serialized()
    assert {name for name, *_ in written} >= {"strides", "pads", "dilations", "group", "activation", "residual",
                                              "allow_tf32"}
    for name, ftype, data, length in written:  # the types the parser gives, so createPlugin parses both alike
        assert ftype in (INT32, CHAR, FLOAT32), name
        if ftype == CHAR:
            assert data.endswith(b"\0") and len(data) == length
    restored = Fields(written)
    assert restored.attrs() == built.attrs()
    assert restored.serialized() == written
    expected = ACTIVATIONS[built.attrs()["activation"]]
    want = attrs.get("activation_params") or expected
    np.testing.assert_array_equal(np.float32(built.attrs()["activation_params"][:len(expected)]), np.float32(want))


def test_values_beyond_int32_are_refused():
    with pytest.raises(ValueError, match=r"does not fit a 32-bit plugin field|pads must be in \[0, 2\^31 - 1\]"):
        Fields([field("pads", [0, 0, 2**31, 0], INT64)])


def test_timing_cache_id_keys_on_what_changes_the_kernel_choice():
    base = Fields(onnx_fields(activation="leaky_relu", activation_params=[0.1]))
    assert base.timing_cache_id() == Fields(onnx_fields(activation="leaky_relu", activation_params=[0.3])).timing_cache_id()
    for other in (dict(activation="relu"), dict(activation="leaky_relu", group=2),
                  dict(activation="leaky_relu", strides=[2, 2]), dict(activation="leaky_relu", residual="pre"),
                  dict(activation="leaky_relu", pads=[1, 1, 1, 1]), dict(activation="leaky_relu", dilations=[2, 2]),
                  dict(activation="leaky_relu", allow_tf32=1)):
        assert Fields(onnx_fields(**other)).timing_cache_id() != base.timing_cache_id(), other


PROBLEMS = [
    ConvDesc.from_attributes(FLOAT, (1, 32, 32, 64), (64, 3, 3, 64), pads=(1, 1, 1, 1), activation="relu"),
    ConvDesc.from_attributes(FLOAT16, (1, 32, 32, 64), (128, 3, 3, 64), pads=(1, 1, 1, 1), activation="silu"),
    ConvDesc.from_attributes(BFLOAT16, (1, 32, 32, 64), (64, 1, 1, 64), activation="identity"),
    ConvDesc.from_attributes(FLOAT16, (1, 32, 32, 3), (16, 3, 3, 3), strides=(2, 2), activation="hardswish"),
    ConvDesc.from_attributes(FLOAT16, (1, 32, 32, 32), (32, 3, 3, 1), pads=(1, 1, 1, 1), group=32),
    ConvDesc.from_attributes(FLOAT16, (1, 32, 32, 12), (10, 3, 3, 6), group=2, activation="relu"),
]


def test_tactic_ids_are_nonzero_unique_and_name_the_kernel():
    seen = {}
    for p in PROBLEMS:
        ids, names, why = tactics(p, p)
        assert ids, why
        for i, name in zip(ids, names):
            assert i > 0 and i == _lib().epifuse_plugin_tactic_id(name.encode())
            assert seen.setdefault(i, name) == name, f"tactic id {i} names {seen[i]} and {name}"
    assert len(seen) >= 3


def test_tactics_must_run_the_whole_profile():
    """A profile whose max shape is beyond some kernels' limits offers only the kernels that run
    both ends, in the registry's order."""
    small = ConvDesc.from_attributes(FLOAT16, (1, 32, 32, 64), (64, 3, 3, 64), pads=(1, 1, 1, 1))
    huge = ConvDesc.from_attributes(FLOAT16, (1024, 512, 512, 64), (64, 3, 3, 64), pads=(1, 1, 1, 1))
    lo, hi = tactics(small, small)[1], tactics(huge, huge)[1]
    _, both, why = tactics(small, huge)
    assert both == [n for n in lo if n in hi], why
    assert len(both) < len(lo), "the 8 GiB input should exceed some kernel's limit"
    _, with_opt, _ = tactics(small, small, huge)
    assert with_opt == both


def test_tactics_follow_the_device():
    p = PROBLEMS[1]
    any_sm = tactics(p, p)[1]
    for sm in (80, 86, 90, 120):
        on_sm = tactics(p, p, sm=sm)[1]
        assert on_sm and set(on_sm) <= set(any_sm)


def test_no_tactics_say_why():
    bad = ConvDesc.from_attributes(FLOAT, (1, 8, 8, 6), (4, 3, 3, 3), group=4)
    ids, names, why = tactics(bad, bad)
    assert ids == [] and names == [] and "group 4 does not divide C = 6" in why
