"""The shipped evaluation mix and its loader (specdec_core.data.prompts)."""
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

from specdec_core.data.prompts import (DEFAULT_PATH, LONG_CHARS, MT_CATEGORIES, TASKS, Prompt, encode, length_of,
                                  load_prompts)

ROOT = Path(__file__).resolve().parent.parent
SPEC_BENCH_SAMPLE = Path(__file__).parent / "data" / "spec_bench_question_sample.jsonl"
TRAIN = ROOT / "data" / "prompts" / "train.jsonl"


@pytest.fixture(scope="module")
def mix():
    return load_prompts()


# -- the shipped mix --------------------------------------------------------------------------
def test_every_task_has_ten_prompts_short_and_long(mix):
    per_task = Counter(p.task for p in mix)
    assert set(per_task) == set(TASKS)
    for task in TASKS:
        assert per_task[task] >= 10, f"{task}: only {per_task[task]} prompts"
        assert {p.length for p in mix if p.task == task} == {"short", "long"}, task


def test_ids_unique(mix):
    ids = [p.id for p in mix]
    assert len(ids) == len(set(ids))


def test_multi_turn_covers_every_category(mix):
    cats = Counter(p.category for p in mix if p.task == "multi_turn")
    assert set(cats) == set(MT_CATEGORIES)
    assert min(cats.values()) >= 2, cats


def test_fields_consistent(mix):
    for p in mix:
        if p.task != "multi_turn":
            assert p.category == p.task, p.id
        assert p.length == length_of(p.text), f"{p.id}: length label disagrees with the {LONG_CHARS}-char rule"
        assert p.text == p.text.strip(), p.id


def test_summarization_sources_are_passages(mix):
    long_words = [len(p.text.split()) for p in mix if p.task == "summarization" and p.length == "long"]
    assert long_words and all(150 <= n <= 400 for n in long_words), long_words


def test_selection_and_per_task_are_deterministic(mix):
    sel = load_prompts(tasks=["qa", "rag"], per_task=3)
    assert [p.id for p in sel] == [p.id for p in mix if p.task == "qa"][:3] + [p.id for p in mix if p.task == "rag"][:3]
    assert [p.id for p in sel] == [p.id for p in load_prompts(tasks=("qa", "rag"), per_task=3)]
    coding = load_prompts(categories="coding")
    assert coding and all(p.category == "coding" and p.task == "multi_turn" for p in coding)


# -- the Spec-Bench reader ----------------------------------------------------------------------
def test_spec_bench_reader():
    ps = load_prompts(SPEC_BENCH_SAMPLE)
    assert len(ps) == 13
    assert all(isinstance(p, Prompt) for p in ps)
    assert {p.task for p in ps} == set(TASKS)
    by_cat = {p.category: p for p in ps}
    assert all(by_cat[c].task == "multi_turn" for c in MT_CATEGORIES)
    assert by_cat["math_reasoning"].task == "math_reasoning" and by_cat["rag"].task == "rag"
    assert by_cat["writing"].id == "1" and len(by_cat["writing"].turns) == 2
    assert by_cat["summarization"].length == "long" and by_cat["qa"].length == "short"
    assert [p.id for p in load_prompts(SPEC_BENCH_SAMPLE, tasks="multi_turn", per_task=2)] == ["1", "2"]


# -- errors -------------------------------------------------------------------------------------
def _write(tmp_path, lines):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"id": "a", "task": "qa", "category": "qa", "turns": ["What is 2 + 2?"], "length": "short"})


def test_malformed_line_names_file_and_line(tmp_path):
    path = _write(tmp_path, [GOOD, '{"id": "b", "task": "qa",'])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2") + ".*not valid JSON"):
        load_prompts(path)
    path = _write(tmp_path, [GOOD, json.dumps({"id": "b", "task": "qa", "category": "qa", "turns": [],
                                               "length": "short"})])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2") + ".*turns"):
        load_prompts(path)


def test_unknown_task(tmp_path):
    bad = json.dumps({"id": "b", "task": "poetry", "category": "poetry", "turns": ["Hi"], "length": "short"})
    path = _write(tmp_path, [GOOD, bad])
    with pytest.raises(ValueError, match=re.escape(f"{path}:2") + ".*unknown task 'poetry'"):
        load_prompts(path)
    with pytest.raises(ValueError, match="unknown task"):
        load_prompts(tasks=["poetry"])
    bad_sb = json.dumps({"question_id": 7, "category": "poetry", "turns": ["Hi"]})
    with pytest.raises(ValueError, match="unknown Spec-Bench category 'poetry'"):
        load_prompts(_write(tmp_path, [bad_sb]))


def test_empty_selection_and_duplicates(tmp_path):
    path = _write(tmp_path, [GOOD])
    with pytest.raises(ValueError, match="no prompts match"):
        load_prompts(path, tasks=["rag"])
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        load_prompts(_write(tmp_path, [GOOD, GOOD]))


# -- encoding -----------------------------------------------------------------------------------


