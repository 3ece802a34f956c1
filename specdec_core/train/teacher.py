"""Teacher records: the target's own answers to training prompts and its law at every response position.

The one module that makes, caches and loads them; every draft recipe (the model draft, the block draft, the
feature experiment, the learning curve) reads its data through :func:`teacher_records` or :func:`teacher_data`.

- :func:`teacher_batch` answers a batch of prompts in one preallocated cache (greedy or sampled at temperature 1)
  and records, at every response position, the top-``k`` token ids (int32) and log-probabilities (float16) of the
  *full-vocabulary* softmax.
- :func:`generate_teacher_data` runs a :class:`TeacherPlan` in resumable shards under a folder named by the
  plan's hash (``data/train_cache/teacher-<hash>/``); :func:`load_teacher_data` reads a finished folder back.
- :func:`teacher_records` is a recipe's plan over one or several prompt files, split into training and held-out
  records by prompt id (:func:`specdec_core.data.prompts.is_val`); :func:`teacher_data` is the set a recipe names
  (``"first"``: the answers to ``train.jsonl``; ``"wide"``: the two stages of :func:`teacher_set` over the
  prompt files of :mod:`specdec_core.train.wide`).

A record is a dict: ``prompt`` int32 ``[S]``, ``response`` int32 ``[n]``, ``top_idx`` int32 ``[n, k]``,
``top_logp`` float16 ``[n, k]`` (row j = the target's law for ``response[j]`` given everything before
it), ``key`` (prompt id), ``mode`` (``"greedy"`` or ``"sample"``).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..data.prompts import encode, is_val, load_prompts
from ..models.hub import MANIFEST
from ..models.shipped import sha256_file
from ..paths import MODELS_DIR, TRAIN_CACHE, rel
from ..sampling import sample
from ..serving.cache import BatchLM
from . import wide
from .prompts import TRAIN_PATH as TRAIN_PROMPTS

CACHE = TRAIN_CACHE
EOS = PAD = 2  # <|im_end|>


def commit_all(fed: list[list[int]]) -> list[int]:
    """Each row's cache keeps every token it was fed (what decoding needs)."""
    return [len(f) for f in fed]


@torch.inference_mode()
def teacher_batch(target, prompts: list[torch.Tensor], max_new_tokens: int, temperature: float,
                  top_k_record: int, seed: int, eos_id: int, commit=commit_all, compact_below: float = 0.75) -> list[dict]:
    """Answer a batch of prompts and return one record per prompt (responses cut after EOS).

    Batched decoding in one preallocated cache (:class:`~specdec_core.serving.cache.BatchLM`, each row at its own
    length); once the rows still answering fall below ``compact_below`` of the rows in the cache, the finished
    ones are dropped from it (:meth:`~specdec_core.serving.cache.BatchKVCache.keep`), so long answers do not carry
    short ones. Greedy rows take the argmax; sampled rows draw from ``softmax(logits / temperature)`` with one
    generator seeded by ``seed``. The recorded law is the top-``top_k_record`` of the full-vocabulary softmax of
    the raw logits (temperature 1), whatever the decoding temperature. ``commit``: how many fed tokens each row's
    cache keeps (the tests pass a wrong one).
    """

    lm = BatchLM(target, len(prompts), max(len(p) for p in prompts) + max_new_tokens + 1)
    gen = torch.Generator(device=lm.device).manual_seed(seed)
    logits = lm.prefill([p.tolist() for p in prompts])[:, -1]
    rows = list(range(len(prompts)))  # cache row i holds prompt rows[i]
    live = list(rows)  # cache rows still answering
    out, idx, logp = ([[] for _ in prompts] for _ in range(3))
    for step in range(max_new_tokens):
        law = torch.log_softmax(logits[live].float(), -1)
        top = law.topk(top_k_record, dim=-1)
        nxt = law.argmax(-1) if temperature <= 0 else sample(torch.softmax(law / temperature, -1), gen)
        ids, lps = top.indices.to(torch.int32), top.values.to(torch.float16)
        for j, (i, t) in enumerate(zip(live, nxt.tolist())):
            out[rows[i]].append(t)
            idx[rows[i]].append(ids[j])
            logp[rows[i]].append(lps[j])
        live = [i for i in live if out[rows[i]][-1] != eos_id]
        if not live or step == max_new_tokens - 1:
            break
        if len(live) < compact_below * len(rows):  # drop finished rows: later passes cost only what answers
            lm.cache.select_rows(torch.tensor(live))
            rows, live = [rows[i] for i in live], list(range(len(live)))
        going = set(live)
        fed = [[out[r][-1]] if i in going else [] for i, r in enumerate(rows)]
        logits = lm.forward(fed, commit=commit(fed))[:, -1]
    return [dict(prompt=p.to(torch.int32), response=torch.tensor(o, dtype=torch.int32),
                 top_idx=torch.stack(i), top_logp=torch.stack(l)) for p, o, i, l in zip(prompts, out, idx, logp)]


