"""The convert stage: dtypes and shapes per Arrow type and output, and memory sharing.

The independent truth is Arrow itself: values are compared with ``to_pylist`` /
``pyarrow.compute``, and "no copy" means the result's data pointer *is* the Arrow data
buffer's address plus the array's offset (``buffers()[1].address + offset * itemsize``).
"""

from __future__ import annotations

import datetime as dt
import gc
import subprocess
import sys
import warnings
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import arrowload as al
from arrowload.convert import ConvertOptions, convert_batch
from arrowload.errors import (
    ColumnNotFoundError,
    ConversionError,
    DeviceUnavailableError,
    MissingDependencyError,
    UnsupportedError,
)

try:
    import torch as TORCH
except ImportError:  # pragma: no cover - the torch extra is not installed
    TORCH = None

NUMERIC = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
           pa.float16(), pa.float32(), pa.float64()]


# ---------------------------------------------------------------------------
# helpers


def arrow_addr(arr: pa.Array) -> int:
    """Address of the first value of a fixed-width array, slice offset included."""
    return arr.buffers()[1].address + arr.offset * (arr.type.bit_width // 8)


def fsl_addr(arr: pa.FixedSizeListArray) -> int:
    child = arr.values
    k = arr.type.list_size
    return child.buffers()[1].address + (child.offset + arr.offset * k) * (child.type.bit_width // 8)


def np_addr(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


def numeric_array(t: pa.DataType, n: int = 100) -> pa.Array:
    """An Arrow-allocated (64-byte aligned) array of type ``t`` with values 0..n-1 (mod 100)."""
    return pa.array([i % 100 for i in range(n)], type=t)


def batch(**columns) -> pa.RecordBatch:
    return pa.record_batch(columns)


def torch_or_skip():
    return pytest.importorskip("torch")


def jax_or_skip():
    return pytest.importorskip("jax")


@pytest.fixture
def x64():
    """64-bit jax for the test's duration (jax's default is 32-bit)."""
    jax = jax_or_skip()
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", before)


@pytest.fixture
def no_x64():
    jax = jax_or_skip()
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", False)
    yield jax
    jax.config.update("jax_enable_x64", before)


# ---------------------------------------------------------------------------
# options


def test_options_validate_when_built():
    with pytest.raises(ConversionError) as err:
        ConvertOptions(output="pandas")
    assert isinstance(err.value, al.ArrowloadError) and isinstance(err.value, ValueError)
    assert "'numpy'" in str(err.value)
    assert ConvertOptions(pad_lists="tok").pad_lists == ("tok",)
    assert ConvertOptions(pad_lists=["a", "b"]).pad_lists == ("a", "b")
    with pytest.raises(ConversionError):
        ConvertOptions(pad_lists=3)
    with pytest.raises(ConversionError):
        ConvertOptions(fill_null={"x": None})
    with pytest.raises(ConversionError):
        ConvertOptions(fill_null=[("x", 0)])
    with pytest.raises(ConversionError):
        ConvertOptions(pad_value=[0])
    with pytest.raises(ConversionError):
        ConvertOptions(pad_to=-1)
    with pytest.raises(ConversionError, match="host memory"):
        ConvertOptions(output="numpy", device="cuda")
    assert ConvertOptions(output="numpy", device="cpu").device == "cpu"


def test_options_are_a_frozen_hashable_value():
    fills = {"x": 0}
    opts = ConvertOptions(output="torch", fill_null=fills)
    fills["x"] = 1  # the options keep their own copy
    assert opts.fill_null["x"] == 0
    assert opts == ConvertOptions(output="torch", fill_null={"x": 0})
    assert hash(opts) == hash(ConvertOptions(output="torch", fill_null={"x": 0}))
    with pytest.raises(AttributeError):
        opts.output = "numpy"


# ---------------------------------------------------------------------------
# numpy: dtypes, values, zero copy


@pytest.mark.parametrize("t", NUMERIC, ids=str)
@pytest.mark.parametrize("offset", [0, 3])
def test_numpy_numeric_is_a_read_only_view(t, offset):
    arr = numeric_array(t).slice(offset, 50)
    out = convert_batch(batch(x=arr), ConvertOptions())["x"]
    assert out.dtype == np.dtype(t.to_pandas_dtype()) and out.shape == (50,)
    assert out.tolist() == arr.to_pylist()
    assert np_addr(out) == arrow_addr(arr)
    assert not out.flags.writeable


def test_numpy_temporal_types():
    n = 20
    ts = pa.array(range(n), pa.timestamp("us", tz="Europe/Paris")).slice(2, 10)
    ns = pa.array(range(n), pa.timestamp("ns")).slice(5, 10)
    d64 = pa.array([i * 86_400_000 for i in range(n)], pa.date64()).slice(1, 10)
    dur = pa.array(range(n), pa.duration("ms")).slice(4, 10)
    t64 = pa.array(range(n), pa.time64("us")).slice(3, 10)
    d32 = pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(n)]).slice(7, 10)
    t32 = pa.array(range(n), pa.time32("s")).slice(6, 10)
    out = convert_batch(batch(ts=ts, ns=ns, d64=d64, dur=dur, t64=t64, d32=d32, t32=t32), ConvertOptions())
    expected = {"ts": "datetime64[us]", "ns": "datetime64[ns]", "d64": "datetime64[ms]", "dur": "timedelta64[ms]",
                "t64": "timedelta64[us]", "d32": "datetime64[D]", "t32": "timedelta64[s]"}
    for name, dtype in expected.items():
        assert out[name].dtype == np.dtype(dtype), name
    # int64-backed types are views (timestamps are UTC counts: the time zone does not change them)
    for name, arr in [("ts", ts), ("ns", ns), ("d64", d64), ("dur", dur), ("t64", t64)]:
        assert np_addr(out[name]) == arrow_addr(arr), name
        assert out[name].view(np.int64).tolist() == arr.view(pa.int64()).to_pylist()
    # 32-bit ones are widened: one copy, same counts
    assert out["d32"].tolist() == d32.to_pylist()
    assert out["d32"].view(np.int64).tolist() == d32.view(pa.int32()).to_pylist()
    assert out["t32"].view(np.int64).tolist() == t32.view(pa.int32()).to_pylist()
    assert np_addr(out["d32"]) != arrow_addr(d32)
    assert out["ts"][0] == np.datetime64(2, "us")


def test_numpy_bool_is_one_aligned_copy():
    arr = pa.array([i % 3 == 0 for i in range(100)]).slice(5, 60)  # a bit offset that is not a byte
    out = convert_batch(batch(b=arr), ConvertOptions())["b"]
    assert out.dtype == np.bool_ and out.tolist() == arr.to_pylist()
    assert np_addr(out) % 64 == 0  # a fresh Arrow allocation, so jax can take it without a copy
    assert not out.flags.writeable


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), max_size=150), st.booleans(), st.data())
def test_unpacked_bits_are_arrows_values_validity_and_true_positions(bits, nulls, data):
    """The bitmap helpers (``np.unpackbits`` over the bytes that hold an array's bits) against
    Arrow's own conversions, at any bit offset, with and without nulls (a null's value bit
    set or not), over chunks."""
    from arrowload.convert.host import bool_values, true_positions, valid_bits

    def bitmap(flags: list[bool]) -> pa.Buffer:
        return pa.py_buffer(np.packbits(np.array(flags, dtype=bool), bitorder="little").tobytes() + b"\0")

    n = len(bits)
    valid = bitmap([ok for _, ok in bits]) if nulls else None
    whole = pa.Array.from_buffers(pa.bool_(), n, [valid, bitmap([v for v, _ in bits])])
    lo = data.draw(st.integers(0, n))
    arr = whole.slice(lo, data.draw(st.integers(0, n - lo)))
    assert valid_bits(arr).tolist() == arr.is_valid().to_pylist()
    got = bool_values(arr)
    assert [bool(v) for v, ok in zip(got, valid_bits(arr)) if ok] == [v for v in arr.to_pylist() if v is not None]
    truth = [i for i, v in enumerate(arr.to_pylist()) if v]
    assert true_positions(arr).tolist() == truth and true_positions(arr).dtype == np.int64
    chunked = pa.chunked_array([whole.slice(0, lo), arr, whole.slice(lo)], pa.bool_())
    assert true_positions(chunked).tolist() == [i for i, v in enumerate(chunked.to_pylist()) if v]
    with_nulls = convert_batch(batch(b=arr), ConvertOptions(fill_null={"b": True}))["b"]
    assert with_nulls.tolist() == [True if v is None else v for v in arr.to_pylist()]


