"""specdec_core: speculative and parallel decoding on Hugging Face causal LMs, readable and exact.

    import specdec_core as sd
    pair = sd.load_pair("smollm2-135m")
    res = sd.generate(pair.target, ids, drafter=pair.drafter, method="linear", k=4)

Notation: p = target law, q = draft law.
"""
from . import blas

blas.ensure_default()  # before torch's first matmul: MKL's few-row kernels (see specdec_core.blas)

from . import prompts, sampling, verify  # noqa: E402
from .decode import METHODS, generate  # noqa: E402
from .drafters import Draft, Drafter, ModelDrafter, NGramDrafter
from .kvcache import KVCache
from .models import CorruptModelCache, Pair, load_pair, toy_pair
from .parallel import BlockDrafter
from .prompts import TASKS, Prompt, load_prompts
from .sampling import SamplingParams, process_logits
from .stats import Result

__all__ = ["generate", "load_pair", "toy_pair", "Pair", "Result", "KVCache", "Drafter", "Draft",
           "ModelDrafter", "NGramDrafter", "BlockDrafter", "SamplingParams", "process_logits", "sampling", "verify",
           "CorruptModelCache", "METHODS", "load_prompts", "Prompt", "TASKS"]
