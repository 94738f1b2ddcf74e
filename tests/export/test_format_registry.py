"""The export format registry agrees with the command's options and with each writer's own checks,
and refuses what a format cannot hold before anything is loaded."""

from __future__ import annotations

import typing

import pytest

from gptforge.errors import InputError
from gptforge.export.formats import FORMATS, ExportOptions, export_model


def test_every_format_option_has_one_entry():
    hints = typing.get_type_hints(ExportOptions)
    assert set(typing.get_args(hints["format"])) == set(FORMATS)
    assert all(name == fmt.name for name, fmt in FORMATS.items())
    dtypes = set(typing.get_args(typing.get_args(hints["dtype"])[0]))
    quants = set(typing.get_args(typing.get_args(hints["quantize"])[0]))
    for fmt in FORMATS.values():
        assert set(fmt.dtypes) <= dtypes and set(fmt.quantize) <= quants
        assert fmt.default_dtype is None or fmt.default_dtype in fmt.dtypes
        assert fmt.dtype_refusal or set(fmt.dtypes) == dtypes  # a refused dtype is explained


def test_registry_matches_the_writers_own_checks():
    from gptforge.export.gguf import GGUF_DTYPES, GGUF_QUANTS
    from gptforge.export.onnx import ONNX_DTYPES

    assert FORMATS["gguf"].quantize == GGUF_QUANTS and FORMATS["gguf"].dtypes == GGUF_DTYPES
    assert FORMATS["onnx"].dtypes == FORMATS["triton"].dtypes == ONNX_DTYPES


@pytest.mark.parametrize("fmt,dtype,quantize,message", [
    ("hf", None, "int8", "--quantize int8 cannot be written in the hf format: it takes no --quantize"),
    ("gguf", None, "int8", "--quantize int8 cannot be written in the gguf format: it offers q8_0, q4_0"),
    ("onnx", None, "q4_0", "--quantize q4_0 cannot be written in the onnx format: it offers int8"),
    ("triton", "bf16", None, "--dtype bf16 cannot be written in the triton format (onnxruntime's CPU kernels "
                             "lack bfloat16): use f32 or f16"),
])
def test_refusals_come_before_loading(tmp_path, fmt, dtype, quantize, message):
    missing = tmp_path / "no-such-run"  # loading it would fail with another error
    opts = ExportOptions(source=str(missing), format=fmt, out=str(tmp_path / "out"), dtype=dtype, quantize=quantize)
    with pytest.raises(InputError) as e:
        export_model(opts)
    assert str(e.value) == message
    assert not (tmp_path / "out").exists()


def test_existing_out_is_refused_without_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    opts = ExportOptions(source=str(tmp_path / "no-such-run"), format="onnx", out=str(tmp_path / "out"))
    with pytest.raises(InputError, match="exists; choose another --out or pass --overwrite"):
        export_model(opts)
