"""The exactness audit of any decoder (:func:`specdec_core.study.exactness.audit`): on a toy pair with an exactly
enumerated law, this library's decoders and transformers' ``generate`` pass at every setting, lossy mutants fail
with the power the audit states, the family's false-positive rate is checked by simulation, bad runners are named,
and ``scripts/audit_decoder.py`` prints the table for a reader's own runner.

Level: α = 0.01 family-wise (Holm over each table's rows), fixed seeds (deterministic outcomes); a correct family
fails with probability at most 0.01.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

import specdec_core as sd
from specdec_core.paths import REPO_ROOT
from specdec_core.study import exactness as ex
from specdec_core.study import peers

SETTINGS = [{"name": "T=1", "temperature": 1.0},
            {"name": "T=0.7, top-k=4", "temperature": 0.7, "top_k": 4},  # a top-k that cuts the toy's 8 tokens
            {"name": "top-p=0.9", "temperature": 1.0, "top_p": 0.9}]
PROMPT = [4, 3, 1, 4, 7]
N, LENGTH, ALPHA = 400, 3, 0.01  # 3 tokens: the first speculative step (a draft, then its bonus or a rollback)


@pytest.fixture(scope="module")
def toy8():
    return sd.toy_pair(vocab_size=8, seed=0, draft_noise=0.6)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    with ex.torch_threads(1):
        yield


@pytest.fixture(scope="module")
def mutants(toy8):
    runners = {m: ex.mutant_runner(toy8, m, LENGTH) for m in ("draft only (no verification)", "residual from p")}
    return ex.audit_family(runners, toy8, [PROMPT], SETTINGS, N, LENGTH, alpha=ALPHA)


def test_lossy_mutants_fail_at_every_setting(mutants):
    assert not mutants.passed.any(), mutants[mutants.passed]
    assert (mutants.divergence > 0).all()


def test_correct_decoders_pass_with_stated_power(toy8, mutants):
    runners = {s: ex.library_runner(toy8, s, LENGTH) for s in ("linear:model", "tree:model", "parallel:block")}
    runners["transformers generate"] = peers.audit_runners(toy8, LENGTH)["transformers generate"]
    table = ex.audit_family(runners, toy8, [PROMPT], SETTINGS, N, LENGTH, alpha=ALPHA, against=ex.divergences(mutants))
    assert table.passed.all(), table[~table.passed]
    assert len(table) == 12 and (table.reference == "exact law").all()
    # the power stated against the weakest known mutant at this n, at Holm's strictest level, naming it
    assert table.power.between(0, 1).all() and (table.power > 0.8).all(), table[["runner", "setting", "power"]]
    weakest = mutants.loc[mutants.groupby("setting").divergence.idxmin()].set_index("setting")
    assert (table.against == weakest.runner.reindex(table.setting).to_numpy()).all()
    assert table.against_divergence.to_numpy() == pytest.approx(weakest.divergence.reindex(table.setting).to_numpy())
    # the float form (setting -> the weakest divergence) states the same power
    same = ex.audit_family(runners, toy8, [PROMPT], SETTINGS, N, LENGTH, alpha=ALPHA, against=ex.weakest(mutants))
    assert same.power.to_numpy() == pytest.approx(table.power.to_numpy())


def test_the_family_false_positive_rate_is_calibrated(toy8):
    cal = ex.calibrate_audit(toy8, [PROMPT], SETTINGS, N, rows_per_setting=4, reps=200, alpha=ALPHA)
    assert cal["rows"] == 12 and cal["lo95"] <= ALPHA, cal  # the rate is not above α beyond its interval


def test_raw_logits_q_must_be_caught_where_a_temperature_rescales_the_law():
    assert ex.lossy_settings("q from raw logits", SETTINGS) == ["T=0.7, top-k=4"]
    assert ex.lossy_settings("residual from p", SETTINGS) == [s["name"] for s in SETTINGS]
    # exact only without processing: under top-p alone it is lossy (a weak mutant, kept in the power figure)
    assert ex.harmless_settings("q from raw logits", SETTINGS) == ["T=1"]
    assert ex.harmless_settings("residual from p", SETTINGS) == []


def test_prompt_lookup_drafts_on_a_prompt_with_repeats(toy8):
    """The audit's count of drafted tokens: transformers' prompt lookup drafts on a prompt that repeats itself (its
    first step finds a match) and plain generate never does; the count reads the positions each pass feeds."""
    runners = peers.audit_runners(toy8, 3, k=2)
    shares = {}
    for name in ("transformers generate", "transformers prompt lookup"):
        log = []
        run = ex.counting_runner(runners[name], toy8.target, log)
        table = ex.audit(run, toy8, [[4, 3, 1, 4, 3, 1, 4]], SETTINGS[:1], 20, 3, name=name)
        assert len(log) == 20 and len(table) == 1
        shares[name] = ex.drafted_share(log)
    assert shares["transformers generate"]["drafted"] == 0 and shares["transformers generate"]["accepted"] == 0
    lookup = shares["transformers prompt lookup"]
    assert lookup["with_draft"] == 1.0 and lookup["drafted"] > 0.5 and lookup["accepted"] > 0, lookup


def test_bad_runners_and_arguments_are_named(toy8):
    def short(ids, setting, seed):
        return [1]

    def floats(ids, setting, seed):
        return [1.5, 2.0, 3.0]

    with pytest.raises(ValueError, match="returned 1 token"):
        ex.audit(short, toy8, [PROMPT], SETTINGS[:1], 4, LENGTH, name="short")
    with pytest.raises(ValueError, match="not a token id"):
        ex.audit(floats, toy8, [PROMPT], SETTINGS[:1], 4, LENGTH, name="floats")
    with pytest.raises(ValueError, match="runner must be a callable"):
        ex.audit("generate", toy8, [PROMPT], SETTINGS[:1], 4, LENGTH)
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        ex.audit(short, toy8, [PROMPT], SETTINGS[:1], 1, LENGTH)
    with pytest.raises(ValueError, match="unknown mutant"):
        ex.mutant_runner(toy8, "no such bug", LENGTH)
    with pytest.raises(ValueError, match="has no 'nope' drafter"):
        ex.library_runner(toy8, "linear:nope", LENGTH)


def test_a_setting_without_a_name_is_named_from_its_knobs(toy8):
    unnamed = [{"temperature": 1.0}, {"temperature": 0.7, "top_k": 4, "top_p": 0.9}]
    table = ex.audit(ex.library_runner(toy8, "autoregressive", 2), toy8, [PROMPT], unnamed, 20, 2)
    assert table.setting.tolist() == ["T=1", "T=0.7, top-k=4, top-p=0.9"]
    assert ex.lossy_settings("q from raw logits", unnamed) == ["T=0.7, top-k=4, top-p=0.9"]
    assert [ex.setting_name(s) for s in SETTINGS] == ["T=1", "T=0.7, top-k=4", "top-p=0.9"]  # a name is kept


def test_the_script_audits_a_readers_runner():
    script = str(REPO_ROOT / "scripts" / "audit_decoder.py")
    ok = subprocess.run([sys.executable, script, "specdec_core.study.exactness:example_runner", "--n", "100",
                         "--mutants", "residual from p"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "every row passes" in ok.stdout and "T=0.7, top-k=4" in ok.stdout
    assert "no rejection; power" in ok.stdout and "against mutant residual from p" in ok.stdout, ok.stdout[-600:]
    bad = subprocess.run([sys.executable, script, "no_such_module:f"], capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode != 0 and "cannot import module 'no_such_module'" in bad.stderr


def test_the_audit_catches_a_decoder_that_ignores_the_setting(toy8):
    """A decoder that always samples at T = 1 (a setting dropped on the way in) fails where the setting matters."""
    plain = ex.library_runner(toy8, "linear:model", LENGTH)

    def deaf(ids, setting, seed):
        return plain(ids, {"name": setting["name"], "temperature": 1.0}, seed)

    table = ex.audit(deaf, toy8, [PROMPT], SETTINGS, N, LENGTH, alpha=ALPHA, name="deaf")
    assert table.set_index("setting").passed.to_dict() == {"T=1": True, "T=0.7, top-k=4": False, "top-p=0.9": False}


def test_a_row_without_power_never_reads_pass():
    """A row the test could not have failed (power below 0.5 against the weakest known mutant, or unknown) is not a
    pass: it says "no verdict" with its power; a rejected row fails whatever its power. The mutant, "pass" for every
    row not rejected (the rule it replaced), is what the counts below would catch."""
    import pandas as pd

    from specdec_core.study import exactness as ex

    table = pd.DataFrame(dict(passed=[True, True, True, False, True], power=[0.9, 0.00056, 0.49, 0.01, float("nan")]))
    table["verdict"] = ex.audit_verdicts(table)
    assert table.verdict.tolist() == ["pass", "no verdict (power 0.00056)", "no verdict (power 0.49)", "FAIL",
                                      "no verdict (power not known)"]
    assert not ((table.power < ex.POWER_MIN) & (table.verdict == "pass")).any()
    assert ex.audit_counts(table) == "1 of 5 rows pass, 3 have no verdict (power below 0.5), 1 fail"
