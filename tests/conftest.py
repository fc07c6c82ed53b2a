"""Test tiers from one suite.

- GPU tier (a CUDA device is visible): kernels run natively; ``@pytest.mark.gpu`` tests run.
- CPU tier (no GPU): ``TRITON_INTERPRET=1`` is set here, before any kernel module is imported,
  so the same kernels run on the CPU through the Triton interpreter (with the numerics layer
  in `lowbit.runtime.numerics` giving the GPU's answers); ``gpu`` tests are skipped with the
  reason printed.
- Compile tier (``@pytest.mark.compile``): compiles every production kernel configuration for
  sm_90a in a subprocess, with or without a GPU.
"""

import os

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from lowbit.testing import fresh_seed, interpreter_active, make_generator  # noqa: E402

ON_GPU = torch.cuda.is_available() and not interpreter_active()
ON_SM90 = ON_GPU and torch.cuda.get_device_capability() == (9, 0)
DEVICE = "cuda" if ON_GPU else "cpu"


def pytest_report_header(config):
    tier = "GPU (native kernels)" if ON_GPU else "CPU (Triton interpreter)"
    return f"lowbit test tier: {tier}; TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')}"


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need a CUDA GPU; ``sm90`` tests need Hopper's native engines (Gluon, wgmma,
    TMA). Both are skipped with the reason elsewhere, never silently."""
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (GPU tier: scripts/gpu_tier.sh)")
    skip_sm90 = pytest.mark.skip(reason="needs an sm_90 GPU for the Hopper engines (GPU tier: scripts/gpu_tier.sh)")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)
        elif "sm90" in item.keywords and not ON_SM90:
            item.add_marker(skip_sm90)


@pytest.fixture
def device() -> str:
    return DEVICE


@pytest.fixture
def seed(request) -> int:
    """A fresh seed per test (``LOWBIT_TEST_SEED`` pins it); printed on failure."""
    s = fresh_seed()
    request.node.user_properties.append(("seed", s))
    torch.manual_seed(s)
    return s


@pytest.fixture
def gen(seed) -> torch.Generator:
    return make_generator(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for k, v in item.user_properties:
            if k == "seed":
                rep.sections.append(("seed", f"reproduce with LOWBIT_TEST_SEED={v}"))
