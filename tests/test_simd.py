"""The second SIMD level of CI is really in force when its variables are set (``make test-simd``)."""

import os

import pytest
import torch

pytestmark = pytest.mark.numeric


@pytest.mark.skipif(os.environ.get("ATEN_CPU_CAPABILITY") != "default", reason="ATEN_CPU_CAPABILITY=default not set")
def test_torch_runs_its_generic_kernels():
    assert torch.backends.cpu.get_cpu_capability() == "DEFAULT"


@pytest.mark.skipif(os.environ.get("FAISS_SIMD_LEVEL") != "NONE", reason="FAISS_SIMD_LEVEL=NONE not set")
def test_faiss_runs_its_generic_kernels():
    faiss = pytest.importorskip("faiss")
    if not hasattr(faiss, "SIMDConfig"):  # faiss builds of one level each: FAISS_OPT_LEVEL picks the library
        assert "AVX" not in faiss.get_compile_options().split()[-1]
        return
    assert faiss.SIMDConfig.get_level_name() == "NONE"
