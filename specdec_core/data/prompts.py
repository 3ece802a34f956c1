"""Evaluation prompts: the project's own Spec-Bench-shaped mix, or Spec-Bench's ``question.jsonl``.

    from specdec_core import load_prompts
    from specdec_core.data.prompts import encode
    prompts = load_prompts(tasks=["qa", "rag"], per_task=5)
    ids = encode(pair, prompts[0])                 # LongTensor [S], chat template applied

The shipped mix (``data/prompts/eval.jsonl``) has one JSON object a line::

    {"id": str, "task": str, "category": str, "turns": [str, ...], "length": "short" | "long"}

covering Spec-Bench's six tasks (:data:`TASKS`). ``multi_turn`` prompts carry an MT-bench category
(:data:`MT_CATEGORIES`) and may hold a second turn, but **decoding uses the first turn only**
(:func:`encode`), as the speed measurements in the book are single-turn. Every other task's
category is the task name.

A Spec-Bench ``question.jsonl`` (``{"question_id", "category", "turns"}``) is read too: its
category decides the task (:data:`SPEC_BENCH_TASK`) and ``length`` is derived from the first
turn's character count (:func:`length_of`). The file kind is detected per line by its keys.

The input-grounded family (``data/prompts/grounded_eval.jsonl`` and ``grounded_train.jsonl``, same
format, disjoint passages) holds requests whose answer repeats their input (:data:`GROUNDED_TASKS`,
categories in :data:`GROUNDED_CATEGORIES`): :func:`load_grounded` reads a split, :func:`passage_of`
gives the text a prompt is built on, and :func:`traffic_mix` mixes it with chat prompts at a given share.
"""
from __future__ import annotations

import json
import math
import numbers
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.hub import Pair
from ..paths import PROMPTS_DIR

DEFAULT_PATH = PROMPTS_DIR / "eval.jsonl"
TRAIN_PATH = PROMPTS_DIR / "train.jsonl"  # the training prompts (disjoint from the eval mix; :mod:`specdec_core.train.prompts`)
VAL_FRAC = 0.05  # the share of training prompts held out: where hyperparameters, K and θ are chosen
GROUNDED_EVAL_PATH = PROMPTS_DIR / "grounded_eval.jsonl"
GROUNDED_TRAIN_PATH = PROMPTS_DIR / "grounded_train.jsonl"  # where settings for the family are chosen

TASKS = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# Spec-Bench category -> task
SPEC_BENCH_TASK = {**{c: "multi_turn" for c in MT_CATEGORIES}, **{t: t for t in TASKS[1:]}}
LENGTHS = ("short", "long")
LONG_CHARS = 300  # a first turn of at least this many characters (~70 SmolLM2 tokens) is "long"

# The input-grounded family: paragraph edits, answers quoting a passage, extraction to one JSON schema, revisions
# of an earlier answer. The category names how the answer reuses the input.
GROUNDED_TASKS = ("edit", "quote", "extract", "revise")
GROUNDED_CATEGORIES = {"edit": ("spelling", "rename", "reformat"), "quote": ("answer", "copy", "summary"),
                       "extract": ("event", "product"), "revise": ("shorten", "change", "add", "remove")}
EXTRACT_KEYS = ("name", "date", "place", "price")  # the one schema every ``extract`` prompt asks for
ALL_TASKS = TASKS + GROUNDED_TASKS


@dataclass
class Prompt:
    """One evaluation prompt. ``turns[0]`` is what gets decoded."""

    id: str
    task: str
    category: str
    turns: list[str] = field(default_factory=list)
    length: str = "short"

    @property
    def text(self) -> str:
        """The first user turn (the one decoded)."""
        return self.turns[0]


def length_of(text: str) -> str:
    """``"long"`` if ``text`` has at least :data:`LONG_CHARS` characters, else ``"short"``."""
    return "long" if len(text) >= LONG_CHARS else "short"


