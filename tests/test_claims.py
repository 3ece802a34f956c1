"""Claims the repository's prose makes, held to their evidence.

- A CUDA-graph speed claim (a sentence about CUDA graphs or captured steps that states a time, a ratio or a speed)
  in the README, a chapter or an appendix page either says the library's graph path is "not yet run on CUDA" or
  names a committed file of a GPU run (``data/reference/cuda-*/…``) that holds the figure.
- The README's results block is exactly what :func:`specdec_core.tools.headline.results_block` writes from the
  committed reference run (``scripts/collect_reference.py`` writes it; nobody edits it by hand).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABEL = "not yet run on CUDA"
GRAPH = re.compile(r"CUDA graph|captur|graph mode|graphs=True", re.I)
SPEED = re.compile(r"\d\s*ms\b|\d\s*×|\bfaster\b|\bspeed|\bslower\b|\bbound by\b|\bremoves? most\b|"
                   r"\bcosts? (?:almost )?nothing\b", re.I)
EVIDENCE = re.compile(r"data/reference/(cuda-[\w.-]+/[\w.-]+\.(?:csv|md))")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(\[])|\n\s*\n")


def sentences(text: str) -> list[str]:
    """The sentences of a Markdown page or a jupytext chapter (comment markers dropped, lines joined)."""
    text = re.sub(r"^# ?%%.*$", "\n", text, flags=re.M)       # cell markers end a sentence
    text = re.sub(r"^\s*# ?", "", text, flags=re.M)            # markdown cells and comments as prose
    return [" ".join(s.split()) for s in SENTENCE_END.split(text) if s.strip()]


def unbacked_gpu_claims(text: str, root: Path = ROOT) -> list[str]:
    """Sentences about CUDA graphs that state a speed, neither labelled "not yet run on CUDA" nor naming a
    committed GPU run's file (``data/reference/cuda-*/<file>``, which must exist under ``root``)."""
    found = []
    for s in sentences(text):
        if not (GRAPH.search(s) and SPEED.search(s)) or LABEL in s:
            continue
        files = EVIDENCE.findall(s)
        if not files or not all((root / "data" / "reference" / f).is_file() for f in files):
            found.append(s[:200])
    return found


def test_every_cuda_graph_speed_claim_is_labelled_or_backed():
    pages = [ROOT / "README.md", *sorted((ROOT / "book").glob("*.py")), *sorted((ROOT / "book").glob("*.md"))]
    found = {p.relative_to(ROOT).as_posix(): hits for p in pages
             if (hits := unbacked_gpu_claims(p.read_text(encoding="utf-8")))}
    assert not found, "CUDA-graph speed claims without evidence:\n" + "\n".join(
        f"{p}: {s!r}" for p, hits in found.items() for s in hits)


def test_the_claim_check_catches_a_planted_breach(tmp_path):
    """The check fails on an unlabelled claim (the README's old sentence), on evidence that is not committed, and
    passes the same claim labelled, or backed by a committed file."""
    planted = ("On a CUDA device `sd.generate` captures each step in a CUDA graph: a small model's eager step is "
               "bound by kernel launches (the H200 reference: 28 ms eager against 3 ms captured per step).")
    assert unbacked_gpu_claims(planted, tmp_path) == [planted[:200]]
    as_chapter = "# %% [markdown]\n# ## On a GPU\n# The `graph` rows: steps captured in CUDA graphs run 9× faster.\n"
    assert len(unbacked_gpu_claims(as_chapter, tmp_path)) == 1
    backed = planted[:-2] + ", `data/reference/cuda-x/steps.csv`)."
    assert len(unbacked_gpu_claims(backed, tmp_path)) == 1      # the file named is not there
    (tmp_path / "data" / "reference" / "cuda-x").mkdir(parents=True)
    (tmp_path / "data" / "reference" / "cuda-x" / "steps.csv").write_text("mode,ms\neager,28\ngraph,3\n")
    assert unbacked_gpu_claims(backed, tmp_path) == []
    assert unbacked_gpu_claims(planted.replace("CUDA graph:", f"CUDA graph ({LABEL}):"), tmp_path) == []
    assert unbacked_gpu_claims("Steps are captured in CUDA graphs, one per shape. Eager runs at 28 ms.",
                               tmp_path) == []  # a speed in another sentence than the graphs'