@pytest.mark.parametrize("offset", [0, 1, 7])
def test_numpy_fixed_size_list_is_a_2d_view(offset):
    k = 4
    arr = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(40 * k, dtype=np.float32)), k).slice(offset, 20)
    out = convert_batch(batch(emb=arr), ConvertOptions())["emb"]
    assert out.shape == (20, k) and out.dtype == np.float32
    assert out.tolist() == arr.to_pylist()
    assert np_addr(out) == fsl_addr(arr)


def test_numpy_fixed_size_list_over_a_sliced_child():
    child = pa.array(np.arange(100, dtype=np.int16)).slice(10, 60)
    arr = pa.FixedSizeListArray.from_arrays(child, 3).slice(2, 10)
    out = convert_batch(batch(v=arr), ConvertOptions())["v"]
    assert out.tolist() == arr.to_pylist()
    assert np_addr(out) == fsl_addr(arr)


def test_numpy_nested_fixed_size_lists_are_nd():
    inner = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * 3 * 30, dtype=np.int32)), 3)
    arr = pa.FixedSizeListArray.from_arrays(inner, 2).slice(4, 10)
    out = convert_batch(batch(m=arr), ConvertOptions())["m"]
    assert out.shape == (10, 2, 3) and out.tolist() == arr.to_pylist()
    assert np_addr(out) == inner.values.buffers()[1].address + 4 * 2 * 3 * 4


def test_numpy_fixed_shape_tensor():
    t = pa.fixed_shape_tensor(pa.float32(), (2, 3))
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6 * 5, dtype=np.float32)), 6)
    arr = pa.ExtensionArray.from_storage(t, storage).slice(1)
    out = convert_batch(batch(img=arr), ConvertOptions())["img"]
    assert out.shape == (4, 2, 3)
    np.testing.assert_array_equal(out, arr.to_numpy_ndarray())


def test_numpy_strings_binaries_decimals_stay_python_objects():
    cols = dict(
        s=pa.array(["a", None, "ccc"]),
        ls=pa.array(["a", "b", "c"], pa.large_string()),
        sv=pa.array(["x", "y", "z"], pa.string_view()),
        bin=pa.array([b"\x00", b"", None]),
        fb=pa.array([b"ab", b"cd", b"ef"], pa.binary(2)),
        cat=pa.array(["u", "v", "u"]).dictionary_encode(),
        dec=pa.array([1, 2, 3], pa.decimal128(5, 2)),
        words=pa.array([["a"], [], ["b", "c"]]),
    )
    out = convert_batch(batch(**cols), ConvertOptions())
    for name, arr in cols.items():
        assert isinstance(out[name], list) and out[name] == arr.to_pylist(), name
    assert out["cat"] == ["u", "v", "u"]