@dataclass(frozen=True)
class TeacherPlan:
    """What :func:`generate_teacher_data` produces; its hash names the cache folder."""

    prompts_sha256: str
    target_sha256: str
    modes: tuple  # ((mode, temperature, n_prompts), ...) e.g. (("greedy", 0.0, 2400), ("sample", 1.0, 600))
    max_new_tokens: int = 128
    top_k_record: int = 20
    batch_size: int = 32
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def plan_batches(plan: TeacherPlan, keys: list[str], lengths: list[int]) -> list[dict]:
    """Deterministic batches: for each mode, a seeded choice of prompts sorted by length (less padding)."""
    rng = random.Random(plan.seed)
    order = list(range(len(keys)))
    rng.shuffle(order)
    batches, start = [], 0
    for mode, temperature, n in plan.modes:
        chosen = sorted(order[start:start + n], key=lambda i: (lengths[i], keys[i]))
        start += n  # each mode answers different prompts (more variety than two answers to one prompt)
        for b in range(0, len(chosen), plan.batch_size):
            batches.append(dict(mode=mode, temperature=temperature, items=chosen[b:b + plan.batch_size]))
    if start > len(keys):
        raise ValueError(f"the plan asks for {start} prompts but the prompt set has {len(keys)}")
    for j, b in enumerate(batches):
        b["name"], b["seed"] = f"shard_{j:04d}", plan.seed * 100003 + j
    return batches


def generate_teacher_data(target, prompt_ids: list[torch.Tensor], keys: list[str], plan: TeacherPlan,
                          cache_dir: Path, eos_id: int, progress: bool = True) -> Path:
    """Run (or resume) the plan; one ``.pt`` shard per batch, written atomically. Returns the folder.

    A shard that exists is never recomputed, so an interrupted run continues where it stopped.
    """

    folder = Path(cache_dir) / f"teacher-{plan.key()}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(asdict(plan), indent=1))
    batches = plan_batches(plan, keys, [len(p) for p in prompt_ids])
    todo = [b for b in batches if not (folder / f"{b['name']}.pt").exists()]
    cost = lambda b: sum(len(prompt_ids[i]) for i in b["items"]) / 4 + len(b["items"]) * plan.max_new_tokens
    bar = tqdm(total=int(sum(cost(b) for b in batches)), initial=int(sum(cost(b) for b in batches if b not in todo)),
               desc="teacher data", unit="tok", disable=not progress, smoothing=0.1)
    for b in todo:
        recs = teacher_batch(target, [prompt_ids[i] for i in b["items"]], plan.max_new_tokens, b["temperature"],
                             plan.top_k_record, b["seed"], eos_id)
        for r, i in zip(recs, b["items"]):
            r["key"], r["mode"] = keys[i], b["mode"]
        tmp = folder / f"{b['name']}.pt.tmp"
        torch.save(recs, tmp)
        os.replace(tmp, folder / f"{b['name']}.pt")
        bar.update(int(cost(b)))
    bar.close()
    (folder / "DONE").write_text(f"{len(batches)} shards\n")
    return folder


def load_teacher_data(folder: Path) -> list[dict]:
    """All records of a finished teacher-data folder, in shard order."""
    folder = Path(folder)
    if not (folder / "DONE").exists():
        raise RuntimeError(f"teacher data in {folder} is incomplete: run generate_teacher_data to finish it")
    recs = []
    for f in sorted(folder.glob("shard_*.pt")):
        recs += torch.load(f, weights_only=True)
    return recs


