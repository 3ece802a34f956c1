"""Prompts over passages the target writes (specdec_core.train.wide): cleaning its answers, building the prompts.

The builders are deterministic in their seeds and never emit a prompt sharing an 8-word run with the eval mix,
even when a passage carries one (a passage planted from an eval prompt's text is the mutant: no prompt over it
may keep the run).
"""
import json
import random
import re

import pytest

from specdec_core.data.prompts import TASKS, load_prompts
from specdec_core.train import wide
from specdec_core.train.prompts import eval_grams, grams, sentence


def _text(seed, n=8):
    """``n`` sentences of 12 words drawn from the training tables' vocabulary: no 6-word run repeats."""
    rng = random.Random(seed)
    words = sorted({w for i in range(300) for w in re.findall(r"[a-z]+", sentence(random.Random(i)).lower())})
    return " ".join(" ".join(rng.choice(words) for _ in range(12)).capitalize() + "." for _ in range(n))


def _passage(i, topic="tides", sentences=8):
    return dict(id=f"write-{i:05d}", topic=topic, genre="report", text=_text(i, sentences))


def test_clean_passage_cuts_to_its_last_sentence_and_drops_headings():
    text = "# A title\n\n**Tides** rise twice a day. " + _text(0) + " And then"
    out = wide.clean_passage(text)
    assert out == "Tides rise twice a day. " + _text(0)
    assert "#" not in out and "**" not in out


@pytest.mark.parametrize("text, why", [
    ("Too short to keep. Only a few words here.", "short"),
    ("no sentence end at all " * 30, "unfinished"),
    ("The same six words come again. " * 12, "a loop from its second sentence on"),
])
def test_clean_passage_refuses(text, why):
    assert wide.clean_passage(text) is None, why


def test_a_passage_is_cut_where_it_starts_to_repeat_itself():
    head = _text(3, 10)
    loop = " It is the key to creating a brand that people remember."
    out = wide.clean_passage(head + loop + " Typography is art." + loop + loop)
    assert out == head + loop + " Typography is art."  # cut before the first repeated sentence
    near = " In the end it is the key to creating a brand that people like."  # shares a 6-word run
    assert wide.clean_passage(head + loop + near) == head + loop


def test_passages_keep_only_clean_answers():
    rows = [dict(id="w1", topic="tides", genre="report"), dict(id="w2", topic="kites", genre="story"),
            dict(id="w3", topic="owls", genre="story")]
    good = _text(1)
    out = wide.passages_from(rows, {"w1": good, "w2": "Short."})  # w3 unanswered
    assert [p["id"] for p in out] == ["w1"] and out[0]["topic"] == "tides" and out[0]["text"] == good


def test_writing_requests_are_deterministic_distinct_and_disjoint():
    a, b = wide.build_writing(300), wide.build_writing(300)
    assert a == b and len({r["turns"][0] for r in a}) == 300
    assert {r["task"] for r in a} == {"multi_turn"} and {r["category"] for r in a} == {"writing"}
    ev = eval_grams()
    assert not any(grams(r["turns"][0], 8) & ev for r in a)


def test_wide_prompts_cover_their_tasks_in_proportion(tmp_path):
    passages = [_passage(i, topic=t) for i, t in enumerate(["tides", "kites", "owls", "glaciers", "radio", "tea"] * 20)]
    rows = wide.build_wide(passages, 600)
    assert rows == wide.build_wide(passages, 600) and len({r["turns"][0] for r in rows}) == 600
    share = {t: sum(r["task"] == t for r in rows) / len(rows) for t in ("summarization", "rag", "multi_turn", "translation")}
    weights = {"summarization": 12, "rag": 12, "multi_turn": 6, "translation": 4}
    for t, w in weights.items():
        assert abs(share[t] - w / 34) < 0.06, (t, share[t])
    assert all("Passage 1:" in r["turns"][0] and "Passage 2:" in r["turns"][0] for r in rows if r["task"] == "rag")
    f = tmp_path / "wide.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert {p.task for p in load_prompts(f)} <= set(TASKS)  # the loader reads the file


def test_a_passage_holding_an_eval_run_never_reaches_a_prompt():
    ev_text = load_prompts(tasks="summarization")[-1].text
    planted = dict(id="write-99999", topic="tides", genre="report", text=" ".join(ev_text.split()[:60]) + ".")
    passages = [_passage(i) for i in range(6)] + [planted]
    rows = wide.build_wide(passages, 200)
    ev = eval_grams()
    assert not any(grams(r["turns"][0], 8) & ev for r in rows)
    assert grams(planted["text"], 8) & ev, "the planted passage must carry an eval run for this test to mean anything"


def test_too_few_passages_is_named():
    with pytest.raises(ValueError, match="at least 4 passages"):
        wide.build_wide([_passage(0)], 10)


def test_asking_for_more_distinct_prompts_than_exist_is_named():
    with pytest.raises(ValueError, match="distinct wide prompts"):
        wide.build_wide([_passage(i, sentences=1) for i in range(4)], 3000)  # about 1.5k distinct ones exist


def test_clean_passage_drops_a_lead_in_and_keeps_titles_and_list_numbers_inside_sentences():
    body = "Dr. Lee met Mr. Chan at St. Ives, e.g. near the pier. The list had 2 items: 1. tea 2. bread. " + _text(2)
    out = wide.clean_passage("Here's a 150-word report about tea:\n\n" + body + " And then")
    assert out == body
    assert wide.sentences(body)[0] == "Dr. Lee met Mr. Chan at St. Ives, e.g. near the pier."
