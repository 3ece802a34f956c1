"""The chapters' picture of a step (``tools/book.py``): each draft token's fate, drawn in its context."""
from __future__ import annotations

import pytest

from specdec_core.tools import book


class Chars:
    """A tokenizer of single characters: token i is chr(i)."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def test_each_token_gets_its_fate():
    assert book.step_parts([1, 2, 3, 4], 1, 9) == [(1, "accepted"), (2, "rejected"), (3, "untested"),
                                                   (4, "untested"), (9, "target")]
    assert book.step_parts([1, 2], 2, 9) == [(1, "accepted"), (2, "accepted"), (9, "target")]  # the bonus
    assert book.step_parts([], 0, 9) == [(9, "target")]
    with pytest.raises(ValueError, match="accepted must be in"):
        book.step_parts([1], 2, 9)


def test_a_step_is_drawn_after_its_context_with_each_fate_coloured():
    ids = [ord(c) for c in "abcd"]
    html = book.step_html(Chars(), [ord(c) for c in "the sky is"], ids, 1, ord("X"), context_chars=6)
    assert "…sky is" in html and "the" not in html.split("…")[1][:3]
    order = [html.index(f">{c}<") if f">{c}<" in html else html.index(f"<s>{c}</s>") for c in "abcd"]
    assert order == sorted(order) and html.index("[X]") > order[-1]
    assert f"color:{book.STEP_COLOURS['accepted']}'>a<" in html
    assert f"color:{book.STEP_COLOURS['rejected']}'><s>b</s>" in html
    assert html.count(book.STEP_COLOURS["untested"]) == 2
    table = book.steps_table(Chars(), [dict(context=[97], drafted=ids, accepted=4, target=90)]).data
    assert "4 of 4" in table and "<td>5</td>" in table


def test_the_theme_is_seaborns_colour_blind_palette_without_importing_seaborn():
    """``use_theme`` hard-codes seaborn's palette (so chapter 0 need not import seaborn): a seaborn that changed it
    would leave the book's matplotlib figures and its seaborn figures in different colours."""
    import subprocess
    import sys

    sns = pytest.importorskip("seaborn")
    assert list(book.COLORBLIND) == sns.color_palette("colorblind").as_hex()
    code = ("import sys, matplotlib; matplotlib.use('agg'); from specdec_core.tools import book; book.use_theme(); "
            "import matplotlib.pyplot as plt; print(plt.rcParams['axes.prop_cycle'].by_key()['color'][1], "
            "'seaborn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [book.COLORBLIND[1], "False"]