def test_numpy_dictionary_of_numbers_is_decoded():
    arr = pa.array([1.5, 2.5, 1.5, 3.5], pa.float32()).dictionary_encode().slice(1)
    out = convert_batch(batch(d=arr), ConvertOptions())["d"]
    assert out.dtype == np.float32 and out.tolist() == [2.5, 1.5, 3.5]


def test_a_table_is_converted_too():
    single = pa.table({"x": pa.array(np.arange(10, dtype=np.int64))})
    out = convert_batch(single, ConvertOptions())["x"]
    assert np_addr(out) == arrow_addr(single.column("x").chunk(0))
    chunked = pa.concat_tables([single, single])
    out = convert_batch(chunked, ConvertOptions())["x"]  # several chunks: concatenated (one copy)
    assert out.tolist() == list(range(10)) * 2


def test_empty_batch_keeps_dtypes_and_shapes():
    b = batch(x=pa.array([], pa.float32()), b=pa.array([], pa.bool_()),
              emb=pa.array([], pa.list_(pa.float32(), 3)), tok=pa.array([], pa.list_(pa.int64())),
              s=pa.array([], pa.string()))
    out = convert_batch(b, ConvertOptions(pad_lists=True))
    assert out["x"].shape == (0,) and out["x"].dtype == np.float32
    assert out["b"].shape == (0,) and out["emb"].shape == (0, 3)
    assert out["tok"].shape == (0, 0) and out["tok_lengths"].shape == (0,)
    assert out["s"] == []
    sliced = convert_batch(batch(x=numeric_array(pa.int32()).slice(100)), ConvertOptions())["x"]
    assert sliced.shape == (0,)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), t=st.sampled_from(NUMERIC))
def test_property_numeric_slices_round_trip_and_share_memory(data, t):
    dtype = np.dtype(t.to_pandas_dtype())
    values = data.draw(hnp.arrays(dtype, st.integers(0, 200),
                                  elements=hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False)))
    arr = pa.array(values, type=t)
    start = data.draw(st.integers(0, len(arr)))
    length = data.draw(st.integers(0, len(arr) - start))
    part = arr.slice(start, length)
    out = convert_batch(batch(x=part), ConvertOptions())["x"]
    np.testing.assert_array_equal(out, values[start:start + length])
    if length:
        assert np_addr(out) == arrow_addr(part)
    if TORCH is not None:
        tensor = convert_batch(batch(x=part), ConvertOptions(output="torch"))["x"]
        np.testing.assert_array_equal(tensor.numpy(), values[start:start + length])
        if length:
            assert tensor.data_ptr() == arrow_addr(part)


# ---------------------------------------------------------------------------
# variable-length lists


def test_variable_length_list_without_padding_says_how_to_fix():
    b = batch(tok=pa.array([[1, 2], [3]]), x=pa.array([1, 2]))
    with pytest.raises(ConversionError) as err:
        convert_batch(b, ConvertOptions())
    message = str(err.value)
    assert "'tok'" in message and "pad_lists=True" in message and "pad_lists=('tok',)" in message
    assert err.value.column == "tok"


@pytest.mark.parametrize("list_type", [pa.list_, pa.large_list])
def test_padded_list_and_lengths(list_type):
    rows = [[1, 2, 3], [], [4], [5, 6], [7, 8, 9, 10], [11]]
    arr = pa.array(rows, list_type(pa.int32())).slice(1, 4)  # [], [4], [5, 6], [7, 8, 9, 10]
    out = convert_batch(batch(tok=arr), ConvertOptions(pad_lists=True, pad_value=-1))
    assert out["tok"].dtype == np.int32 and out["tok"].shape == (4, 4)
    assert out["tok"].tolist() == [[-1] * 4, [4, -1, -1, -1], [5, 6, -1, -1], [7, 8, 9, 10]]
    assert out["tok_lengths"].dtype == np.int64 and out["tok_lengths"].tolist() == [0, 1, 2, 4]
    assert list(out) == ["tok", "tok_lengths"]
    assert np_addr(out["tok"]) % 64 == 0  # the one copy lands in an aligned buffer


def test_pad_lists_by_name_and_pad_to():
    b = batch(a=pa.array([[1.0], [2.0, 3.0]]), b=pa.array([[1], [2]]))
    out = convert_batch(b.select(["a"]), ConvertOptions(pad_lists=("a",), pad_to=5))
    assert out["a"].shape == (2, 5) and out["a"][1].tolist() == [2.0, 3.0, 0.0, 0.0, 0.0]
    # b's lists all have length 1: [2, 1] like a fixed-size list; a ragged c is an error
    assert convert_batch(b, ConvertOptions(pad_lists=("a",)))["b"].tolist() == [[1], [2]]
    with pytest.raises(ConversionError, match="'c'.* lengths 1 to 3"):
        convert_batch(b.append_column("c", pa.array([[1], [2, 3, 4]])), ConvertOptions(pad_lists=("a",)))
    with pytest.raises(ConversionError, match="pad_to=1"):
        convert_batch(b, ConvertOptions(pad_lists=True, pad_to=1))
    with pytest.raises(ColumnNotFoundError, match="'c'"):
        convert_batch(b, ConvertOptions(pad_lists=("a", "c")))


