"""Prompts over texts the target writes itself: the teacher set's long contexts (issue 16's "broader prompts").

The template documents of :mod:`specdec_core.train.prompts` are a few fixed paragraphs with slots; the eval mix
summarizes 180–260-word articles and answers questions over several passages. Here the target writes the
passages (two stages, each its own file, deterministic in its seed):

1. :func:`build_writing` — ``data/prompts/train_writing.jsonl``: "write a ~N-word <genre> about <topic><angle>"
   requests (task ``multi_turn``, category ``writing``: they are also teacher prompts in their own right).
2. :func:`passages_from` — the target's answers to them, cut after their last complete sentence before the first
   repetition (a 135M model drifts into loops) and kept if long enough (``data/prompts/passages.jsonl``: id, topic,
   genre, text).
3. :func:`build_wide` — ``data/prompts/train_wide.jsonl``: summaries of one or two passages, questions over two to
   four numbered passages, rewrites and extractions (multi-turn categories), translations of a passage's
   sentences, in the eval mix's proportions of those tasks. A prompt sharing an 8-word run with the eval mix is
   drawn again (the target could write one by chance).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from ..paths import PROMPTS_DIR
from .prompts import AUDIENCES, LANGS, MORE_PATH, PEOPLE, TOPICS, TOWNS, TRAIN_PATH, clear_of_eval, draw, grams, pick

WRITING_PATH = PROMPTS_DIR / "train_writing.jsonl"
PASSAGES_PATH = PROMPTS_DIR / "passages.jsonl"
WIDE_PATH = PROMPTS_DIR / "train_wide.jsonl"
WRITING_SEED, WIDE_SEED = 20261201, 20261202
ANSWER_FILES = (TRAIN_PATH, MORE_PATH, WIDE_PATH)  # stage 2 answers every prompt of these
PROMPT_FILES = (WRITING_PATH, *ANSWER_FILES)  # every prompt file the wide set answers (both stages)
# the set's plan (part of its cache key: changing one regenerates that stage): rows per batch (the fastest of
# scripts/teacher_throughput.py here), the share answered at temperature 1, each stage's token budget
BATCH, SAMPLE_FRAC, WRITING_TOKENS, ANSWER_TOKENS = 64, 0.25, 320, 128

GENRES = ["news article", "report", "short story", "set of meeting notes", "letter to a friend",
          "encyclopedia entry", "product review", "travel guide entry", "blog post", "school essay",
          "interview summary", "museum exhibit description"]
ANGLES = ["", " in a small town", " for beginners", " from the point of view of a child", " in the year 2050",
          " with two surprising facts", " that mentions a local expert by name", " that includes some numbers",
          " with a short quotation", " that ends with an open question"]
WORDS = [120, 150, 180, 200, 250]


def writing_request(rng) -> dict:
    topic, genre, angle = pick(rng, TOPICS), pick(rng, GENRES), pick(rng, ANGLES)
    extra = pick(rng, ["", f" Set it in {pick(rng, TOWNS)}.", f" Include someone called {pick(rng, PEOPLE)}.", ""])
    text = f"Write a {pick(rng, WORDS)}-word {genre} about {topic}{angle}.{extra}"
    return dict(task="multi_turn", category="writing", turns=[text], topic=topic, genre=genre)


def build_writing(n: int, seed: int = WRITING_SEED) -> list[dict]:
    """``n`` distinct writing requests (ids ``write-NNNNN``, with their ``topic`` and ``genre``), none sharing an
    8-word run with the eval mix."""
    return draw([(writing_request, 1)], n, seed, "write", skip=clear_of_eval(8))


# a sentence ends at . ! or ? (a closing quote or bracket may follow) before white space, except after a title
# (Dr.), a Latin abbreviation or a list number of one or two digits ("1.")
SENTENCE_END = re.compile(r"(?<!\bDr)(?<!\bMr)(?<!\bMs)(?<!\bMrs)(?<!\bSt)(?<!e\.g)(?<!i\.e)(?<!\b\d)(?<!\b\d\d)"
                          r"[.!?][\"')\]]?(?=\s|$)")


def clean_passage(text: str, min_words: int = 60, run_words: int = 6) -> str | None:
    """``text`` without markdown headings and emphasis and without a lead-in paragraph ending in a colon ("Here's a
    150-word report about …:"), cut after its last complete sentence before the first one that repeats itself (a
    sentence seen before, or one sharing a ``run_words``-word run with an earlier one: where a small model starts to
    loop); ``None`` if fewer than ``min_words`` words remain."""
    lines = [ln for ln in text.strip().splitlines() if not ln.lstrip().startswith("#")]
    paras = re.split(r"\n\s*\n", re.sub(r"\*\*|__", "", "\n".join(lines)).strip())
    if len(paras) > 1 and paras[0].rstrip().endswith(":"):
        paras = paras[1:]
    text = "\n\n".join(paras).strip()
    seen_runs, seen, start, cut = set(), set(), 0, 0
    for end in (m.end() for m in SENTENCE_END.finditer(text)):
        sentence = " ".join(re.findall(r"\w+", text[start:end].lower()))
        runs = grams(sentence, run_words)
        if sentence in seen or runs & seen_runs:
            break
        seen.add(sentence)
        seen_runs |= runs
        start = cut = end
    text = text[:cut].strip()
    return text if len(re.findall(r"\w+", text)) >= min_words else None


def passages_from(writing: list[dict], answers: dict[str, str], min_words: int = 60) -> list[dict]:
    """Passages from the target's ``answers`` (writing-prompt id → text) that :func:`clean_passage` keeps."""
    out = []
    for row in writing:
        text = clean_passage(answers[row["id"]], min_words) if row["id"] in answers else None
        if text is not None:
            out.append(dict(id=row["id"], topic=row["topic"], genre=row["genre"], text=text))
    return out


