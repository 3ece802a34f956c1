"""The shipped model draft (issue 4): checksums, refusal of a corrupt copy, greedy exactness with it."""
import json
import shutil
import warnings
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import specdec_core as sd
from specdec_core.tools import drafteval
from specdec_core.study import exactness as ex
from specdec_core.models import shipped
from specdec_core.models.draft import DraftModel
from specdec_core.train import drafts

pytestmark = pytest.mark.slow


def test_shipped_draft_is_present_and_valid():
    assert shipped.is_present(), f"no shipped draft in {shipped.MODEL_DRAFT}: `make models` trains one"
    sums = shipped.verify(shipped.MODEL_DRAFT)
    assert set(shipped.REQUIRED) <= set(sums)
    assert (shipped.MODEL_DRAFT / "model.safetensors").stat().st_size <= 20e6
    assert (shipped.MODEL_DRAFT / "MODEL_CARD.md").exists()


def test_pair_carries_the_draft(smol):
    assert set(smol.drafters) >= {"model", "ngram"}
    assert smol.drafter is smol.drafters["model"]
    draft = smol.drafter.model
    assert isinstance(draft, DraftModel)
    # embedding and head are the target's, shared in memory (not copies on disk or in parameters())
    assert draft.embedding is smol.target.get_input_embeddings()
    assert all(p.data_ptr() != smol.target.get_input_embeddings().weight.data_ptr() for p in draft.parameters())
    assert torch.equal(draft.head, smol.target.get_input_embeddings().weight[draft.vocab])


def test_corrupt_copy_is_refused(tmp_path, smol):
    bad = tmp_path / "draft"
    shutil.copytree(shipped.MODEL_DRAFT, bad)
    w = bad / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside a weight tensor
    w.write_bytes(bytes(data))
    with pytest.raises(shipped.CorruptDraft, match="model.safetensors"):
        shipped.load_model_draft(smol.target, folder=bad)
    (bad / "config.json").unlink()
    with pytest.raises(shipped.CorruptDraft, match="config.json.*missing"):
        shipped.verify(bad)


def test_draft_law_is_zero_outside_its_vocabulary(smol, smol_prompt):
    draft = smol.drafter.model
    with torch.no_grad():
        logits = draft(input_ids=smol_prompt.view(1, -1)).logits[0]  # [S, V]
    outside = torch.ones(logits.shape[-1], dtype=torch.bool)
    outside[draft.vocab] = False
    assert torch.isneginf(logits[:, outside]).all() and torch.isfinite(logits[:, ~outside]).all()
    q = sd.process_logits(logits[-1], sd.SamplingParams(temperature=1.0))
    assert float(q[outside].sum()) == 0.0


@pytest.mark.parametrize("text", ["Give me three tips for writing clear Python code.",
                                  "Summarize in one sentence: The library will close early on Friday "
                                  "because the heating system is being repaired."])
def test_linear_with_draft_equals_autoregressive(smol, text):
    """float32: equal except at a near-tie of the target (top-2 logit gap < 1e-3), which is reported."""
    ids = smol.encode_chat(text)
    ar = sd.generate(smol.target, ids, max_new_tokens=40)
    sp = sd.generate(smol.target, ids, drafter=smol.drafter, method="linear", k=4, max_new_tokens=40)
    assert sp.stats["draft_passes"] > 0
    i, gap = ex.first_divergence(smol.target, ids, sp.tokens, ar.tokens)
    if i is not None:
        assert ex.excused(i, gap), f"linear with the draft diverges at token {i}, not a near-tie (top-2 gap {gap})"
        warnings.warn(f"near-tie divergence at token {i}: top-2 logit gap {gap:.2e}")


def _curve(tmp_path, teacher: dict) -> Path:
    point = dict(layers=1, tokens=1_300_000, heldout={"all": dict(greedy_alpha=0.6)},
                 eval={"all": dict(greedy_alpha=0.45, t1_alpha=0.4)}, eval_predicted_speedup=1.4, eval_best_k=3)
    path = tmp_path / "draft_curve.json"
    path.write_text(json.dumps(dict(points=[point], teacher=teacher, ship_rule="the rule",
                                    ship_rule_choice=dict(layers=1, share=1.0, tokens=1_300_000))))
    return path


def test_card_names_the_curve_s_teacher_set_and_whether_its_draft_is_the_rule_s_choice(tmp_path):
    wide = "\n".join(drafteval.curve_lines(_curve(tmp_path, dict(set="wide")), drafted=(1, 1_300_000)))
    assert "train_wide.jsonl" in wide and "| 1 | 1300k | 0.600 | 0.450 | 0.400 | 1.40× (K = 3) |" in wide
    assert "is that choice" in wide
    pilot = "\n".join(drafteval.curve_lines(_curve(tmp_path, {}), drafted=(2, 94_800)))  # the first curve: no "set"
    assert "train_more.jsonl" in pilot and "train_wide" not in pilot
    assert "(2 layer(s), 95k tokens) is not that choice" in pilot
    assert drafteval.curve_lines(tmp_path / "missing.json") == []


def test_card_data_line_names_the_recipe_s_teacher_set():
    plan = lambda n_g, n_s, m: dict(modes=[["greedy", 0.0, n_g], ["sample", 1.0, n_s]], max_new_tokens=m)
    first = drafteval.data_line(asdict(drafts.FIRST), dict(train_records=855, train_tokens=94_800,
                                                          plan=plan(700, 200, 128)))
    assert first.startswith("- data: `data/prompts/train.jsonl` (900 of its prompts;") and "94800 response tokens" in first
    assert "train_wide" not in first
    tr = dict(train_records=12000, train_tokens=1_234_567, stages=dict(writing=dict(plan=plan(900, 300, 320)),
                                                                     answers=dict(plan=plan(6750, 2250, 128))))
    wide = drafteval.data_line(asdict(drafts.Recipe()), tr)  # the shipped recipe: the wide set
    assert "900 greedily and 300 at temperature 1, up to 320 tokens" in wide
    assert "6750 greedily and 2250 at temperature 1, up to 128 tokens" in wide and "1234567 response tokens" in wide


def test_install_copies_the_draft_and_drops_the_replaced_weights_calibration(tmp_path):
    src, dest = tmp_path / "new", tmp_path / "shipped"
    src.mkdir(), dest.mkdir()
    for name in (*shipped.REQUIRED, shipped.SUMS):
        (src / name).write_text(f"new {name}")
        (dest / name).write_text(f"old {name}")
    (dest / "confidence.json").write_text("{}")  # calibrated for the old weights
    drafts.install(src, dest)
    assert all((dest / n).read_text() == f"new {n}" for n in (*shipped.REQUIRED, shipped.SUMS))
    assert not (dest / "confidence.json").exists()


def test_calibrate_confidence_runs_end_to_end_and_writes_nothing_on_a_dry_run():
    """The script's call into study.calibrate (it once passed ``repeats`` twice and could not start)."""
    import subprocess
    import sys

    from specdec_core.paths import REPO_ROOT as ROOT

    sums = (shipped.MODEL_DRAFT / shipped.SUMS).read_bytes() if (shipped.MODEL_DRAFT / shipped.SUMS).exists() else None
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "calibrate_confidence.py"), "--prompts", "1",
                           "--max-new-tokens", "4", "--fixed-ks", "1", "--thetas", "0.5", "--dry-run"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "chosen:" in proc.stdout and "wrote" not in proc.stdout
    if sums is not None:
        assert (shipped.MODEL_DRAFT / shipped.SUMS).read_bytes() == sums