def test_padded_list_of_fixed_size_lists_is_3d():
    t = pa.list_(pa.list_(pa.float32(), 2))
    arr = pa.array([[[1, 2], [3, 4]], [[5, 6]], []], t)
    out = convert_batch(batch(pts=arr), ConvertOptions(pad_lists=True))
    assert out["pts"].shape == (3, 2, 2)
    assert out["pts"].tolist() == [[[1, 2], [3, 4]], [[5, 6], [0, 0]], [[0, 0], [0, 0]]]
    assert out["pts_lengths"].tolist() == [2, 1, 0]


def test_padded_list_of_timestamps_and_bools():
    ts = pa.array([[1, 2], [3]], pa.list_(pa.timestamp("s")))
    flags = pa.array([[True], [False, True]])
    out = convert_batch(batch(ts=ts, f=flags), ConvertOptions(pad_lists=True))
    assert out["ts"].dtype == np.dtype("datetime64[s]")
    assert out["ts"].view(np.int64).tolist() == [[1, 2], [3, 0]]
    assert out["f"].tolist() == [[True, False], [False, True]]


def test_pad_value_must_fit_the_type():
    b = batch(tok=pa.array([[1], [2, 3]], pa.list_(pa.int8())))
    with pytest.raises(ConversionError, match="pad_value"):
        convert_batch(b, ConvertOptions(pad_lists=True, pad_value=1.5))
    with pytest.raises(ConversionError, match="pad_value"):
        convert_batch(b, ConvertOptions(pad_lists=True, pad_value=300))


def test_nested_variable_length_lists_are_refused_clearly():
    b = batch(t=pa.array([[[1], [2, 3]], []]))
    with pytest.raises(UnsupportedError, match="'t'"):
        convert_batch(b, ConvertOptions(pad_lists=True))


def test_lengths_column_name_collision():
    b = batch(tok=pa.array([[1]]), tok_lengths=pa.array([1]))
    with pytest.raises(ConversionError, match="tok_lengths"):
        convert_batch(b, ConvertOptions(pad_lists=True))


# ---------------------------------------------------------------------------
# nulls


def test_null_in_a_numeric_column_names_the_column_and_the_fix():
    b = batch(ok=pa.array([1, 2, 3]), score=pa.array([1.0, None, 3.0]))
    with pytest.raises(ConversionError) as err:
        convert_batch(b, ConvertOptions())
    message = str(err.value)
    assert "'score'" in message and "fill_null={'score'" in message and "IS NOT NULL" in message
    assert err.value.column == "score"


def test_fill_null_fills_once_and_leaves_the_batch_alone():
    score = pa.array([1.0, None, 3.0, None])
    b = batch(score=score, n=pa.array([None, 2, 3, 4], pa.int16()))
    out = convert_batch(b, ConvertOptions(fill_null={"score": -1.0, "n": 0}))
    assert out["score"].tolist() == [1.0, -1.0, 3.0, -1.0]
    assert out["n"].dtype == np.int16 and out["n"].tolist() == [0, 2, 3, 4]
    assert score.to_pylist() == [1.0, None, 3.0, None]
    assert np_addr(out["score"]) != arrow_addr(score)


def test_fill_null_star_covers_numbers_only():
    b = batch(x=pa.array([None, 1]), y=pa.array([0.5, None]), flag=pa.array([True, None]))
    with pytest.raises(ConversionError, match="'flag'"):
        convert_batch(b, ConvertOptions(fill_null={"*": 0}))
    out = convert_batch(b, ConvertOptions(fill_null={"*": 0, "flag": False}))
    assert out["x"].tolist() == [0, 1] and out["y"].tolist() == [0.5, 0.0]
    assert out["flag"].tolist() == [True, False]


def test_fill_null_checks_names_and_values():
    b = batch(n=pa.array([1, None], pa.int8()))
    with pytest.raises(ColumnNotFoundError) as err:
        convert_batch(b, ConvertOptions(fill_null={"m": 0}))
    assert isinstance(err.value, KeyError) and "columns: n" in str(err.value)
    with pytest.raises(ConversionError, match="fill_null"):
        convert_batch(b, ConvertOptions(fill_null={"n": 1.5}))  # would truncate
    with pytest.raises(ConversionError, match="fill_null"):
        convert_batch(b, ConvertOptions(fill_null={"n": 1000}))  # does not fit int8
    dec = batch(d=pa.array([Decimal("1.25"), None], pa.decimal128(10, 2)))
    assert convert_batch(dec, ConvertOptions(output="arrow", fill_null={"d": 0}))["d"].to_pylist() == \
        [Decimal("1.25"), Decimal("0.00")]  # an int64 cast needed 21 digits: it was refused
    with pytest.raises(ConversionError, match="fill_null"):
        convert_batch(dec, ConvertOptions(output="arrow", fill_null={"d": 10 ** 9}))
    flags = batch(f=pa.array([True, None]))
    with pytest.raises(ConversionError, match="fill_null"):
        convert_batch(flags, ConvertOptions(fill_null={"f": 9}))  # Arrow's cast made it True
    assert convert_batch(flags, ConvertOptions(fill_null={"f": 0}))["f"].tolist() == [True, False]


