"""'auto' float types: bf16 only where the hardware does bf16 natively (config/hardware.py)."""

import pytest

import config.hardware as hw
from config.settings import Settings, load_settings

X86_AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse4_2 avx fma avx2\n\nprocessor\t: 1\nflags\t\t: fpu\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"
ARM_BF16 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_flags_are_read_from_the_first_cpu_on_x86_and_arm():
    assert hw.cpu_flags(X86_AVX2) == {"fpu", "sse4_2", "avx", "fma", "avx2"}
    assert "bf16" in hw.cpu_flags(ARM_BF16) and hw.cpu_flags("no flags here") == set()


@pytest.mark.parametrize("text,native", [(X86_AVX2, False), (X86_BF16, True), (ARM_BF16, True), ("", False)])
def test_native_bf16_from_cpuinfo(tmp_path, text, native):
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    assert hw.native_bf16(str(f)) is native
    assert hw.native_bf16(str(tmp_path / "missing")) is False


def test_resolve_dtype():
    assert hw.resolve_dtype("auto", "cuda:0", native=False) == "bfloat16"  # GPUs do bf16 natively
    assert hw.resolve_dtype("auto", "cpu", native=False) == "float32"
    assert hw.resolve_dtype("auto", "cpu", native=True) == "bfloat16"
    assert hw.resolve_dtype("bfloat16", "cpu", native=False) == "bfloat16"  # an explicit choice stands
    assert hw.fast_bf16("cuda", native=False) and not hw.fast_bf16("cpu", native=False)


@pytest.mark.parametrize("native", [False, True])
def test_settings_resolve_every_auto_once(monkeypatch, native):
    monkeypatch.setattr(hw, "native_bf16", lambda *a: native)
    s = load_settings()  # the CPU default says auto (by leaving the fields out)
    want = "bfloat16" if native else "float32"
    assert (s.model.serve_dtype, s.embedding.dtype, s.learner.bf16) == (want, want, native)
    gpu = Settings.model_validate({"model": {"device": "cuda"}, "learner": {"device": "cuda"}})
    assert (gpu.model.serve_dtype, gpu.learner.bf16, gpu.embedding.dtype) == ("bfloat16", True, want)
    fixed = Settings.model_validate({"model": {"serve_dtype": "float32"}, "learner": {"bf16": True}})
    assert (fixed.model.serve_dtype, fixed.learner.bf16) == ("float32", True)
    again = Settings.model_validate(s.model_dump())  # settings travel to actors as JSON: still concrete
    assert again.model.serve_dtype == want
