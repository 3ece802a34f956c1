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
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.hub import Pair
from ..paths import PROMPTS_DIR

DEFAULT_PATH = PROMPTS_DIR / "eval.jsonl"
TRAIN_PATH = PROMPTS_DIR / "train.jsonl"  # the training prompts (disjoint from the eval mix; :mod:`specdec_core.train.prompts`)
VAL_FRAC = 0.05  # the share of training prompts held out: where hyperparameters, K and θ are chosen

TASKS = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# Spec-Bench category -> task
SPEC_BENCH_TASK = {**{c: "multi_turn" for c in MT_CATEGORIES}, **{t: t for t in TASKS[1:]}}
LENGTHS = ("short", "long")
LONG_CHARS = 300  # a first turn of at least this many characters (~70 SmolLM2 tokens) is "long"


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
    if obj["task"] not in TASKS:
        raise ValueError(f"{where}: unknown task {obj['task']!r}; expected one of {list(TASKS)}")
    if obj["length"] not in LENGTHS:
        raise ValueError(f"{where}: 'length' must be one of {list(LENGTHS)}, got {obj['length']!r}")
    if obj["task"] == "multi_turn" and obj["category"] not in MT_CATEGORIES:
        raise ValueError(f"{where}: multi_turn category {obj['category']!r} is not one of {list(MT_CATEGORIES)}")
    return Prompt(id=str(obj["id"]), task=obj["task"], category=str(obj["category"]),
                  turns=list(turns), length=obj["length"])


def _check_names(kind: str, given, known) -> None:
    unknown = [x for x in given if x not in known]
    if unknown:
        raise ValueError(f"unknown {kind} {unknown}; expected some of {list(known)}")


def load_prompts(path: str | Path | None = None, tasks=None, categories=None,
                 per_task: int | None = None) -> list[Prompt]:
    """Read prompts from ``path`` (default: the shipped eval mix), in file order.

    ``tasks`` / ``categories``: keep only these (names are checked). ``per_task``: the first N
    prompts of each task, in file order (deterministic). Raises ``ValueError`` naming the file and
    line for a malformed line, an unknown task or category, a duplicate id, or an empty selection.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    if tasks is not None:
        tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        _check_names("task(s)", tasks, TASKS)
    if categories is not None:
        categories = [categories] if isinstance(categories, str) else list(categories)
        _check_names("category(ies)", categories, list(SPEC_BENCH_TASK))
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

    chosen, count = [], dict.fromkeys(TASKS, 0)
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
