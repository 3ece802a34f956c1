"""report: a comparison is said with its spread, and the verdict follows the interquartile range."""
import numpy as np
import pytest

from specdec_core.study import report


def test_verdict_of_reads_the_test_not_the_iqr():
    assert report.verdict_of(dict(median=1.2, p=0.01, power=0.9, n_tell=6, n=12)) == "faster"
    assert report.verdict_of(dict(median=0.8, p=0.01, power=0.9, n_tell=6, n=12)) == "slower"
    assert report.verdict_of(dict(median=1.01, p=0.6, power=0.9, n_tell=6, n=12)) == "ties"
    assert report.verdict_of(dict(median=1.3, p=0.25, power=0.0, n_tell=9, n=3)).startswith(report.UNRESOLVED)
    assert report.verdict_of(dict(median=1.3, p_holm=0.2, p=0.01, power=0.9, n=12)) == "ties"  # Holm's p first
    assert report.verdict_of(dict(median=1.3, q25=1.2, q75=1.4, n=12)) == ""  # no test: no verdict


def test_phrase_of_paired_ratios():
    r = [0.9, 1.1, 1.2, 1.3, 1.4]
    assert report.ratio_phrase(r).startswith("1.20× (IQR 1.10–1.30, 5 prompts): cannot tell at this size")
    assert report.ratio_phrase([1.2, 1.25, 1.3, 1.22, 1.28, 1.24, 1.26, 1.21]).endswith("8 prompts): faster")
    assert report.ratio_phrase([1.2, 1.3] * 4, units=[0, 1] * 4).startswith("1.25× (IQR 1.23–1.27, 2 prompts)")
    assert report.ratio_phrase([0.5]) == "0.50× (one prompt, no verdict)"
    assert report.ratio_phrase([]) == "not measured"
    assert report.ratio_phrase_median(1.5, 1.2, 1.7) == "1.50× (IQR 1.20–1.70)"  # no test, no verdict
    assert report.ratio_phrase_median(1.5, 1.2, 1.7, n=8, p=0.01, power=0.9, better="cheaper").endswith("cheaper")


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


def test_a_quartile_next_to_one_keeps_the_digit_that_is_not_one():
    assert report.ratio_phrase_median(1.04, 0.9987, 1.15, n=12) == "1.04× (IQR 0.999–1.15, 12 prompts)"
    assert report.ratio_phrase_median(1.04, 1.0, 1.15, n=12) == "1.04× (IQR 1.00–1.15, 12 prompts)"
    assert report.ratio_phrase_median(0.57, 0.5651, 0.5749, n=6) == "0.57× (IQR 0.565–0.575, 6 prompts)"


def test_count_says_one_or_many_and_ranges():
    assert [report.count(1, "repeat"), report.count(3, "repeat")] == ["1 repeat", "3 repeats"]
    assert [report.count(1, "prompt", 1), report.count(1, "prompt", 2), report.count(2.0, "prompt", 2)] == \
        ["1 prompt", "1–2 prompts", "2 prompts"]


def test_overlap_of_interquartile_ranges():
    import pandas as pd

    a, b, c = (pd.Series(dict(q25=lo, q75=hi)) for lo, hi in ((0.9, 1.1), (1.05, 1.3), (1.2, 1.4)))
    assert report.overlap(a, b) and report.overlap(b, c) and not report.overlap(a, c)


def test_the_size_rule_withholds_a_verdict_that_is_not_a_test():
    assert report.judged("agree", 5) == "cannot tell at this size (n = 5, fewer than 6)"
    assert report.judged("agree", 6) == "agree"
    assert not report.VERDICT_WORDS.search(report.judged("agree", 5))
    # a mutant rule that compares with > instead of >= is caught at the boundary
    assert report.judged("faster", report.MIN_PAIRS) == "faster"


def test_verdict_words_are_recognised():
    for word in ("faster", "slower", "ties", "agree", "AGREE", "wins", "loses", "pays"):
        assert report.VERDICT_WORDS.search(f"the tree {word} here"), word
    assert not report.VERDICT_WORDS.search("cannot tell at this size (about 9 prompts would tell)")
    assert not report.VERDICT_WORDS.search("speedup over payslips")  # words, not substrings


def test_caption_says_whether_the_prefill_is_counted():
    assert report.caption("Speedup.", prefill=True).endswith(report.PREFILL_COUNTED)
    assert "prefill" in report.caption("Speedup.", prefill=False)


def test_a_verdict_table_tests_each_row_and_says_its_test_once():
    """report.verdict_table: each row's verdict from the paired test, Holm over the table; rows the test cannot
    resolve say so with the prompts that would tell; a row without a test gets "—"; the footnote names the test
    and its false-positive rate once, and carries no verdict word."""
    import numpy as np

    rows = [dict(finding="small", ratios=[1.3, 1.4, 1.5]), dict(finding="big", ratios=np.linspace(1.1, 1.4, 8)),
            dict(finding="untested", median=1.0, q25=0.9, q75=1.1, n=12)]
    table, note = report.verdict_table(rows)
    assert table.verdict.iloc[0].startswith("cannot tell (≈ ")
    assert list(table.verdict.iloc[1:]) == ["faster", report.NO_VERDICT]
    assert list(table.n) == [3, 8, 12]
    assert note.count("Wilcoxon") == 1 and "5%" in note and "Holm" in note
    assert not report.VERDICT_WORDS.search(note)
    # Holm over the table: the same 8-prompt row among many strong rows still reads faster, but beside 40 rows it
    # faces 0.05 / 40 < 2 / 256 and cannot
    many = [dict(finding=str(i), ratios=np.linspace(1.1, 1.4, 8)) for i in range(40)]
    assert report.verdict_table(many)[0].verdict.iloc[0].startswith("cannot tell")


def test_a_verdict_tables_quartile_that_rounds_to_one_keeps_a_third_decimal():
    table, _ = report.verdict_table([dict(finding="a", median=1.02, q25=1.001, q75=1.05, n=8, p=0.004, power=0.9)])
    assert table.IQR.iloc[0] == "1.001–1.05" and table.verdict.iloc[0] == "faster"


def test_rule_note_names_only_the_sizes_below_the_rule_and_is_empty_without_them():
    """The caveat under a table lists each small n once, sorted, and says nothing when every row is large enough."""
    note = report.rule_note([3, 12, 3, 1], "“best K”")
    assert "“best K”" in note and "n = 1, 3," in note and f"fewer than {report.MIN_PAIRS}" in note
    assert "12" not in note
    assert report.rule_note([report.MIN_PAIRS, 40]) == ""
