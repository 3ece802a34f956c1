"""specdec_core: speculative and parallel decoding on Hugging Face causal LMs, readable and exact.

    import specdec_core as sd
    pair = sd.load_pair("smollm2-135m")
    res = sd.generate(pair.target, ids, drafter=pair.drafter, method="linear", k=4)

The package is layered, each layer importing only those below it (``specdec_core/README.md`` draws it;
``tests/test_layout.py`` checks it): ``paths`` ← the decoding core (the top-level modules: ``sampling``,
``kvcache``, ``record``, ``lm``, ``tree``, ``verify``, ``drafters``, ``loop``, ``decode``) ← ``adaptive`` and
``serving`` ← ``models`` ← ``data`` ← ``train`` and ``study`` ← ``tools`` (programs) ← the chapters and scripts.

Notation: p = target law, q = draft law.
"""
import os
import warnings

# MKL's default kernels run a product of 2-16 rows (a verification pass) on one thread on some CPUs;
# AUTO lets them use every core. Set before torch's first matmul, unless the caller chose; see study.blas.
os.environ.setdefault("MKL_CBWR", "AUTO")

# huggingface_hub (imported by transformers) imports tqdm.auto, which warns "IProgress not found" in a Jupyter
# kernel without ipywidgets; every progress bar here is plain-text tqdm, so that one notice is filtered, alone.
warnings.filterwarnings("ignore", message="IProgress not found")

from . import sampling, tree, verify  # noqa: E402
from .data import prompts  # noqa: E402
from .data.prompts import TASKS, Prompt, load_prompts  # noqa: E402
from .decode import METHODS, generate, stream  # noqa: E402
from .drafters import BlockDrafter, Draft, Drafter, ModelDrafter, NGramDrafter  # noqa: E402
from .adaptive.suffix import SuffixDrafter  # noqa: E402
from .kvcache import KVCache  # noqa: E402
from .models import CorruptModelCache, Pair, load_pair, toy_pair  # noqa: E402
from .record import Result, Stats  # noqa: E402
from .sampling import SamplingParams, process_logits  # noqa: E402
from .serving import BatchResult, generate_batch  # noqa: E402

__all__ = ["generate", "stream", "generate_batch", "BatchResult", "load_pair", "toy_pair", "Pair", "Result", "Stats",
           "KVCache", "Drafter", "Draft", "ModelDrafter", "NGramDrafter", "SuffixDrafter", "BlockDrafter", "SamplingParams",
           "process_logits", "sampling", "verify", "tree", "CorruptModelCache", "METHODS", "prompts", "load_prompts", "Prompt", "TASKS"]