def teacher_records(pair, recipe, progress=True, prompt_file: Path | list[Path] = TRAIN_PROMPTS,
                    counts: tuple[int, int] | None = None,
                    max_new_tokens: int | None = None) -> tuple[list[dict], list[dict], dict]:
    """Generate (or load) the teacher data; returns (train records, val records, info). ``prompt_file`` (one file
    or several, read in order), ``counts`` (prompts answered greedily, at temperature 1) and ``max_new_tokens``:
    by default the recipe's."""
    files = [Path(prompt_file)] if isinstance(prompt_file, (str, Path)) else [Path(f) for f in prompt_file]
    prompts = [p for f in files for p in load_prompts(f)]
    n_greedy, n_sample = counts or (recipe.greedy_prompts, recipe.sample_prompts)
    target_sha = json.loads((MODELS_DIR / "smollm2-135m" / MANIFEST).read_text())["model.safetensors"]
    digest = (sha256_file(files[0]) if len(files) == 1 else
              hashlib.sha256("".join(sha256_file(f) for f in files).encode()).hexdigest())
    plan = TeacherPlan(
        prompts_sha256=digest, target_sha256=target_sha, modes=(("greedy", 0.0, n_greedy), ("sample", 1.0, n_sample)),
        max_new_tokens=max_new_tokens or recipe.max_new_tokens, top_k_record=recipe.top_k_record,
        batch_size=recipe.gen_batch, seed=recipe.seed)
    t = time.perf_counter()
    folder = generate_teacher_data(pair.target, [encode(pair, p) for p in prompts], [p.id for p in prompts],
                                           plan, CACHE, eos_id=EOS, progress=progress)
    recs = load_teacher_data(folder)
    train = [r for r in recs if not is_val(r["key"], recipe.val_frac)]
    val = [r for r in recs if is_val(r["key"], recipe.val_frac)]
    info = dict(teacher_folder=str(rel(folder)), teacher_seconds=round(time.perf_counter() - t, 1),
                train_records=len(train), val_records=len(val),
                train_tokens=sum(r["response"].numel() for r in train), plan=asdict(plan))
    return train, val, info


TEACHER_SETS = ("first", "wide")


def teacher_data(pair, recipe, progress=True) -> tuple[list[dict], list[dict], dict]:
    """The teacher data ``recipe.teacher`` names: (train records, held-out records, info). ``info`` has
    :func:`teacher_records`' keys; for the wide set ``plan`` is its second stage's and ``stages`` holds both."""
    if recipe.teacher == "first":
        return teacher_records(pair, recipe, progress)
    if recipe.teacher != "wide":
        raise ValueError(f"unknown teacher set {recipe.teacher!r}: one of {TEACHER_SETS}")
    train, val, infos = teacher_set(pair, recipe, progress)
    keep = ("teacher_folder", "teacher_seconds", "train_records", "val_records", "train_tokens", "plan")
    info = dict(teacher_folder=[i["teacher_folder"] for i in infos.values()],
                teacher_seconds=round(sum(i["teacher_seconds"] for i in infos.values()), 1),
                train_records=len(train), val_records=len(val),
                train_tokens=sum(r["response"].numel() for r in train), plan=infos["answers"]["plan"],
                stages={k: {f: i[f] for f in keep} for k, i in infos.items()})
    return train, val, info


def stage(pair, recipe, files, max_new_tokens: int, batch: int = wide.BATCH, sample_frac: float = wide.SAMPLE_FRAC,
          limit: int | None = None, progress: bool = True) -> tuple[list[dict], list[dict], dict]:
    """The target's answers to the prompts of ``files`` (all of them, or the first ``limit`` of a seeded
    shuffle), a ``sample_frac`` share at temperature 1: generated or loaded from the cache, resumable
    (:func:`teacher_records`: train records, held-out records, info). ``recipe``: the draft recipe
    whose seed, top-k and held-out share the records take (:class:`specdec_core.train.drafts.Recipe`)."""
    n = limit or sum(len(load_prompts(f)) for f in files)
    n_sample = round(n * sample_frac)
    return teacher_records(pair, replace(recipe, gen_batch=batch), progress, prompt_file=list(files),
                                  counts=(n - n_sample, n_sample), max_new_tokens=max_new_tokens)


def teacher_set(pair, recipe, progress: bool = True) -> tuple[list[dict], list[dict], dict]:
    """Both stages with the committed prompt files and the plan above: (train, held-out, info per stage)."""
    missing = [f for f in wide.PROMPT_FILES if not f.exists()]
    if missing:
        raise FileNotFoundError(f"{missing[0]} is missing: python scripts/make_teacher_data.py writes the wide set")
    t1, v1, i1 = stage(pair, recipe, [wide.WRITING_PATH], wide.WRITING_TOKENS, progress=progress)
    t2, v2, i2 = stage(pair, recipe, wide.ANSWER_FILES, wide.ANSWER_TOKENS, progress=progress)
    return t1 + t2, v1 + v2, dict(writing=i1, answers=i2)
