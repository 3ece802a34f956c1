"""report: a comparison is said with its spread, and the verdict follows the interquartile range."""
import numpy as np
import pytest

from specdec_core.study import report


@pytest.mark.parametrize("q25, q75, want", [(1.05, 1.3, "faster"), (0.7, 0.95, "slower"), (0.95, 1.1, "ties"),
                                            (1.0, 1.2, "ties")])
def test_verdict_reads_the_iqr(q25, q75, want):
    assert report.verdict((q25 + q75) / 2, q25, q75) == want


def test_phrase_of_paired_ratios():
    r = [0.9, 1.1, 1.2, 1.3, 1.4]
    assert report.ratio_phrase(r, min_n=5) == "1.20× (IQR 1.10–1.30, 5 pairs): faster"
    assert report.ratio_phrase([0.5]) == "0.50× (one pair, no verdict)"
    assert report.ratio_phrase([0.5, 0.6], min_n=2).endswith("2 pairs): slower")
    assert report.ratio_phrase([]) == "not measured"
    assert report.verdict(np.nan, 1, 1) == "not measured"
    assert report.ratio_phrase_median(1.0, 0.9, 1.1, better="cheaper", worse="dearer").endswith("ties")
    assert report.ratio_phrase_median(1.5, 1.2, 1.7, better="cheaper").endswith("cheaper")


def test_rivals_are_the_rows_whose_iqr_reaches_the_choice():
    import pandas as pd

    t = pd.DataFrame({"median": [1.3, 1.2, 0.9], "q25": [1.25, 1.1, 0.8], "q75": [1.4, 1.26, 1.0]}, index=[1, 2, 4])
    assert report.rivals(t, 1) == [2]
    assert report.rivals(t.assign(q75=[1.4, 1.2, 1.0]), 1) == []


def test_shown_rounds_numbers_and_blanks_what_was_not_measured():
    import pandas as pd

    t = pd.DataFrame({"x": [0.123456, float("nan"), 0.4], "tok": ["a", "b", "c"], "mixed": [0.98765, "n/a", 1.0],
                      "whole": [199.0, 174.0, float("nan")]})
    s = report.shown(t, 2)
    assert s.x.tolist() == ["0.12", "—", "0.40"] and s.tok.tolist() == ["a", "b", "c"]
    assert s.mixed.tolist() == ["0.99", "n/a", "1.00"] and s.whole.tolist() == ["199", "174", "—"]
    assert t.x.isna().iloc[1]  # the table itself keeps NaN


def test_a_quartile_next_to_one_keeps_the_digit_that_decides_the_verdict():
    assert report.ratio_phrase_median(1.04, 0.9987, 1.15, n=12) == "1.04× (IQR 0.999–1.15, 12 pairs): ties"
    assert report.ratio_phrase_median(1.04, 1.0, 1.15, n=12) == "1.04× (IQR 1.00–1.15, 12 pairs): ties"
    assert report.ratio_phrase_median(0.57, 0.5651, 0.5749, n=6) == "0.57× (IQR 0.565–0.575, 6 pairs): slower"


def test_count_says_one_or_many_and_ranges():
    assert [report.count(1, "repeat"), report.count(3, "repeat")] == ["1 repeat", "3 repeats"]
    assert [report.count(1, "prompt", 1), report.count(1, "prompt", 2), report.count(2.0, "prompt", 2)] == \
        ["1 prompt", "1–2 prompts", "2 prompts"]


def test_overlap_of_interquartile_ranges():
    import pandas as pd

    a, b, c = (pd.Series(dict(q25=lo, q75=hi)) for lo, hi in ((0.9, 1.1), (1.05, 1.3), (1.2, 1.4)))
    assert report.overlap(a, b) and report.overlap(b, c) and not report.overlap(a, c)


def test_the_verdict_rule_withholds_the_word_below_the_minimum_sample():
    # the rule is on by default: fewer than MIN_PAIRS pairs print no verdict word, whatever the interval
    said = report.ratio_phrase_median(1.5, 1.3, 1.7, n=3)
    assert said == "1.50× (IQR 1.30–1.70, 3 pairs): unresolved at this size (n = 3, fewer than 6)"
    assert not report.VERDICT_WORDS.search(said)
    assert report.ratio_phrase_median(1.5, 1.3, 1.7, n=report.MIN_PAIRS).endswith("faster")
    assert report.ratio_phrase_median(1.5, 1.3, 1.7, n=3, min_n=2).endswith("faster")
    assert report.ratio_phrase_median(1.5, 1.3, 1.7).endswith("faster")  # no sample size: the interval decides
    assert report.judged("agree", 5) == "unresolved at this size (n = 5, fewer than 6)"
    assert report.judged("agree", 6) == "agree"
    # a mutant rule that compares with > instead of >= is caught at the boundary
    assert report.judged("faster", report.MIN_PAIRS) == "faster"


def test_verdict_words_are_recognised():
    for word in ("faster", "slower", "ties", "agree", "AGREE", "wins", "loses", "pays"):
        assert report.VERDICT_WORDS.search(f"the tree {word} here"), word
    assert not report.VERDICT_WORDS.search("unresolved at this size (n = 3, fewer than 6)")
    assert not report.VERDICT_WORDS.search("speedup over payslips")  # words, not substrings


def test_caption_says_whether_the_prefill_is_counted():
    assert report.caption("Speedup.", prefill=True).endswith(report.PREFILL_COUNTED)
    assert "prefill" in report.caption("Speedup.", prefill=False)


def test_a_verdict_table_says_its_caveat_once_and_keeps_the_rule():
    """report.verdict_table: rows below MIN_PAIRS get no verdict word ("—") and one footnote says why; rows at or
    above it get the IQR rule's word; a table with no small row has no footnote."""
    import numpy as np

    from specdec_core.study import report

    rows = [dict(finding="small", ratios=[1.3, 1.4, 1.5]), dict(finding="big", ratios=np.linspace(1.1, 1.4, 8)),
            dict(finding="tie", median=1.0, q25=0.9, q75=1.1, n=12)]
    table, note = report.verdict_table(rows)
    assert list(table.verdict) == [report.NO_VERDICT, "faster", "ties"]
    assert list(table.n) == [3, 8, 12]
    assert note.count(report.UNRESOLVED) == 1 and not report.VERDICT_WORDS.search(note)
    assert report.verdict_table(rows[1:])[1] == ""
    mutant = rows[0] | {"ratios": [1.3, 1.4, 1.5, 1.6, 1.7, 1.8]}  # six pairs: now the rule may speak
    assert report.verdict_table([mutant])[0].verdict.iloc[0] == "faster"


def test_a_verdict_tables_quartile_that_rounds_to_one_keeps_a_third_decimal():
    """The table's IQR reads as ratio_phrase's does: 1.001 is not printed as 1.00 beside "faster"."""
    from specdec_core.study import report

    table, _ = report.verdict_table([dict(finding="a", median=1.02, q25=1.001, q75=1.05, n=8)])
    assert table.IQR.iloc[0] == "1.001–1.05" and table.verdict.iloc[0] == "faster"
