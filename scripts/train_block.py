"""Train (or check) the block drafter for SmolLM2-135M-Instruct — the second step of ``make models``.

    python scripts/train_block.py                     # shipped block draft present and valid: nothing to do
    python scripts/train_block.py --force             # retrain, compare with the shipped block draft
    python scripts/train_block.py --force --install   # ... and replace the shipped one (maintainers)
    python scripts/train_block.py --write-card        # measure the shipped one and rewrite its MODEL_CARD.md

Recipe (:class:`BlockRecipe`, the only place its defaults live): the same self-distillation data as the
model draft (``scripts/train_drafts.py``'s teacher records, cached under ``data/train_cache/``), the
same top-k KD loss (:func:`specdec_core.distill.kd_loss`) and trainer (:func:`specdec_core.distill.train`).
The block draft starts from the shipped model draft (trunk, draft vocabulary) and adds ``max_block - 1``
mask embeddings; trunk and masks are trained together on every real response position (the next token,
block position 1) and on blocks of masks anchored every ``anchor_stride`` response positions (positions
2..max_block), all in one pass per batch (:func:`specdec_core.parallel.block_loss`). Deterministic given
the seed and thread count; the trainer's checkpoint makes an interrupted run resume where it stopped.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import specdec_core as sd  # noqa: E402
from specdec_core import distill, parallel, shipped  # noqa: E402
from specdec_core.draft_model import DraftModel  # noqa: E402
from train_drafts import CACHE, EOS, PAD, Recipe, teacher_records  # noqa: E402  (the model draft's data)

BLOCK_DIR = shipped.DRAFTS_DIR / "smollm2-135m-block"  # = shipped.BLOCK_DRAFT
FILES = ("config.json", "model.safetensors", parallel.MASKS_FILE)


def rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


@dataclass(frozen=True)
class BlockRecipe:
    seed: int = 0
    max_block: int = 8  # block positions 1..8: one real row + 7 masks
    anchor_stride: int = 4  # one block of masks every 4 response positions (offset: a hash of the prompt id)
    bf16_autocast: bool = True  # forward/backward under bfloat16 autocast (~1.5× faster on a CPU with AVX512-BF16)
    train: distill.TrainConfig = field(default_factory=lambda: distill.TrainConfig(
        steps=400, lr=5e-4, warmup=20, batch_tokens=2048, seed=0, ckpt_every=25))

    def key(self, init: str) -> str:
        return f"{zlib.crc32((json.dumps(asdict(self), sort_keys=True) + init).encode()):08x}"


def anchors_of(records: list[dict], stride: int) -> list[list[int]]:
    """Anchor positions (in :func:`distill.collate`'s rows) of each record: response positions a >= S (the
    first token comes from the target's prefill) every ``stride``, starting at a hash of the prompt id."""
    out = []
    for r in records:
        S, n = len(r["prompt"]), r["response"].numel()
        start = S + zlib.crc32(r["key"].encode()) % stride
        out.append(list(range(start, S + n - 1, stride)))  # rows < S + n - 1 = the collated length
    return out


def block_step(slots, recipe: BlockRecipe):
    """``step_loss`` for :func:`distill.train`."""

    def step_loss(model, recs):
        b = distill.collate(recs, slots, PAD)
        with torch.autocast(model.head.device.type, dtype=torch.bfloat16, enabled=recipe.bf16_autocast):
            loss, n, _ = parallel.block_loss(model, b, anchors_of(recs, recipe.anchor_stride),
                                             recipe.max_block, distill.kd_loss)
        return loss, n

    return step_loss


def init_draft(pair, train_recs: list[dict]) -> tuple[DraftModel, str]:
    """The shipped model draft (checksummed) if there is one; else a fresh draft from the model draft's recipe
    (its target layers and draft vocabulary), which then has to learn block position 1 as well."""
    if shipped.is_present(shipped.MODEL_DRAFT):
        sums = shipped.verify(shipped.MODEL_DRAFT)
        draft = shipped.load_model_draft(pair.target)
        if isinstance(draft, DraftModel):
            return draft, "model-draft:" + sums["model.safetensors"]
        print(f"the shipped model draft is a {type(draft).__name__}, not a DraftModel: starting from the target's layers")
    r = Recipe()
    vocab = distill.choose_draft_vocab(train_recs, r.draft_vocab, pair.target.config.vocab_size, always=(EOS,))
    return DraftModel.from_target(pair.target, list(r.layers), vocab), f"target-layers:{list(r.layers)}"


# -- teacher-forced acceptance by block position ----------------------------------------------------
@torch.no_grad()
def accept_runs(model: parallel.BlockDraftModel, records: list[dict], K: int) -> dict:
    """Greedy acceptance by block position, teacher-forced on the target's greedy responses.

    At every anchor a (a response position with K tokens after it) a greedy step would accept the run of
    draft tokens equal to the target's greedy continuation, which *is* the recorded response. Block draft:
    one masked pass predicts positions 1..K from x_<=a. Autoregressive draft (the block draft's own trunk
    at real rows, = the model draft it started from, up to training): token j is right iff rows a..a+j-1
    all match (its drafts equal the response while they are accepted). Returns ``{"block": [P(run >= j)],
    "ar": [...], "anchors": n}`` for j = 1..K.
    """
    V = model.config.vocab_size
    runs = {"block": [], "ar": []}
    for r in records:
        if r["mode"] != "greedy":
            continue
        seq = torch.cat([r["prompt"], r["response"]]).long()
        S, n = len(r["prompt"]), r["response"].numel()
        anchors = list(range(S, S + n - K))
        if not anchors:
            continue
        ids = seq[:-1].view(1, -1)
        lay = parallel.block_batch([ids.shape[1]], [anchors], K, V)
        bias = torch.zeros(lay["allowed"].shape, dtype=model.head.dtype).masked_fill_(
            ~lay["allowed"], torch.finfo(model.head.dtype).min)[:, None]
        h = model.hidden(torch.cat([ids, lay["ids_tail"]], 1), attention_mask=bias, position_ids=lay["positions"],
                         use_cache=False).last_hidden_state[0]
        pred = model.vocab[model.sub_logits(h).argmax(-1)]  # [L + M]
        L = ids.shape[1]
        real_ok = pred[:L] == seq[1:]  # row t predicts token t + 1
        for i, a in enumerate(anchors):
            block = torch.cat([real_ok[a:a + 1], pred[L + i * (K - 1):L + (i + 1) * (K - 1)] == seq[a + 2:a + K + 1]])
            runs["block"].append(int(block.long().cumprod(0).sum()))
            runs["ar"].append(int(real_ok[a:a + K].long().cumprod(0).sum()))
    out = {name: [sum(x >= j for x in v) / max(len(v), 1) for j in range(1, K + 1)] for name, v in runs.items()}
    out["anchors"] = len(runs["block"])
    return out


# -- the run ----------------------------------------------------------------------------------------
def run(recipe: BlockRecipe, progress=True) -> tuple[parallel.BlockDraftModel, dict]:
    """Train under ``data/train_cache/block-<key>/`` (resumable); the result lands in its ``final/``."""
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    pair = sd.load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    train_recs, val_recs, info = teacher_records(pair, Recipe(), progress)
    base, init = init_draft(pair, train_recs)
    slots = distill.slot_map(base.vocab, pair.target.config.vocab_size)
    model = parallel.BlockDraftModel.from_draft(base, recipe.max_block, seed=recipe.seed).train().requires_grad_(True)
    run_dir = CACHE / f"block-{recipe.key(init)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "final"
    before = accept_runs(model, val_recs, recipe.max_block)
    hist = distill.train(model, block_step(slots, recipe), train_recs, recipe.train, ckpt=run_dir / "ckpt.pt",
                         progress=progress)
    meta = dict(recipe=asdict(recipe), init=init)
    parallel.save_block(model, out, meta=meta)
    model = parallel.load_block(out, pair.target)  # what ships (float16 trunk) is what gets measured
    after = accept_runs(model, val_recs, recipe.max_block)
    info.update(train_seconds=round(hist["seconds"], 1), resumed_at_step=hist["resumed_at"],
                final_loss=round(sum(hist["losses"][-20:]) / len(hist["losses"][-20:]), 4),
                val_accept_by_position=dict(block=[round(x, 4) for x in after["block"]],
                                            model_draft=[round(x, 4) for x in before["ar"]],
                                            block_trunk_as_ar=[round(x, 4) for x in after["ar"]],
                                            untrained_masks=[round(x, 4) for x in before["block"]],
                                            anchors=after["anchors"]),
                total_seconds=round(time.perf_counter() - t0, 1))
    info.pop("plan", None)
    parallel.save_block(model, out, meta=dict(meta, training=info))
    shipped.write_sums(out, FILES)
    (run_dir / "losses.json").write_text(json.dumps(hist["losses"]))
    return model, dict(info, pair=pair, val_records=val_recs, out=out)


# -- the model card ----------------------------------------------------------------------------------
def measure_cost(pair, block, prompt_ids, ks, repeats=30) -> dict:
    """Median ms (and IQR) of one proposal per K, block vs model draft, interleaved in one run."""
    timers = dict(block=parallel.proposal_timer(block, prompt_ids))
    if "model" in pair.drafters:
        timers["model"] = parallel.proposal_timer(pair.drafters["model"], prompt_ids)
    times = {(n, k): [] for n in timers for k in ks}
    for r in range(repeats + 3):
        for n, timer in timers.items():
            for k in (ks if r % 2 == 0 else ks[::-1]):
                dt = timer(k)
                if r >= 3:
                    times[n, k].append(dt * 1e3)
    out = {}
    for (n, k), v in times.items():
        q = statistics.quantiles(v, n=4)
        out[f"{n}:{k}"] = dict(median=statistics.median(v), q1=q[0], q3=q[2])
    return out


def write_card(folder: Path, cost: dict, ks) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    rec, tr = cfg["recipe"], cfg["training"]
    sums = shipped.read_sums(folder)
    acc = tr["val_accept_by_position"]
    mb = sum((folder / f).stat().st_size for f in FILES) / 1e6
    cond = lambda xs: [xs[0]] + [b / a if a else float("nan") for a, b in zip(xs, xs[1:])]  # noqa: E731
    lines = [
        "# smollm2-135m-block — a one-pass block drafter for SmolLM2-135M-Instruct",
        "",
        f"The model draft's {cfg['num_hidden_layers']}-layer Llama trunk (between the target's frozen token embedding and",
        f"a frozen {cfg['draft_vocab_size']}-token slice of its tied LM head) plus {cfg['max_block'] - 1} learned mask",
        "embeddings: one pass over `[unseen tokens…, last token, MASK_1 … MASK_{K-1}]` predicts K tokens (block",
        "positions 1..K). Loaded by `sd.load_pair(\"smollm2-135m\")` as `.drafters[\"block\"]` after its SHA-256",
        "checksums pass; use it with `sd.generate(..., method=\"parallel\", drafter=pair.drafters[\"block\"], k=K)`.",
        "Outside its vocabulary q = 0 and every q_i depends on the committed context only: lossless at any temperature.",
        "",
        "## Files",
        f"- `model.safetensors`: trunk (float16) + `draft_vocab` — SHA-256 `{sums['model.safetensors']}`",
        f"- `{parallel.MASKS_FILE}`: mask embeddings `[{cfg['max_block'] - 1}, {cfg['hidden_size']}]` (float32) — "
        f"SHA-256 `{sums[parallel.MASKS_FILE]}`",
        f"- `config.json`: architecture, recipe, training log — SHA-256 `{sums['config.json']}`",
        f"- `SHA256SUMS` (`sha256sum -c SHA256SUMS`); {mb:.1f} MB in all",
        "",
        "## Recipe",
        f"- initialised from `{cfg['init']}` (the shipped model draft: `model-draft:<sha256 of its weights>`); masks: mean"
        " token embedding + seeded noise",
        "- data: the model draft's self-distillation records (`scripts/train_drafts.py`: the target's greedy and T=1",
        f"  answers to `data/prompts/train.jsonl`, disjoint from the eval mix): {tr['train_records']} training records,"
        f" {tr['train_tokens']} response tokens; teacher folder `{tr['teacher_folder']}`",
        "- loss: top-k KD (`distill.kd_loss`) at every real response row (block position 1) and at every mask of",
        f"  blocks anchored every {rec['anchor_stride']} response positions (MASK_j of anchor a learns the target's law"
        " at a + j + 1), one 4D-masked pass per batch",
        f"- optimiser: {json.dumps(rec['train'])}; seed {rec['seed']}",
        f"- training {tr['train_seconds']} s (total {tr['total_seconds']} s with data loading and evaluation) on 2 CPU cores;"
        f" final loss {tr['final_loss']}",
        "- reproduce: `make models FORCE=1`; re-measure: `python scripts/train_block.py --write-card`",
        "",
        f"## Acceptance by block position (greedy, teacher-forced on {acc['anchors']} anchors of held-out training prompts)",
        "",
        "P(the step accepts ≥ j tokens) and, in brackets, P(position j accepted | 1..j−1 accepted):",
        "",
        "| j | block draft | model draft (K passes) | untrained masks |",
        "|---|---|---|---|",
    ]
    for j, (b, a, u, cb, ca) in enumerate(zip(acc["block"], acc["model_draft"], acc["untrained_masks"],
                                              cond(acc["block"]), cond(acc["model_draft"])), 1):
        lines.append(f"| {j} | {b:.3f} ({cb:.2f}) | {a:.3f} ({ca:.2f}) | {u:.3f} |")
    lines += [
        "",
        f"Expected accepted tokens per step at K = {len(acc['block'])}: block {sum(acc['block']):.2f}, model draft "
        f"{sum(acc['model_draft']):.2f}.",
        "",
        "## Draft cost versus K (one proposal, one unseen token, ~100-token context; interleaved, one run)",
        "",
        "| K | block: ms (IQR) | model draft: ms (IQR) |",
        "|---|---|---|",
    ]
    nan = dict(median=float("nan"), q1=float("nan"), q3=float("nan"))
    for k in ks:
        b, m = cost[f"block:{k}"], cost.get(f"model:{k}", nan)
        lines.append(f"| {k} | {b['median']:.2f} ({b['q1']:.2f}–{b['q3']:.2f}) | {m['median']:.2f} ({m['q1']:.2f}–{m['q3']:.2f}) |")
    ratio = lambda n, k: cost.get(f"{n}:{k}", nan)["median"] / cost.get(f"{n}:1", nan)["median"]  # noqa: E731
    lines += [
        "",
        f"Block draft: cost(K={max(ks)}) / cost(K=1) = **{ratio('block', max(ks)):.2f}**, cost(K={max(ks)}) / cost(K=2) ="
        f" {ratio('block', max(ks)) / ratio('block', 2):.2f} (model draft: {ratio('model', max(ks)):.2f}). A one-token pass"
        " is a matrix-vector product on a CPU; every longer pass is a small matrix-matrix product.",
        "End-to-end speed against linear and tree decoding: `book/05_parallel.py`. Timings depend on the machine and its load.",
        "",
    ]
    path = folder / "MODEL_CARD.md"
    path.write_text("\n".join(lines))
    return path


def card(folder: Path) -> Path:
    pair = sd.load_pair("smollm2-135m")
    block = parallel.BlockDrafter(parallel.load_block(folder, pair.target))
    ids = sd.prompts.encode(pair, sd.load_prompts()[0])
    ctx = (ids.tolist() * (100 // ids.numel() + 1))[:100]
    ks = list(range(1, block.max_block + 1))
    return write_card(folder, measure_cost(pair, block, ctx, ks), ks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--force", action="store_true", help="retrain even though a valid shipped block draft exists")
    ap.add_argument("--install", action="store_true", help="copy the retrained block draft over the shipped one")
    ap.add_argument("--write-card", action="store_true", help="measure the shipped block draft, rewrite MODEL_CARD.md")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.write_card and not args.force:
        shipped.verify(BLOCK_DIR)
        print("wrote", rel(card(BLOCK_DIR)))
        return 0
    if not args.force:
        if shipped.is_present(BLOCK_DIR):
            sums = shipped.verify(BLOCK_DIR)
            print(f"shipped block draft {rel(BLOCK_DIR)} is valid (model.safetensors sha256 "
                  f"{sums['model.safetensors'][:16]}…); nothing to train (make models FORCE=1 retrains)")
            return 0
        print(f"no shipped block draft in {rel(BLOCK_DIR)}: training one")
    recipe = BlockRecipe()
    t = time.perf_counter()
    model, ctx = run(recipe)
    out = ctx["out"]
    acc = ctx["val_accept_by_position"]
    print(f"\ntrained in {time.perf_counter() - t:.0f} s (training {ctx['train_seconds']} s); held-out greedy "
          f"P(accept >= j): block {acc['block']}, model draft {acc['model_draft']}; weights in {rel(out)}")
    if args.force and shipped.is_present(BLOCK_DIR):
        same = shipped.read_sums(out)["model.safetensors"] == shipped.read_sums(BLOCK_DIR)["model.safetensors"]
        old = json.loads((BLOCK_DIR / "config.json").read_text())["training"]["val_accept_by_position"]["block"]
        print(f"retrained vs shipped: weights bitwise identical {same}; P(accept >= j) shipped {old}")
    if args.install or not shipped.is_present(BLOCK_DIR):
        BLOCK_DIR.mkdir(parents=True, exist_ok=True)
        for name in (*FILES, shipped.SUMS):
            shutil.copy2(out / name, BLOCK_DIR / name)
        print("installed the block draft in", rel(BLOCK_DIR))
        print("wrote", rel(card(BLOCK_DIR)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