def test_nulls_in_temporal_and_fixed_size_list_columns():
    d = pa.array([dt.date(2024, 1, 2), None])
    emb = pa.array([[1.0, 2.0], None, [None, 4.0]], pa.list_(pa.float32(), 2))
    with pytest.raises(ConversionError, match="'d'"):
        convert_batch(batch(d=d), ConvertOptions())
    with pytest.raises(ConversionError, match="'emb'"):
        convert_batch(batch(emb=emb), ConvertOptions())
    out = convert_batch(batch(d=d), ConvertOptions(fill_null={"d": dt.date(2000, 1, 1)}))
    assert out["d"].tolist() == [dt.date(2024, 1, 2), dt.date(2000, 1, 1)]
    out = convert_batch(batch(emb=emb), ConvertOptions(fill_null={"*": 0}))
    assert out["emb"].tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 4.0]]


def test_nulls_in_variable_length_lists():
    tok = pa.array([[1, None], None, [3]])
    with pytest.raises(ConversionError, match="null list"):
        convert_batch(batch(tok=tok), ConvertOptions(pad_lists=True))
    out = convert_batch(batch(tok=tok), ConvertOptions(pad_lists=True, pad_value=-1, fill_null={"tok": 0}))
    assert out["tok"].tolist() == [[1, 0], [-1, -1], [3, -1]]
    assert out["tok_lengths"].tolist() == [2, 0, 1]
    with pytest.raises(ConversionError, match="null value"):
        convert_batch(batch(tok=pa.array([[1, None]])), ConvertOptions(pad_lists=True))


def test_null_list_backed_by_values_is_left_out():
    # Arrow allows a null list to span values; they are not part of the column's data.
    values = pa.array([1, 2, 3, 4, 5])
    arr = pa.ListArray.from_arrays(pa.array([0, 2, 4, 5], pa.int32()), values,
                                   mask=pa.array([False, True, False]))
    out = convert_batch(batch(t=arr), ConvertOptions(pad_lists=True, fill_null={"t": 0}))
    assert out["t"].tolist() == [[1, 2], [0, 0], [5, 0]]
    assert out["t_lengths"].tolist() == [2, 0, 1]


def test_string_nulls_are_none_or_filled():
    b = batch(s=pa.array(["a", None]))
    assert convert_batch(b, ConvertOptions())["s"] == ["a", None]
    assert convert_batch(b, ConvertOptions(fill_null={"s": ""}))["s"] == ["a", ""]
    assert convert_batch(b, ConvertOptions(fill_null={"*": 0}))["s"] == ["a", None]  # '*' is numbers only


# ---------------------------------------------------------------------------
# arrow output


def test_arrow_output_is_the_batch_itself():
    b = batch(x=pa.array([1, None]), tok=pa.array([[1], [2, 3]]))
    assert convert_batch(b, ConvertOptions(output="arrow", pad_lists=True)) is b


def test_arrow_output_applies_fill_null():
    b = batch(x=pa.array([1, None]), tok=pa.array([[1], None]))
    out = convert_batch(b, ConvertOptions(output="arrow", fill_null={"*": 7}))
    assert isinstance(out, pa.RecordBatch) and out.schema == b.schema
    assert out.column("x").to_pylist() == [1, 7]
    assert out.column("tok").to_pylist() == [[1], None]  # '*' leaves nested columns as they are
    with pytest.raises(UnsupportedError, match="'tok'"):
        convert_batch(b, ConvertOptions(output="arrow", fill_null={"tok": 0}))


# ---------------------------------------------------------------------------
# torch


@pytest.mark.parametrize("t", NUMERIC, ids=str)
@pytest.mark.parametrize("offset", [0, 3])
def test_torch_numeric_shares_memory_without_warnings(t, offset):
    torch = torch_or_skip()
    arr = numeric_array(t).slice(offset, 50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = convert_batch(batch(x=arr), ConvertOptions(output="torch"))["x"]
    assert out.dtype == getattr(torch, np.dtype(t.to_pandas_dtype()).name)
    assert out.shape == (50,) and out.device.type == "cpu"
    assert out.data_ptr() == arrow_addr(arr)
    assert out.to(torch.float64).tolist() == [float(v) for v in arr.to_pylist()]


def test_torch_types_and_shapes():
    torch = torch_or_skip()
    emb = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(40, dtype=np.float32)), 4).slice(3)
    ts = pa.array(range(10), pa.timestamp("ms")).slice(3)
    d32 = pa.array(range(10), pa.int32()).view(pa.date32()).slice(3)
    b = batch(emb=emb, ts=ts, d32=d32, flag=pa.array([True, False] * 5).slice(3),
              tok=pa.array([[1, 2]] * 5 + [[3]] * 5, pa.list_(pa.int16())).slice(3),
              s=pa.array([str(i) for i in range(10)]).slice(3))
    out = convert_batch(b, ConvertOptions(output="torch", pad_lists=True))
    assert out["emb"].shape == (7, 4) and out["emb"].dtype == torch.float32
    assert out["emb"].data_ptr() == fsl_addr(emb)
    assert out["ts"].dtype == torch.int64 and out["ts"].tolist() == list(range(3, 10))
    assert out["ts"].data_ptr() == arrow_addr(ts)
    assert out["d32"].dtype == torch.int64 and out["d32"].tolist() == list(range(3, 10))
    assert out["flag"].dtype == torch.bool and out["flag"].tolist() == [False, True] * 3 + [False]
    assert out["tok"].shape == (7, 2) and out["tok"].dtype == torch.int16
    assert out["tok_lengths"].dtype == torch.int64 and out["tok_lengths"].tolist() == [2, 2] + [1] * 5
    assert out["s"] == [str(i) for i in range(3, 10)]


