"""Shared fixtures. Toy pairs are float64 and tiny; the embedded model loads once per session (per worker).

``make test`` runs the suite on two pytest-xdist workers, one file per worker at a time (``--dist loadfile``: a
module's tests share its fixtures and cache folders), each worker on one thread: most tests are Python-bound toy
runs that use one core anyway, and two workers of two threads each would oversubscribe the two cores.
"""
import gc
import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # before torch starts its thread pool
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import specdec_core as sd


@pytest.fixture
def without_cyclic_gc():
    """The cyclic garbage collector off for one test: what a dropped object frees then, reference counting freed."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


@pytest.fixture(scope="session")
def toy():
    return sd.toy_pair(vocab_size=8, seed=0)


@pytest.fixture(scope="session")
def toy16():
    return sd.toy_pair(vocab_size=16, seed=1)


@pytest.fixture(scope="session")
def smol():
    return sd.load_pair("smollm2-135m")


@pytest.fixture(scope="session")
def smol_prompt(smol):
    return smol.encode_chat("Give me three tips for writing clear Python code.")


def top2_gap(logits: torch.Tensor) -> float:
    top = torch.topk(logits.double(), 2).values
    return float(top[0] - top[1])


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# The slowest files first (one worker's share, a few minutes here, in this order): pytest-xdist's --dist loadfile
# hands whole files to its workers in collection order when told not to reorder them by test count
# (--no-loadscope-reorder, as `make test` runs it), so a long file collected last would leave the other worker idle
# at the end. A name missing here only runs later; the order inside a file is kept.
SLOWEST_FIRST = ("test_adaptive.py", "test_tree.py", "test_serving.py", "test_float64_embedded.py",
                 "test_gpu_reference.py", "test_parallel.py", "test_exactness.py", "test_decoding.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOWEST_FIRST)))  # stable


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded target's tokenizer (skips where the GGUF package is not installed)."""
    from specdec_core.paths import REPO_ROOT

    if not (REPO_ROOT / "data" / "models" / "smollm2-135m").exists():
        from specdec_core.models import embedded_path

        try:
            embedded_path()
        except RuntimeError as e:  # the GGUF package is not installed
            pytest.skip(str(e))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(REPO_ROOT / "data" / "models" / "smollm2-135m"))
