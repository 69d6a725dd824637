"""The default model runs in float32 on a CPU that would emulate bfloat16 (engine_adapter/vllm_cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine_adapter import vllm_cli

AVX2 = "processor\t: 0\nflags\t\t: fpu sse4_2 avx f16c avx2\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
ZEN4 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"


@pytest.mark.parametrize(("cpuinfo", "native"), [(AVX2, False), (SAPPHIRE, True), (ZEN4, True), ("processor\t: 0\n", True)])
def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path, cpuinfo: str, native: bool) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(cpuinfo)
    assert vllm_cli.cpu_has_native_bf16(str(path)) is native


def test_no_cpuinfo_counts_as_native(tmp_path: Path) -> None:
    assert vllm_cli.cpu_has_native_bf16(str(tmp_path / "missing")) is True


@pytest.mark.parametrize(("given", "native", "expected"), [("auto", False, "float32"), ("auto", True, "auto"),
                                                           ("bfloat16", False, "bfloat16"), ("float16", True, "float16")])
def test_only_an_unset_dtype_on_an_emulating_cpu_becomes_float32(monkeypatch: pytest.MonkeyPatch, given: str, native: bool,
                                                                 expected: str) -> None:
    from vllm.platforms import current_platform

    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)  # (also where the tests run on a GPU)
    monkeypatch.setattr(vllm_cli, "cpu_has_native_bf16", lambda: native)
    ns = argparse.Namespace(dtype=given)
    vllm_cli._default_model_dtype(ns)
    assert ns.dtype == expected
