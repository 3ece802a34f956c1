"""The book on a pair of one's own, offline: a small random-weight Llama target and a smaller draft, both with the
embedded target's tokenizer, saved with ``save_pretrained`` to a temporary folder, through ``scripts/run_book.py``
at CI size (chapters 00, 03, 06 and 08), rendered as a book. They execute, name the pair, skip what the pair lacks
with a reason, and their greedy outputs equal autoregressive decoding (chapters 3 and 8 assert it; the first test
checks it here); the rendered front page names both models."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import specdec_core as sd
from specdec_core.models import embedded_path
from specdec_core.paths import REPO_ROOT

CHAPTERS = ("00_quickstart", "03_linear", "06_speedup", "08_adaptive")


def save_llama(folder, hidden: int, layers: int, seed: int):
    """A random Llama over the embedded target's vocabulary and tokenizer (chat template included), saved. Its
    weights are drawn wide (initializer_range 0.2) so that greedy choices are rarely near-ties."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(embedded_path("smollm2-135m"))
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      initializer_range=0.2, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("random-pair")
    return save_llama(root / "rand-target", 64, 2, 0), save_llama(root / "rand-draft", 32, 1, 1)


def test_the_random_pair_decodes_exactly(random_pair):
    target, draft = random_pair
    pair = sd.load_pair(str(target), draft=str(draft))
    assert pair.tokenizer is not None and {"model", "ngram", "hybrid", "adaptive"} <= set(pair.drafters)
    assert "block" not in pair.drafters  # a block draft belongs to the embedded target's shipped drafts
    ids = pair.encode_chat("Name three colours.")
    ar = sd.generate(pair.target, ids, max_new_tokens=24).tokens
    for method, drafter, k in [("linear", "model", 3), ("linear", "ngram", 3), ("tree", "model", 2),
                               ("linear", "hybrid", 4)]:
        out = sd.generate(pair.target, ids, drafter=pair.drafters[drafter], method=method, k=k, max_new_tokens=24)
        assert out.tokens == ar, (method, drafter)


@pytest.mark.slow
def test_chapters_run_on_a_pair_of_ones_own(random_pair, tmp_path):
    target, draft = random_pair
    out = tmp_path / "book"
    proc = subprocess.run([sys.executable, "scripts/run_book.py", "--params", "ci", "--html", "--out", str(out),
                           "--target", str(target), "--draft", str(draft), "--only", *CHAPTERS, "05_parallel"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stem in CHAPTERS:
        nb = json.loads((out / "notebooks" / f"{stem}.ipynb").read_text())
        text = "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/markdown", ""))
                         + "".join(o.get("data", {}).get("text/plain", ""))
                         for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
        assert "rand-target" in text, f"{stem} does not name the pair it ran on"
        if stem in ("03_linear", "06_speedup"):  # the shipped draft's curve; the block draft and stored settings
            assert "skipped: " in text and "Skipped for this pair" in text, f"{stem} skipped nothing it says"
    front = (out / "index.html").read_text()  # make reproduce PARAMS=ci TARGET=… DRAFT=… renders a book naming them
    assert str(target) in front and str(draft) in front
    # chapter 5 studies the block draft, which only the embedded target ships: left out, and said so
    assert not (out / "notebooks" / "05_parallel.ipynb").exists() and "Not run for this pair" in front
    assert "05_parallel" in front and "skipped" in (out / "timings.csv").read_text()