def test_torch_cuda_without_cuda_is_a_clear_error():
    torch = torch_or_skip()
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    b = batch(x=pa.array([1.0]))
    with pytest.raises(DeviceUnavailableError) as err:
        convert_batch(b, ConvertOptions(output="torch", device="cuda"))
    assert isinstance(err.value, al.ArrowloadError) and isinstance(err.value, RuntimeError)
    assert "cuda" in str(err.value).lower() and "device=None" in str(err.value)
    with pytest.raises(ConversionError, match="not a torch device"):
        convert_batch(b, ConvertOptions(output="torch", device="warp-drive"))


@pytest.mark.parametrize("device", [None, "cpu"])
def test_torch_host_output_never_touches_cuda(monkeypatch, device):
    torch = torch_or_skip()

    def forbidden(*args, **kwargs):
        raise AssertionError("a torch.cuda function was called for host output")

    for fn in ("is_available", "current_device", "device_count", "init", "_lazy_init", "synchronize",
               "current_stream", "is_initialized"):
        if hasattr(torch.cuda, fn):
            monkeypatch.setattr(torch.cuda, fn, forbidden)
    arr = numeric_array(pa.float32()).slice(1)
    out = convert_batch(batch(x=arr, b=pa.array([True] * 99)), ConvertOptions(output="torch", device=device))
    assert out["x"].data_ptr() == arrow_addr(arr) and out["x"].device.type == "cpu"
    with pytest.raises(AssertionError):  # the patch is live: the call above really did not use it
        torch.cuda.is_available()


def test_torch_tensor_keeps_the_batch_alive():
    torch_or_skip()
    arr = pa.array(np.arange(1000, dtype=np.int64) * 3)
    out = convert_batch(batch(x=arr.slice(10)), ConvertOptions(output="torch"))["x"]
    del arr
    gc.collect()
    _ = [np.ones(1000) for _ in range(100)]  # give freed memory a chance to be reused
    assert out.tolist() == [3 * i for i in range(10, 1000)]


def test_missing_torch_gives_an_install_hint(monkeypatch):
    from arrowload.convert import torch_out

    monkeypatch.setattr(torch_out, "_torch", None)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'arrowload\[torch\]'") as err:
        convert_batch(batch(x=pa.array([1])), ConvertOptions(output="torch"))
    assert isinstance(err.value, ImportError)