def _parse_line(obj, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    turns = obj.get("turns")
    if not (isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)):
        raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    if "question_id" in obj:  # Spec-Bench format
        category = obj.get("category")
        if category not in SPEC_BENCH_TASK:
            raise ValueError(f"{where}: unknown Spec-Bench category {category!r}; "
                             f"expected one of {sorted(SPEC_BENCH_TASK)}")
        return Prompt(id=str(obj["question_id"]), task=SPEC_BENCH_TASK[category], category=category,
                      turns=list(turns), length=length_of(turns[0]))
    missing = [k for k in ("id", "task", "category", "length") if k not in obj]
    if missing:
        raise ValueError(f"{where}: missing field(s) {missing} (neither the eval-mix nor the Spec-Bench format)")
    if obj["task"] not in ALL_TASKS:
        raise ValueError(f"{where}: unknown task {obj['task']!r}; expected one of {list(ALL_TASKS)}")
    if obj["length"] not in LENGTHS:
        raise ValueError(f"{where}: 'length' must be one of {list(LENGTHS)}, got {obj['length']!r}")
    if obj["task"] == "multi_turn" and obj["category"] not in MT_CATEGORIES:
        raise ValueError(f"{where}: multi_turn category {obj['category']!r} is not one of {list(MT_CATEGORIES)}")
    known = GROUNDED_CATEGORIES.get(obj["task"])
    if known is not None and obj["category"] not in known:
        raise ValueError(f"{where}: {obj['task']} category {obj['category']!r} is not one of {list(known)}")
    return Prompt(id=str(obj["id"]), task=obj["task"], category=str(obj["category"]),
                  turns=list(turns), length=obj["length"])