def readme_block(text: str) -> str:
    """What stands between the README's RESULTS markers."""
    from specdec_core.tools import headline

    return text[text.index(headline.START) + len(headline.START):text.index(headline.END)].strip()


def test_the_readme_results_block_is_the_reference_runs(tmp_path):
    from specdec_core.tools import headline

    block = headline.results_block(ROOT / "data" / "reference" / "book")
    assert readme_block((ROOT / "README.md").read_text(encoding="utf-8")) == block.strip(), (
        "the README's RESULTS block is not what headline.results_block writes from data/reference/book: rewrite it "
        "with headline.replace_block (scripts/collect_reference.py), never by hand")
    planted = tmp_path / "README.md"  # the comparison sees a hand edit of one figure
    planted.write_text(f"# x\n{headline.START}\nold\n{headline.END}\n", encoding="utf-8")
    headline.replace_block(planted, block)
    assert readme_block(planted.read_text(encoding="utf-8")) == block.strip()
    edited = re.sub(r"at T = (\d+)", lambda m: f"at T = {int(m.group(1)) + 100}", planted.read_text(encoding="utf-8"),
                    count=1)  # one figure's label changed by hand, whatever the reference holds
    planted.write_text(edited, encoding="utf-8")
    assert "at T = " in block and readme_block(planted.read_text(encoding="utf-8")) != block.strip()


def test_the_headline_says_what_each_figure_counts():
    """Chapter 1's bar names every T within and above it (a T above the bar between two within is not hidden in a
    range), chapter 9's p says how it was computed, chapter 10's identity says it is checked, not counted."""
    import pandas as pd

    from specdec_core.tools import headline

    v = pd.DataFrame(dict(T=[2, 3, 4, 5, 6, 7], ratio=[1.09, 1.31, 1.07, 1.20, 1.14, 1.37], one_pass=1.25))
    said = headline.bar_verdict(v)
    assert said == "within its “about one pass” bar (1.25×) at T = 2, 4, 5, 6, above it at T = 3, 7"
    assert "≤" not in said  # a range ("T ≤ 6") would hide T = 3, above the bar between two T within it
    assert headline.bar_verdict(v.assign(ratio=2.0)).startswith("within its “about one pass” bar (1.25×) at no T")
    assert headline.bar_verdict(v.assign(ratio=1.0)).endswith("at T = 2, 3, 4, 5, 6, 7")
    assert headline.trend_p_method(pd.Series(dict(p_value=2.3e-7))) == "t-approximation"
    exact = pd.Series(dict(p_value=1.8e-5, p_method="exact permutation over 113400 arrangements"))
    assert headline.trend_p_method(exact) == "exact permutation over 113400 arrangements"
    ref = ROOT / "data" / "reference" / "book"
    block = headline.results_block(ref)
    v = pd.read_csv(ref / "01_bottleneck" / "verdict.csv")
    assert headline.bar_verdict(v[v["T"] > 1]) in block  # the reference's own T, each named
    assert "grid points equal" not in block and "checked at every step" in block
    trend = pd.read_csv(ref / "09_serving" / "trend_vs_batch.csv")
    assert all(headline.trend_p_method(r) in block for _, r in trend.iterrows())  # how each p was computed, named


