"""The input-grounded prompt family (data/prompts/grounded_*.jsonl), its loader and the traffic mix."""
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from specdec_core.data.prompts import (EXTRACT_KEYS, GROUNDED_CATEGORIES, GROUNDED_EVAL_PATH, GROUNDED_TASKS,
                                       GROUNDED_TRAIN_PATH, TASKS, encode, length_of, load_grounded, load_prompts,
                                       passage_of, traffic_mix)
from specdec_core.train.prompts import grams

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "data" / "prompts"
MIN_EVAL, MIN_TRAIN = 12, 24  # prompts per task
MAX_TOKENS = 300  # a first turn through the chat template, for the 135M target's short context


@pytest.fixture(scope="module")
def splits():
    return {"eval": load_grounded("eval"), "train": load_grounded("train")}


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


def _shared_runs(passages_a: list[str], passages_b: list[str], n: int = 8) -> set:
    """The ``n``-word runs (lower case, words = letters and digits) that occur in both lists."""
    return set().union(*(grams(p, n) for p in passages_a)) & set().union(*(grams(p, n) for p in passages_b))


# -- the files ----------------------------------------------------------------------------------
@pytest.mark.parametrize("split,minimum", [("eval", MIN_EVAL), ("train", MIN_TRAIN)])
def test_tasks_categories_and_counts(splits, split, minimum):
    ps = splits[split]
    per_task = Counter(p.task for p in ps)
    assert set(per_task) == set(GROUNDED_TASKS)
    assert min(per_task.values()) >= minimum, per_task
    for task, cats in GROUNDED_CATEGORIES.items():
        assert {p.category for p in ps if p.task == task} == set(cats), task
    assert len({p.id for p in ps}) == len(ps)


def test_load_prompts_reads_the_family_and_load_grounded_selects(splits):
    assert [p.id for p in load_prompts(GROUNDED_EVAL_PATH)] == [p.id for p in splits["eval"]]
    assert [p.id for p in load_prompts(path=GROUNDED_TRAIN_PATH)] == [p.id for p in splits["train"]]
    sel = load_grounded("eval", tasks=["quote", "revise"], per_task=2)
    assert [p.id for p in sel] == ([p.id for p in splits["eval"] if p.task == "quote"][:2]
                                   + [p.id for p in splits["eval"] if p.task == "revise"][:2])
    spelling = load_prompts(GROUNDED_TRAIN_PATH, categories="spelling")
    assert spelling and all(p.task == "edit" and p.category == "spelling" for p in spelling)
    assert all(p.task in TASKS for p in load_prompts())  # the eval mix is untouched


@pytest.mark.parametrize("split", ["eval", "train"])
def test_fields_and_passages(splits, split):
    """One passage per prompt, 60–150 words, none shared by two prompts of a split; labels by the length rule."""
    ps = splits[split]
    for p in ps:
        assert len(p.turns) == 1 and p.text == p.text.strip(), p.id
        assert p.length == length_of(p.text), p.id
        words = len(passage_of(p).split())
        assert 60 <= words <= 150, f"{p.id}: passage of {words} words"
    norm = Counter(_norm(passage_of(p)) for p in ps)
    assert max(norm.values()) == 1, [t[:60] for t, c in norm.items() if c > 1]


def test_extract_asks_for_one_schema(splits):
    """Every extract prompt, both splits, carries the same instruction naming the same keys."""
    heads = {p.text.split("\n\n")[0] for s in splits.values() for p in s if p.task == "extract"}
    assert len(heads) == 1
    (head,) = heads
    assert re.findall(r'"(\w+)"', head) == list(EXTRACT_KEYS)


def test_rename_targets_occur_in_their_passage(splits):
    for p in (p for s in splits.values() for p in s if p.category == "rename"):
        old, new = re.match(r"Rename (.+?) to (.+?) everywhere", p.text).groups()
        assert len(re.findall(r"(?<!\w)" + re.escape(old) + r"(?!\w)", passage_of(p))) >= 2, p.id
        assert new not in passage_of(p), p.id


def test_passage_of():
    assert passage_of("Fix this.\n\nA long paragraph of words.\n\nQuestion: why?") == "A long paragraph of words."
    assert passage_of("Only one block.") == "Only one block."


# -- disjointness --------------------------------------------------------------------------------
def test_train_and_eval_share_no_passage(splits):
    """No eval passage equals a train passage after normalization (case, punctuation, spacing), and no 8-word run
    of an eval passage occurs in a train passage. A planted copy and a planted run are caught (the scan's mutants)."""
    ev = [passage_of(p) for p in splits["eval"]]
    tr = [passage_of(p) for p in splits["train"]]
    assert not {_norm(t) for t in ev} & {_norm(t) for t in tr}
    assert _shared_runs(ev, tr) == set()
    copied = ev[3].upper().replace(".", " .")
    assert _norm(copied) in {_norm(t) for t in ev}
    planted = tr[:5] + ["Quux zorp: " + " ".join(ev[7].split()[10:18]) + " quux zorp."]
    assert len(_shared_runs(ev, planted)) == 1