def sentences(text: str) -> list[str]:
    cuts = [0] + [m.end() for m in SENTENCE_END.finditer(text)]
    return [s for s in (text[a:b].strip() for a, b in zip(cuts, cuts[1:])) if s]


def summarization(rng, ps):
    doc = "\n\n".join(p["text"] for p in rng.sample(ps, rng.choice([1, 1, 1, 2])))
    text = pick(rng, [f"Summarize the following text in two sentences.\n\n{doc}",
                      f"Write a short summary of this {pick(rng, ['article', 'text', 'document'])}:\n\n{doc}",
                      f"{doc}\n\nSummarize the text above in three bullet points.",
                      f"Give a summary of at most 40 words of the following:\n{doc}",
                      f"Read this and tell me its main point in one sentence.\n\n{doc}"])
    return dict(task="summarization", category="summarization", turns=[text])


def rag(rng, ps):
    chosen = rng.sample(ps, rng.choice([2, 3, 3, 4]))
    ctx = "\n\n".join(f"Passage {i + 1}: {' '.join(sentences(p['text'])[:rng.choice([2, 3, 4])])}"
                      for i, p in enumerate(chosen))
    j = rng.randrange(len(chosen))
    topic = chosen[j]["topic"]
    q = pick(rng, [f"What do the passages say about {topic}?", f"Which passage is about {topic}, and what does it say?",
                   f"According to Passage {j + 1}, what is the most important point?",
                   "What is the main idea of each passage?", f"Does any passage mention a person? Who, and in which passage?",
                   f"What numbers appear in Passage {j + 1}, and what do they describe?"])
    text = pick(rng, [f"Use only the passages to answer.\n\n{ctx}\n\nQuestion: {q}",
                      f"{ctx}\n\nBased on the passages above, answer this question: {q}",
                      f"Answer the question from the context.\n\nContext:\n{ctx}\n\nQuestion: {q}"])
    return dict(task="rag", category="rag", turns=[text])


def rewrite(rng, ps):
    p = pick(rng, ps)
    cat, ask = pick(rng, [("writing", f"Rewrite this text for {pick(rng, AUDIENCES)}:"),
                          ("writing", "Make the following text more formal:"),
                          ("writing", "Shorten this text to half its length, keeping the key facts:"),
                          ("extraction", "List every person, place and number mentioned in this text:"),
                          ("extraction", "Extract the three most important facts from this text as a bullet list:"),
                          ("reasoning", "What is the weakest claim in the following text, and why?")])
    return dict(task="multi_turn", category=cat, turns=[f"{ask}\n\n{p['text']}"])


def translation(rng, ps):
    body = " ".join(sentences(pick(rng, ps)["text"])[:rng.choice([1, 1, 2])])
    lang = pick(rng, LANGS)
    text = pick(rng, [f"Translate the following text into {lang}:\n{body}", f"Translate to {lang}: {body}",
                      f"Please translate this English text into {lang}.\n\n{body}"])
    return dict(task="translation", category="translation", turns=[text])


# the eval mix holds 12 summarization, 12 rag, 16 multi-turn and 12 translation prompts; the passages carry the
# first two, a share of the multi-turn categories (writing, extraction, reasoning) and out-of-English translation
WIDE_GENERATORS = [(summarization, 12), (rag, 12), (rewrite, 6), (translation, 4)]


def build_wide(passages: list[dict], n: int, seed: int = WIDE_SEED) -> list[dict]:
    """``n`` distinct prompts (ids ``wide-NNNNN``) over ``passages``, none sharing an 8-word run with the eval mix."""
    if len(passages) < 4:
        raise ValueError(f"build_wide needs at least 4 passages, got {len(passages)}")
    return draw([(functools.partial(f, ps=passages), w) for f, w in WIDE_GENERATORS], n, seed, "wide",
                skip=clear_of_eval(8))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
