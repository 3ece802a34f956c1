"""specdec_core: speculative and parallel decoding on Hugging Face causal LMs, readable and exact.

    import specdec_core as sd
    pair = sd.load_pair("smollm2-135m")
    res = sd.generate(pair.target, ids, drafter=pair.drafter, method="linear", k=4)

The top-level modules are the decoding core: ``sampling`` (the one logits processor), ``verify`` (accept
rules), ``kvcache`` and ``lm`` (the preallocated cache and a model bound to it), ``tree`` (trees as data),
``drafters``, ``loop`` (the scaffold and each method's four phases), ``decode`` (``generate``) and ``record``
(the run record). ``serving/`` batches prompts (``generate_batch``); ``models/`` loads targets and drafts, ``train/`` trains drafts, ``study/`` measures and
proves (exactness, benchmarks, theory, profiling); the core imports neither ``train/`` nor ``study/``.

Notation: p = target law, q = draft law.
"""
import importlib
import os

# MKL's default kernels run a product of 2-16 rows (a verification pass) on one thread on some CPUs;
# AUTO lets them use every core. Set before torch's first matmul, unless the caller chose; see study.blas.
os.environ.setdefault("MKL_CBWR", "AUTO")

from . import sampling, tree, verify  # noqa: E402
from .decode import METHODS, generate, stream  # noqa: E402
from .drafters import BlockDrafter, Draft, Drafter, ModelDrafter, NGramDrafter  # noqa: E402
from .kvcache import KVCache  # noqa: E402
from .models import CorruptModelCache, Pair, load_pair, toy_pair  # noqa: E402
from .record import Result, Stats  # noqa: E402
from .sampling import SamplingParams, process_logits  # noqa: E402
from .serving import BatchResult, generate_batch  # noqa: E402

# The study's prompt set is re-exported lazily (``import specdec_core`` stays light and the core never
# imports study/): sd.load_prompts, sd.Prompt, sd.TASKS, sd.prompts.
_LAZY = {"prompts": ("specdec_core.study.prompts", None), "load_prompts": ("specdec_core.study.prompts", "load_prompts"),
         "Prompt": ("specdec_core.study.prompts", "Prompt"), "TASKS": ("specdec_core.study.prompts", "TASKS")}


def __getattr__(name):
    if name in _LAZY:
        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        return mod if attr is None else getattr(mod, attr)
    raise AttributeError(f"module 'specdec_core' has no attribute {name!r}")


__all__ = ["generate", "stream", "generate_batch", "BatchResult", "load_pair", "toy_pair", "Pair", "Result", "Stats",
           "KVCache", "Drafter", "Draft", "ModelDrafter", "NGramDrafter", "BlockDrafter", "SamplingParams",
           "process_logits", "sampling", "verify", "tree", "CorruptModelCache", "METHODS"] + list(_LAZY)