def test_no_eval_passage_in_the_draft_training_prompts(splits):
    """The grounded eval passages share no 8-word run with any turn of the draft-training sets or the target's
    passages; the grounded train prompts share none with the six-task eval mix (like every training set)."""
    ev = set().union(*(grams(passage_of(p), 8) for p in splits["eval"]))
    for name in ("train.jsonl", "train_more.jsonl", "train_writing.jsonl", "train_wide.jsonl", "passages.jsonl"):
        path = PROMPTS / name
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line) if line.strip() else {}
            for text in row.get("turns", []) + ([row["text"]] if "text" in row else []):
                assert not grams(text, 8) & ev, f"{name}: {row.get('id')} shares a run with a grounded eval passage"
    mix = set().union(*(grams(t, 8) for p in load_prompts() for t in p.turns))
    assert not any(grams(p.text, 8) & mix for p in splits["train"])


# -- length under the chat template (as tests/test_prompts.py checks the eval mix) ----------------------


def test_encode_under_the_token_limit(splits, tokenizer):
    lengths = {p.id: len(encode(tokenizer, p)) for s in splits.values() for p in s}
    assert max(lengths.values()) < MAX_TOKENS, max(lengths.items(), key=lambda kv: kv[1])


# -- the traffic mix -------------------------------------------------------------------------------
CHAT = [f"c{i}" for i in range(30)]
GROUNDED = [f"g{i}" for i in range(30)]


@pytest.mark.parametrize("share,n,expected", [(0.0, 20, 0), (0.25, 20, 5), (0.5, 20, 10), (1.0, 20, 20),
                                              (0.5, 5, 3), (0.3, 10, 3), (0.1, 1, 0), (0.5, 1, 1)])
def test_traffic_mix_share(share, n, expected):
    mix = traffic_mix(CHAT, GROUNDED, share, n, seed=3)
    assert len(mix) == n and len(set(mix)) == n
    assert sum(x.startswith("g") for x in mix) == expected


def test_traffic_mix_seeding():
    a = traffic_mix(CHAT, GROUNDED, 0.4, 20, seed=1)
    assert a == traffic_mix(CHAT, GROUNDED, 0.4, 20, seed=1)
    assert a != traffic_mix(CHAT, GROUNDED, 0.4, 20, seed=2)
    assert a != sorted(a, key=lambda x: x[0])  # interleaved, not one block then the other
    # at one seed, a larger share draws more from the same grounded order
    small = [x for x in traffic_mix(CHAT, GROUNDED, 0.2, 20, seed=1) if x.startswith("g")]
    large = [x for x in a if x.startswith("g")]
    assert set(small) < set(large)


def test_traffic_mix_of_the_real_sets(splits):
    chat, grounded = load_prompts(), splits["eval"]
    mix = traffic_mix(chat, grounded, 0.5, 24, seed=0)
    assert sum(p.task in GROUNDED_TASKS for p in mix) == 12 and sum(p.task in TASKS for p in mix) == 12
    assert traffic_mix(chat, [], 0.0, 5, seed=0)  # an empty pool is fine when nothing is drawn from it


@pytest.mark.parametrize("kwargs,match", [
    (dict(grounded_share=-0.1), "grounded_share must be a number in \\[0, 1\\]"),
    (dict(grounded_share=1.5), "grounded_share"),
    (dict(grounded_share=math.nan), "grounded_share"),
    (dict(grounded_share="0.5"), "grounded_share"),
    (dict(grounded_share=True), "grounded_share"),
    (dict(n=0), "n must be an integer >= 1"),
    (dict(n=2.5), "n must be an integer"),
    (dict(n=True), "n must be an integer"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(n=40, grounded_share=0.9), "draws 36 from grounded_prompts, which holds 30"),
    (dict(n=40, grounded_share=0.1), "draws 36 from chat_prompts, which holds 30"),
])
def test_traffic_mix_refuses_bad_arguments(kwargs, match):
    args = dict(grounded_share=0.5, n=10, seed=0) | kwargs
    with pytest.raises(ValueError, match=match):
        traffic_mix(CHAT, GROUNDED, **args)


# -- loader errors -------------------------------------------------------------------------------------
def test_load_grounded_refuses_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="split must be 'eval' or 'train', got 'test'"):
        load_grounded("test")
    with pytest.raises(ValueError, match=r"unknown grounded task\(s\) \['qa'\]"):
        load_grounded(tasks=["qa"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(dict(id="x", task="edit", category="poem", turns=["Fix it."], length="short")) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{bad}:1") + ".*edit category 'poem'"):
        load_prompts(bad)