def test_import_arrowload_loads_neither_torch_nor_jax():
    code = ("import sys, arrowload, arrowload.convert; "
            "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------
# jax


def test_jax_shares_aligned_buffers_and_copies_unaligned_ones(x64):
    """The measured jax-on-CPU behaviour the docs state: zero copy iff the address is 64-byte aligned."""
    arr = numeric_array(pa.float32(), 1000)
    assert arr.buffers()[1].address % 64 == 0  # Arrow allocates 64-byte aligned buffers
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        aligned = convert_batch(batch(x=arr.slice(16)), ConvertOptions(output="jax"))["x"]  # 64 bytes in
        unaligned = convert_batch(batch(x=arr.slice(1)), ConvertOptions(output="jax"))["x"]
    assert aligned.unsafe_buffer_pointer() == arrow_addr(arr.slice(16))
    assert unaligned.unsafe_buffer_pointer() != arrow_addr(arr.slice(1))
    assert aligned.tolist() == arr.slice(16).to_pylist() and unaligned.tolist() == arr.slice(1).to_pylist()
    # arrowload's own copies are aligned, so jax takes them as they are
    flags = pa.array([True, False] * 50).slice(3)
    host = convert_batch(batch(b=flags), ConvertOptions(output="numpy"))["b"]
    jflags = convert_batch(batch(b=flags), ConvertOptions(output="jax"))["b"]
    assert np_addr(host) % 64 == 0 and jflags.unsafe_buffer_pointer() % 64 == 0
    assert jflags.tolist() == flags.to_pylist()


@pytest.mark.parametrize("t", NUMERIC, ids=str)
def test_jax_numeric_at_aligned_offsets_shares_memory(x64, t):
    arr = numeric_array(t, 256)
    offset = 64 // (t.bit_width // 8)  # the next 64-byte boundary
    for part in (arr, arr.slice(offset)):
        out = convert_batch(batch(x=part), ConvertOptions(output="jax"))["x"]
        assert out.dtype == np.dtype(t.to_pandas_dtype())
        assert out.unsafe_buffer_pointer() == arrow_addr(part)
        np.testing.assert_array_equal(np.asarray(out), part.to_numpy())


def test_jax_types_and_shapes_with_x64(x64):
    jnp = pytest.importorskip("jax.numpy")
    k = 4
    emb = pa.FixedSizeListArray.from_arrays(numeric_array(pa.float32(), 72 * k), k).slice(16)
    ts = pa.array(range(64), pa.timestamp("us")).slice(8)
    b = batch(emb=emb, ts=ts, i=pa.array(range(64), pa.int64()).slice(8), f=pa.array(np.arange(64.0)).slice(8),
              flag=pa.array([True, False] * 32).slice(8), s=pa.array([str(i) for i in range(64)]).slice(8),
              tok=pa.array([[1, 2, 3][: i % 4] for i in range(64)], pa.list_(pa.int32())).slice(8))
    out = convert_batch(b, ConvertOptions(output="jax", pad_lists=True, device="cpu"))
    assert out["emb"].shape == (56, k) and out["emb"].dtype == jnp.float32
    assert out["emb"].unsafe_buffer_pointer() == fsl_addr(emb)
    assert out["ts"].dtype == jnp.int64 and out["ts"].tolist() == list(range(8, 64))
    assert out["ts"].unsafe_buffer_pointer() == arrow_addr(ts)
    assert out["i"].dtype == jnp.int64 and out["f"].dtype == jnp.float64
    assert out["flag"].dtype == jnp.bool_
    assert out["tok"].shape == (56, 3) and out["tok_lengths"].dtype == jnp.int64
    assert out["s"] == [str(i) for i in range(8, 64)]
    assert {d.platform for d in out["emb"].devices()} == {"cpu"}


def test_jax_without_x64_narrows_exactly_or_refuses(no_x64):
    jnp = pytest.importorskip("jax.numpy")
    out = convert_batch(batch(i=pa.array([1, -2, 3], pa.int64()), ts=pa.array([5, 6, 7], pa.timestamp("s"))),
                        ConvertOptions(output="jax"))
    assert out["i"].dtype == jnp.int32 and out["i"].tolist() == [1, -2, 3]
    assert out["ts"].dtype == jnp.int32 and out["ts"].tolist() == [5, 6, 7]
    with pytest.raises(ConversionError, match="jax_enable_x64") as err:
        convert_batch(batch(big=pa.array([2**40], pa.int64())), ConvertOptions(output="jax"))
    assert err.value.column == "big"
    with pytest.raises(ConversionError, match="float64"):
        convert_batch(batch(f=pa.array([0.5])), ConvertOptions(output="jax"))


def test_jax_cuda_without_gpu_is_a_clear_error():
    jax = jax_or_skip()
    if any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("this machine has a GPU")
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        convert_batch(batch(x=pa.array([1.0], pa.float32())), ConvertOptions(output="jax", device="cuda"))


def test_jax_array_keeps_the_batch_alive(x64):
    arr = pa.array([7 * i for i in range(1024)], pa.int64())  # Arrow-allocated: 64-byte aligned
    out = convert_batch(batch(x=arr.slice(64)), ConvertOptions(output="jax"))["x"]
    assert out.unsafe_buffer_pointer() == arrow_addr(arr.slice(64))
    del arr
    gc.collect()
    _ = [np.ones(1000) for _ in range(100)]
    assert out.tolist() == [7 * i for i in range(64, 1024)]


def test_numpy_view_keeps_the_batch_alive():
    arr = pa.array(np.arange(1000, dtype=np.int32) * 5)
    out = convert_batch(batch(x=arr.slice(3)), ConvertOptions())["x"]
    del arr
    gc.collect()
    _ = [np.ones(1000) for _ in range(100)]
    assert out.tolist() == [5 * i for i in range(3, 1000)]


def test_one_batch_three_outputs_agree(x64):
    torch = torch_or_skip()
    b = batch(x=pa.array(np.linspace(0, 1, 64, dtype=np.float32)).slice(5),
              n=pa.array(pc.cast(pa.array(range(64)), pa.uint8())).slice(5))
    host = convert_batch(b, ConvertOptions())
    tens = convert_batch(b, ConvertOptions(output="torch"))
    jx = convert_batch(b, ConvertOptions(output="jax"))
    for name in ("x", "n"):
        np.testing.assert_array_equal(host[name], tens[name].numpy())
        np.testing.assert_array_equal(host[name], np.asarray(jx[name]))
    assert tens["n"].dtype == torch.uint8


# ---------------------------------------------------------------------------
# variable-length lists of one length: [batch, k], a view of the values


@pytest.mark.parametrize("list_type", [pa.list_, pa.large_list])
def test_lists_of_one_length_are_2d_views_of_the_values(list_type):
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    arr = pa.array(list(rows), list_type(pa.float32()))
    values = np.frombuffer(arr.values.buffers()[1], dtype=np.float32)
    for lo, n in ((0, 6), (2, 3), (5, 1)):
        out = convert_batch(batch(e=arr.slice(lo, n)), ConvertOptions())["e"]
        assert out.shape == (n, 4) and out.dtype == np.float32
        assert np.array_equal(out, rows[lo:lo + n])
        assert np.shares_memory(out, values)  # zero-copy: a view of Arrow's values buffer
    t = convert_batch(batch(e=arr), ConvertOptions(output="torch"))["e"]
    assert tuple(t.shape) == (6, 4) and t.numpy().tolist() == rows.tolist()


def test_lists_of_one_length_fill_value_nulls_and_refuse_null_lists():
    arr = pa.array([[1.0, None], [3.0, 4.0]], pa.list_(pa.float64()))
    with pytest.raises(ConversionError, match="'e'"):
        convert_batch(batch(e=arr), ConvertOptions())
    out = convert_batch(batch(e=arr), ConvertOptions(fill_null={"e": -1.0}))["e"]
    assert out.tolist() == [[1.0, -1.0], [3.0, 4.0]]
    with pytest.raises(ConversionError, match="'e'.*null list") as info:
        convert_batch(batch(e=pa.array([[1.0, 2.0], None], pa.list_(pa.float64()))), ConvertOptions())
    assert "IS NOT NULL" in str(info.value) and "pad_lists=True" in str(info.value)


# -- review findings: outputs beside stack= / fill_null, parts of other widths, devices --------

def _odd_types_table() -> pa.Table:
    return pa.table({
        "f": np.arange(4, dtype=np.float32), "g": np.arange(4, dtype=np.float32),
        "ts": pa.array([0, 1, 2, 3], pa.timestamp("us", tz="America/New_York")),
        "tm": pa.array([0, 1, 2, 3], pa.time64("us")),
        "d64": pa.array([0, 86_400_000, 2 * 86_400_000, 3 * 86_400_000], pa.date64()),
        "ls": pa.array(["a", "b", None, "d"], pa.large_string()),
        "dec": pa.array([Decimal("1.50")] * 4, pa.decimal128(12, 2)),
        "img": pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(np.arange(16, dtype=np.float32)), 2), 2),
    })