def test_encode_under_600_tokens(mix, tokenizer):
    lengths = {}
    for p in mix:
        ids = encode(tokenizer, p)
        assert ids.dtype == torch.long and ids.dim() == 1
        lengths[p.id] = len(ids)
    assert max(lengths.values()) < 600, max(lengths.items(), key=lambda kv: kv[1])
    p = mix[0]
    text = tokenizer.decode(encode(tokenizer, p))
    assert p.turns[0] in text and (len(p.turns) < 2 or p.turns[1] not in text)  # first turn only
    assert text.rstrip().endswith("assistant")  # generation prompt appended


def test_encode_with_pair_matches_tokenizer(tokenizer):
    from specdec_core.models import Pair

    p = load_prompts(tasks="qa", per_task=1)[0]
    assert torch.equal(encode(Pair(target=None, tokenizer=tokenizer), p), encode(tokenizer, p))


# -- no leakage into the draft-training prompts ---------------------------------------------------
def _train_texts(path: Path) -> list[str]:
    texts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        obj = json.loads(line)
        if isinstance(obj, str):
            texts.append(obj)
        elif "turns" in obj:
            texts.extend(t for t in obj["turns"] if isinstance(t, str))
        elif "messages" in obj:
            texts.extend(m.get("content", "") for m in obj["messages"] if isinstance(m, dict))
        else:
            texts.extend(obj[k] for k in ("prompt", "text", "instruction", "question") if isinstance(obj.get(k), str))
    return texts


def _shingles(text: str, n: int = 8) -> set:
    from specdec_core.train.prompts import grams

    return grams(text, n)


@pytest.mark.skipif(not TRAIN.exists(), reason="data/prompts/train.jsonl not built")
def test_no_eval_prompt_in_train_set(mix):
    train = _train_texts(TRAIN)
    assert train, f"{TRAIN}: no prompt texts found"
    exact = {t.strip().lower() for t in train}
    index: dict = {}  # shingle -> train indices
    train_sh = [_shingles(t) for t in train]
    for i, sh in enumerate(train_sh):
        for s in sh:
            index.setdefault(s, set()).add(i)
    for p in mix:
        assert p.text.strip().lower() not in exact, f"{p.id} appears verbatim in {TRAIN}"
        sh = _shingles(p.text)
        if not sh:
            continue
        hits = Counter(i for s in sh for i in index.get(s, ()))
        for i, shared in hits.items():
            overlap = shared / min(len(sh), len(train_sh[i]))
            assert overlap < 0.5, f"{p.id} shares {overlap:.0%} of its 8-word shingles with train prompt #{i}"


TRAIN_FILES = [ROOT / "data" / "prompts" / n
               for n in ("train.jsonl", "train_more.jsonl", "train_writing.jsonl", "train_wide.jsonl")]
HOW = {"train.jsonl": "python scripts/make_train_prompts.py", "train_more.jsonl": "python scripts/make_train_prompts.py --more",
       "train_writing.jsonl": "python scripts/make_teacher_data.py --stage writing",
       "train_wide.jsonl": "python scripts/make_teacher_data.py --stage writing"}


def _shared_eval_runs(path: Path, n: int = 8) -> list[tuple[str, tuple]]:
    """(train prompt id, an n-word run it shares with an eval prompt) for every turn of every training prompt."""
    from specdec_core.train.prompts import eval_grams, grams

    ev = eval_grams(DEFAULT_PATH, n)
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            for t in row["turns"]:
                out += [(row["id"], g) for g in grams(t, n) & ev][:1]
    return out


@pytest.mark.parametrize("path", TRAIN_FILES, ids=lambda p: p.name)
def test_no_eight_word_run_of_an_eval_prompt_in_training_prompts(path, tmp_path):
    """Strict disjointness: no 8-word run (lower case, words = letters and digits) of any eval turn occurs in any
    turn of the training prompts. The same scan is shown to catch one planted run (its mutant)."""
    if not path.exists():
        pytest.skip(f"{path.name} not built ({HOW[path.name]})")
    assert _shared_eval_runs(path) == []
    mix_text = load_prompts()[5].text
    planted = tmp_path / "planted.jsonl"
    planted.write_text(json.dumps(dict(id="x", turns=["Please help: " + " ".join(mix_text.split()[:8])])) + "\n")
    assert len(_shared_eval_runs(planted)) == 1


def test_more_prompts_cover_the_thin_spots():
    """The second set holds translation into English from each eval language and numbered retrieval passages,
    every task of the mix, and no first-set prompt."""
    path = TRAIN_FILES[1]
    if not path.exists():
        pytest.skip("train_more.jsonl not built")
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    assert {r["task"] for r in rows} == set(TASKS)
    into_en = [r for r in rows if r["task"] == "translation" and re.search(r"[Ii]nto English|in English", r["turns"][0])]
    for lang in ("German", "French", "Spanish"):
        assert any(lang in r["turns"][0] for r in into_en), f"no {lang} → English prompt"
    assert sum("Passage 1:" in r["turns"][0] for r in rows if r["task"] == "rag") >= 100
    first = {json.loads(x)["turns"][0] for x in TRAIN_FILES[0].read_text(encoding="utf-8").splitlines() if x.strip()}
    assert not first & {r["turns"][0] for r in rows}