def test_the_block_names_the_grounded_and_the_engine_results(tmp_path):
    """Chapter 11's best method per family and chapter 9's load-adaptive goodput at each load, with each fixed
    policy's crossover, from the tables the chapters write (absent tables: no line)."""
    import pandas as pd

    from specdec_core.tools import headline

    assert headline.grounded_lines(tmp_path) == [] and headline.engine_lines(tmp_path) == []
    (tmp_path / "11_where_it_pays").mkdir()
    pd.DataFrame(dict(runner=["suffix warm", "n-gram K=16", "suffix warm", "suffix warm"],
                      family=["input-grounded", "input-grounded", "chat", "input-grounded"],
                      median=[2.5, 2.0, 1.1, 3.0], q25=[2.2, 1.8, 1.0, 2.5], q75=[2.8, 2.2, 1.2, 3.5], n=12,
                      temperature=[0.0, 0.0, 0.0, 1.0], p=[0.0005, 0.001, 0.3, 0.0005], power=0.9, n_tell=8)
                 ).to_csv(tmp_path / "11_where_it_pays/speedup.csv", index=False)
    [line] = headline.grounded_lines(tmp_path)
    # the best on the evaluation prompts is labelled as picked there; its verdict Holm-adjusted over its family
    assert "input-grounded suffix warm 2.50× (IQR 2.20–2.80, 12 prompts): faster" in line  # T = 1's 3.0 is not
    assert "picked there" in line and "chat suffix warm 1.10× (IQR 1.00–1.20, 12 prompts): ties" in line
    # the rule fixed on training prompts comes first, evaluated once
    pd.DataFrame([dict(prediction="prediction", grounded="suffix warm", chat="n-gram K=4")]).to_csv(
        tmp_path / "11_where_it_pays/rule.csv", index=False)
    pd.DataFrame(dict(runner="chooser", family=["chat", "input-grounded"], median=[1.02, 1.8], q25=[0.97, 1.6],
                      q75=[1.05, 2.0], n=12, p=[0.4, 0.001], power=[0.3, 0.99], n_tell=[20, 6])).to_csv(
        tmp_path / "11_where_it_pays/rule_eval.csv", index=False)
    [line] = headline.grounded_lines(tmp_path)
    assert "the per-request rule fixed on training prompts (prediction → prediction; grounded → suffix warm" in line
    assert "chat 1.02× (IQR 0.97–1.05, 12 prompts): cannot tell at this size" in line
    assert "input-grounded 1.80× (IQR 1.60–2.00, 12 prompts): faster" in line
    assert line.index("per-request rule") < line.index("picked there")
    (tmp_path / "09_serving").mkdir()
    pd.DataFrame(dict(policy=["autoregressive", "n-gram", "load-adaptive"] * 2, load=[0.1] * 3 + [1.2] * 3,
                      goodput=[1.0, 1.5, 1.6, 2.0, 1.8, 2.1])).to_csv(tmp_path / "09_serving/load_summary.csv",
                                                                      index=False)
    assert headline.engine_lines(tmp_path) == []  # no verdicts, no line
    pd.DataFrame(dict(load=[0.1, 0.1, 1.2, 1.2], other=["autoregressive", "n-gram"] * 2, goal=[1.0, 0.95] * 2,
                      policy_goodput=[1.6, 1.6, 2.1, 2.1], other_goodput=[1.0, 1.5, 2.0, 1.8],
                      ratio=[1.6, 1.07, 1.05, 1.17], lo=[1.2, 0.9, 0.97, 1.0], hi=[2.0, 1.2, 1.1, 1.3], requests=48,
                      n_units=24,
                      verdict=["holds", "undecided", "undecided", "holds"])).to_csv(
        tmp_path / "09_serving/goodput_verdicts.csv", index=False)
    [line] = headline.engine_lines(tmp_path)
    assert ("load 0.1: 1.60, ÷ autoregressive 1.60 (1.20–2.00, holds at ≥ 1), ÷ the best other (n-gram) 1.07 "
            "(0.90–1.20, undecided at ≥ 0.95)") in line
    assert "load 1.2: 2.10, ÷ autoregressive 1.05" in line and "n-gram from load 1.2" in line
    assert "24 distinct requests" in line