@pytest.mark.parametrize("shuffle", [False, "global"])
def test_arrow_output_with_stack_keeps_the_other_columns_types(shuffle):
    """output='arrow' with stack= rebuilt every other column from host arrays: time zones
    dropped, time64 -> duration, date64 -> timestamp, decimals re-guessed per batch, and a
    3-D column raised ArrowInvalid. They are Arrow's columns as they are without stack=."""
    t = _odd_types_table()
    got = pa.Table.from_batches(list(al.dataset(t).loader(4, output="arrow", stack={"x": ["f", "g"]},
                                                          shuffle=shuffle, seed=1)))
    assert got.schema.names == ["x", "ts", "tm", "d64", "ls", "dec", "img"]
    for name in ["ts", "tm", "d64", "ls", "dec", "img"]:
        assert got.schema.field(name).type == t.schema.field(name).type, name
    truth = {r["tm"]: r for r in t.to_pylist()}
    for row in got.to_pylist():
        want = truth[row["tm"]]
        assert row["x"] == [want["f"], want["g"]]
        assert {k: row[k] for k in ["ts", "d64", "ls", "dec", "img"]} == \
            {k: want[k] for k in ["ts", "d64", "ls", "dec", "img"]}


def test_loader_fills_nulls_of_strings_and_decimals_and_refuses_a_value_of_another_type():
    """The loader refused fill_null on string and decimal columns at build ('no array
    form'), which convert_batch fills; a number for a string column was cast to text."""
    t = pa.table({"id": [1, 2, 3], "s": ["a", None, "c"],
                  "dec": pa.array([Decimal("1.5"), None, Decimal("2.5")], pa.decimal128(5, 1))})
    batch = next(iter(al.dataset(t).loader(3, fill_null={"s": "?", "dec": Decimal("0.0")})))
    assert batch["s"] == ["a", "?", "c"]
    assert batch["dec"] == [Decimal("1.5"), Decimal("0.0"), Decimal("2.5")]
    with pytest.raises(al.InvalidArgumentError, match="give a str value"):
        al.dataset(t).loader(3, fill_null={"s": 5})


def test_fill_null_star_with_a_fraction_fills_the_float_columns_only():
    """'*': 0.5 was refused for any integer column, even one without nulls (the CLI's
    --fill-null passes a float): it fills the floating-point columns."""
    t = pa.table({"id": [0, 1, 2], "score": [0.1, None, 0.3]})
    batch = next(iter(al.dataset(t).loader(3, fill_null={"*": 0.5})))
    assert batch["score"].tolist() == [0.1, 0.5, 0.3] and batch["id"].tolist() == [0, 1, 2]
    t2 = pa.table({"id": [0, None, 2], "score": [0.1, None, 0.3]})
    with pytest.raises(al.ConversionError, match="'id'"):  # the integer column's null stays refused
        list(al.dataset(t2).loader(3, fill_null={"*": 0.5}))


def test_a_batch_across_parts_of_other_list_widths_is_a_conversion_error():
    """A batch that spans two reads whose uniform lists have other widths raised numpy's
    ValueError from the concatenation; it is the ConversionError naming the column."""
    a = pa.table({"id": np.arange(100), "emb": pa.array([[1.0] * 4] * 100, pa.list_(pa.float32()))})
    b = pa.table({"id": np.arange(100, 200), "emb": pa.array([[2.0] * 5] * 100, pa.list_(pa.float32()))})
    ds = al.dataset(pa.concat_tables([a, b]))
    for size in (50, 64):
        with pytest.raises(al.ConversionError, match="'emb'"):
            list(ds.loader(size))


def test_arrow_output_fill_null_refuses_nested_nulls_and_fills_dictionary_values():
    """output='arrow' skipped any column without top-level nulls: nulls inside a named
    fixed-size list stayed (documented as refused), and a null among a dictionary's values
    stayed where numpy output fills it."""
    emb = pa.FixedSizeListArray.from_arrays(pa.array([1.0, None, 3.0, 4.0], pa.float32()), 2)
    d = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()), pa.array([1.5, None]))
    t = pa.table({"emb": emb, "d": d})
    with pytest.raises(al.UnsupportedError, match="inside the nested column 'emb'"):
        list(al.dataset(t).loader(2, output="arrow", fill_null={"emb": 0.0}))
    got = next(iter(al.dataset(t).loader(2, output="arrow", fill_null={"d": 0.0})))
    assert got.column("d").to_pylist() == [1.5, 0.0]
    assert got.schema.field("d").type == t.schema.field("d").type
    numpy = next(iter(al.dataset(t.select(["d"])).loader(2, fill_null={"d": 0.0})))
    assert numpy["d"].tolist() == [1.5, 0.0]


def test_torch_devices_this_build_lacks_are_refused_when_the_loader_is_built():
    """device='xpu' on a torch build without it was accepted and failed at the first batch
    with a bare AssertionError; 'meta' gave tensors with no data."""
    pytest.importorskip("torch")
    ds = al.dataset(pa.table({"a": [1.0, 2.0]}))
    with pytest.raises(al.DeviceUnavailableError, match="xpu"):
        ds.loader(2, output="torch", device="xpu")
    with pytest.raises(al.ArrowloadError, match="meta tensors hold no data"):
        ds.loader(2, output="torch", device="meta")