def _check_names(kind: str, given, known) -> None:
    unknown = [x for x in given if x not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; expected some of {list(known)}")


def load_prompts(path: str | Path | None = None, tasks=None, categories=None,
                 per_task: int | None = None) -> list[Prompt]:
    """Read prompts from ``path`` (default: the shipped eval mix; the input-grounded family is read the same way,
    or through :func:`load_grounded`), in file order.

    ``tasks`` / ``categories``: keep only these (names are checked). ``per_task``: the first N
    prompts of each task, in file order (deterministic). Raises ``ValueError`` naming the file and
    line for a malformed line, an unknown task or category, a duplicate id, or an empty selection.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    if tasks is not None:
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        _check_names("task(s)", tasks, ALL_TASKS)
    if categories is not None:
        categories = [categories] if isinstance(categories, str) else list(categories)
        _check_names("category(ies)", categories,
                     list(SPEC_BENCH_TASK) + [c for cs in GROUNDED_CATEGORIES.values() for c in cs])
    if per_task is not None and per_task < 1:
        raise ValueError(f"per_task must be a positive integer, got {per_task}")

    prompts, seen = [], {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from e
            p = _parse_line(obj, where)
            if p.id in seen:
                raise ValueError(f"{where}: duplicate id {p.id!r} (first on line {seen[p.id]})")
            seen[p.id] = lineno
            prompts.append(p)

    chosen, count = [], dict.fromkeys(ALL_TASKS, 0)
    for p in prompts:
        if tasks is not None and p.task not in tasks:
            continue
        if categories is not None and p.category not in categories:
            continue
        if per_task is not None and count[p.task] >= per_task:
            continue
        count[p.task] += 1
        chosen.append(p)
    if not chosen:
        raise ValueError(f"{path}: no prompts match tasks={tasks} categories={categories}")
    return chosen


def load_grounded(split: str = "eval", tasks=None, per_task: int | None = None) -> list[Prompt]:
    """The input-grounded family's ``"eval"`` or ``"train"`` split (no passage shared between them), in file order.

    ``tasks``: some of :data:`GROUNDED_TASKS`; ``per_task``: the first N of each, as in :func:`load_prompts`.
    """
    paths = {"eval": GROUNDED_EVAL_PATH, "train": GROUNDED_TRAIN_PATH}
    if split not in paths:
        raise ValueError(f"split must be 'eval' or 'train', got {split!r}")
    if tasks is not None:
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        _check_names("grounded task(s)", tasks, GROUNDED_TASKS)
    return load_prompts(paths[split], tasks=tasks, per_task=per_task)


def passage_of(prompt: Prompt | str) -> str:
    """The text a grounded prompt is built on: the longest blank-line-separated block of its first turn (the
    paragraph to edit, the passage to quote, the notice to extract from, the earlier answer to revise)."""
    text = prompt.turns[0] if isinstance(prompt, Prompt) else prompt
    return max((b.strip() for b in text.split("\n\n")), key=len)


def _pick(pool: list, k: int, seed: str) -> list:
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)  # a string seed is hashed the same way in every process
    return [pool[i] for i in order[:k]]


def traffic_mix(chat_prompts, grounded_prompts, grounded_share: float, n: int, seed: int = 0) -> list:
    """``n`` requests, ``grounded_share × n`` of them (to the nearest integer, halves up) from
    ``grounded_prompts`` and the rest from ``chat_prompts``, in a seeded order.

    Each pool is drawn without replacement in an order that depends on ``seed`` alone, so at one seed the
    grounded requests at a smaller share are the first of those at a larger one. Items come back as given
    (``Prompt`` objects or ``(meta, ids)`` pairs). Raises ``ValueError`` for a share outside [0, 1], ``n`` < 1,
    a non-integer seed, or a pool smaller than its draw.
    """
    if isinstance(grounded_share, bool) or not isinstance(grounded_share, numbers.Real) \
            or not 0 <= grounded_share <= 1:  # NaN fails the comparison too
        raise ValueError(f"grounded_share must be a number in [0, 1], got {grounded_share!r}")
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    chat, grounded = list(chat_prompts), list(grounded_prompts)
    n = int(n)
    n_grounded = math.floor(grounded_share * n + 0.5)
    for name, pool, k in (("chat_prompts", chat, n - n_grounded), ("grounded_prompts", grounded, n_grounded)):
        if k > len(pool):
            raise ValueError(f"n={n} at grounded_share={grounded_share} draws {k} from {name}, which holds "
                             f"{len(pool)} (drawn without replacement)")
    mixed = _pick(chat, n - n_grounded, f"chat-{int(seed)}") + _pick(grounded, n_grounded, f"grounded-{int(seed)}")
    random.Random(int(seed)).shuffle(mixed)
    return mixed


def encode(pair_or_tokenizer, prompt: Prompt | str) -> torch.Tensor:
    """The first turn through the chat template with a generation prompt → LongTensor ``[S]``.

    ``pair_or_tokenizer``: a :class:`~specdec_core.models.Pair` (uses ``Pair.encode_chat``) or a
    Hugging Face tokenizer with a chat template.
    """
    text = prompt.turns[0] if isinstance(prompt, Prompt) else prompt
    if isinstance(pair_or_tokenizer, Pair):
        if pair_or_tokenizer.tokenizer is None:
            raise ValueError(f"pair {pair_or_tokenizer.name!r} has no tokenizer (toy pairs take token ids)")
        return pair_or_tokenizer.encode_chat(text)
    tok = pair_or_tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  return_tensors="pt")
    ids = ids[0] if ids.dim() == 2 else ids
    return ids.long()


# -- the held-out training prompts: where settings are chosen before the eval mix is read ---------------
def is_val(prompt_id: str, frac: float = VAL_FRAC) -> bool:
    """Deterministic held-out split by a hash of the prompt id."""
    return zlib.crc32(prompt_id.encode()) % 10_000 < frac * 10_000


def held_out_prompts(frac: float = VAL_FRAC) -> list[Prompt]:
    """The training prompts the draft recipe holds out (``val_frac``): where hyperparameters, K and θ are chosen."""
    return [p for p in load_prompts(TRAIN_PATH) if is_val(p.id, frac)]


def sweep_prompts(pair, n: int) -> list[tuple[dict, torch.Tensor]]:
    """``n`` held-out training prompts, round-robin over tasks, encoded as ``(meta, ids)`` pairs for
    :func:`specdec_core.study.bench.run_interleaved`."""
    by_task = {}
    for p in held_out_prompts():
        by_task.setdefault(p.task, []).append(p)
    order = [ps[i] for i in range(max(map(len, by_task.values()))) for ps in by_task.values() if i < len(ps)]
    return [(dict(id=p.id, task=p.task), encode(pair, p)) for p in order[:n]]
