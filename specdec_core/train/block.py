"""Training the block draft: many blocks per sequence in one pass, and the block draft's recipe (its command
line: ``scripts/train_block.py``, the second step of ``make models``).

Every training sequence is followed by blocks of masks anchored at positions a; MASK_j of anchor a sits at
position a + j and sees the real tokens ≤ a and its own block's earlier masks: the inference pass of
:class:`specdec_core.drafters.BlockDrafter`, reproduced for many anchors at once by a 4D attention mask.

Recipe (:class:`BlockRecipe`, the only place its defaults live): the same self-distillation data as the
model draft (:func:`specdec_core.train.teacher.teacher_records`, cached under ``data/train_cache/``), the same
top-k KD loss (:func:`specdec_core.train.distill.kd_loss`) and trainer (:func:`specdec_core.train.distill.train`).
The block draft starts from the shipped model draft (trunk, draft vocabulary) and adds ``max_block - 1`` mask
embeddings; trunk and masks are trained together on every real response position (the next token, block
position 1) and on blocks of masks anchored every ``anchor_stride`` response positions (positions
2..max_block), all in one pass per batch (:func:`block_loss`). Deterministic given the seed and thread count;
the trainer's checkpoint makes an interrupted run resume where it stopped.
"""
from __future__ import annotations

import json
import statistics
import time
import warnings
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..data.prompts import encode, load_prompts
from ..drafters import BlockDrafter
from ..models import shipped
from ..models.block import MASKS_FILE, BlockDraftModel, load_block, save_block
from ..models.draft import DraftModel
from ..models.hub import load_pair
from ..study.bench import proposal_timer
from ..tree import attention_bias
from . import distill
from .drafts import FIRST, Recipe, mean_tail
from .teacher import CACHE, EOS, PAD, teacher_records


def block_batch(lengths: list[int], anchors: list[list[int]], K: int, V: int) -> dict:
    """Lay out training blocks after right-padded sequences of ``lengths`` (padded to L = max).

    anchors[b]: positions a (< lengths[b]) that start a block; MASK_j (j = 1..K-1) of anchor a goes to
    position a + j and attends to the real tokens <= a and to MASK_1..MASK_j of its own block.
    Returns ``ids_tail [B, M]`` (mask ids, ``V`` in unused slots), ``positions [B, L + M]``,
    ``allowed [B, L + M, L + M]`` (bool), ``src [B, M]`` (the anchor's position, -1 unused) and
    ``offset [B, M]`` (j), with M = max anchors × (K - 1).
    """
    B, L, J = len(lengths), max(lengths), K - 1
    M = max((len(a) for a in anchors), default=0) * J
    T = L + M
    allowed = torch.zeros(B, T, T, dtype=torch.bool)
    allowed[:, :L, :L] = torch.ones(L, L, dtype=torch.bool).tril()
    positions = torch.arange(T).repeat(B, 1)
    ids_tail = torch.full((B, M), V, dtype=torch.long)
    src = torch.full((B, M), -1, dtype=torch.long)
    offset = torch.zeros((B, M), dtype=torch.long)
    idx = torch.arange(T)
    for b, anc in enumerate(anchors):
        for i, a in enumerate(anc):
            if not 0 <= a < lengths[b]:
                raise ValueError(f"anchor {a} outside sequence {b} of length {lengths[b]}")
            s = L + i * J  # first slot of this block
            rows = slice(s, s + J)
            allowed[b, rows, : a + 1] = True  # the real prefix x_0..x_a
            allowed[b, rows, s:s + J] = torch.ones(J, J, dtype=torch.bool).tril()  # earlier masks of the block
            positions[b, rows] = a + torch.arange(1, J + 1)
            ids_tail[b, i * J:(i + 1) * J] = V + torch.arange(J)
            src[b, i * J:(i + 1) * J] = a
            offset[b, i * J:(i + 1) * J] = torch.arange(1, J + 1)
        unused = idx[L + len(anc) * J:]
        allowed[b, unused, unused] = True  # idle slots see themselves only (no empty softmax rows)
    return dict(ids_tail=ids_tail, positions=positions, allowed=allowed, src=src, offset=offset)


def block_loss(model: BlockDraftModel, batch: dict, anchors: list[list[int]], K: int, loss_fn):
    """KD loss of one training batch: every real row (the autoregressive loss, offset 1) and every mask row.

    ``batch``: :func:`specdec_core.train.distill.collate` output (``input_ids``, ``t_slot``, ``t_logp``
    ``[B, L, k]``, row t = the teacher's law for token t + 1). MASK_j of anchor a is taught row a + j.
    ``loss_fn(sub_logits, t_slot, t_logp) -> (loss, n)`` (:func:`specdec_core.train.distill.kd_loss`).
    Returns ``(loss, n_positions, per_position)``: per_position ``[K + 1]`` counts the taught rows by block
    position (1: real rows, the next token; j + 1: MASK_j).
    """
    ids, t_slot, t_logp = batch["input_ids"], batch["t_slot"], batch["t_logp"]
    B, L = ids.shape
    lengths = batch["attention_mask"].sum(1).tolist()
    lay = block_batch(lengths, anchors, K, model.config.vocab_size)
    full = torch.cat([ids, lay["ids_tail"]], 1)
    dev = model.head.device
    bias = torch.zeros(lay["allowed"].shape, dtype=model.head.dtype).masked_fill_(
        ~lay["allowed"], torch.finfo(model.head.dtype).min)[:, None]
    h = model.hidden(full.to(dev), attention_mask=bias.to(dev), position_ids=lay["positions"].to(dev),
                     use_cache=False).last_hidden_state  # [B, L + M, H]
    # teacher rows: real row t -> t; mask (a, j) -> a + j (invalid beyond the sequence: slot -1)
    row = torch.cat([torch.arange(L).repeat(B, 1), lay["src"] + lay["offset"]], 1)
    ok = torch.cat([torch.arange(L).repeat(B, 1) < torch.tensor(lengths)[:, None],
                    (lay["src"] >= 0) & (lay["src"] + lay["offset"] < torch.tensor(lengths)[:, None])], 1)
    bi = torch.arange(B)[:, None].expand_as(row)
    slot = torch.where(ok[..., None], t_slot[bi, row.clamp_max(L - 1)], torch.full_like(t_slot[:1, :1], -1))
    logp = t_logp[bi, row.clamp_max(L - 1)]
    valid = (slot >= 0).any(-1)
    loss, n = loss_fn(model.sub_logits(h[valid.to(dev)])[None], slot[valid][None].to(dev), logp[valid][None].to(dev))
    pos = torch.cat([torch.zeros(B, L, dtype=torch.long), lay["offset"]], 1)[valid] + 1
    return loss, n, torch.bincount(pos, minlength=K + 1)


# -- the recipe -------------------------------------------------------------------------------------
BLOCK_DIR = shipped.BLOCK_DRAFT
FILES = ("config.json", "model.safetensors", MASKS_FILE)


@dataclass(frozen=True)
class BlockRecipe:
    seed: int = 0
    max_block: int = 8  # block positions 1..8: one real row + 7 masks
    anchor_stride: int = 4  # one block of masks every 4 response positions (offset: a hash of the prompt id)
    bf16_autocast: bool = True  # forward/backward under bfloat16 autocast (faster on CPUs with AVX512-BF16)
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
            loss, n, _ = block_loss(model, b, anchors_of(recs, recipe.anchor_stride), recipe.max_block,
                                    distill.kd_loss)
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
        warnings.warn(f"the shipped model draft is a {type(draft).__name__}, not a DraftModel: starting from the "
                      "target's layers")
    r = Recipe()
    vocab = distill.choose_draft_vocab(train_recs, r.draft_vocab, pair.target.config.vocab_size, always=(EOS,))
    return DraftModel.from_target(pair.target, list(r.layers), vocab), f"target-layers:{list(r.layers)}"


# -- teacher-forced acceptance by block position ----------------------------------------------------
@torch.no_grad()
def accept_runs(model: BlockDraftModel, records: list[dict], K: int) -> dict:
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
        lay = block_batch([ids.shape[1]], [anchors], K, V)
        bias = attention_bias(lay["allowed"], 0, model.head.dtype, ids.device)
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
def run(recipe: BlockRecipe, progress=True) -> tuple[BlockDraftModel, dict]:
    """Train under ``data/train_cache/block-<key>/`` (resumable); the result lands in its ``final/``
    (returned as ``out`` with the training log)."""
    torch.manual_seed(recipe.seed)
    t0 = time.perf_counter()
    pair = load_pair("smollm2-135m")
    pair.target.requires_grad_(False)
    train_recs, val_recs, info = teacher_records(pair, FIRST, progress)  # the first draft's data
    base, init = init_draft(pair, train_recs)
    slots = distill.slot_map(base.vocab, pair.target.config.vocab_size)
    model = BlockDraftModel.from_draft(base, recipe.max_block, seed=recipe.seed).train().requires_grad_(True)
    run_dir = CACHE / f"block-{recipe.key(init)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out = run_dir / "final"
    before = accept_runs(model, val_recs, recipe.max_block)
    hist = distill.train(model, block_step(slots, recipe), train_recs, recipe.train, ckpt=run_dir / "ckpt.pt",
                         progress=progress)
    meta = dict(recipe=asdict(recipe), init=init)
    save_block(model, out, meta=meta)
    model = load_block(out, pair.target)  # what ships (float16 trunk) is what gets measured
    after = accept_runs(model, val_recs, recipe.max_block)
    info.update(train_seconds=round(hist["seconds"], 1), resumed_at_step=hist["resumed_at"],
                final_loss=mean_tail(hist["losses"], 20),
                val_accept_by_position=dict(block=[round(x, 4) for x in after["block"]],
                                            model_draft=[round(x, 4) for x in before["ar"]],
                                            block_trunk_as_ar=[round(x, 4) for x in after["ar"]],
                                            untrained_masks=[round(x, 4) for x in before["block"]],
                                            anchors=after["anchors"]),
                total_seconds=round(time.perf_counter() - t0, 1))
    info.pop("plan", None)
    save_block(model, out, meta=dict(meta, training=info))
    shipped.write_sums(out, FILES)
    (run_dir / "losses.json").write_text(json.dumps(hist["losses"]))
    return model, dict(info, pair=pair, val_records=val_recs, out=out)


def compare_with_shipped(out: Path) -> dict | None:
    """A retrained block draft in ``out`` against the shipped one: ``same_files`` (weights bitwise identical)
    and the shipped draft's held-out ``accept_by_position``; None without a shipped block draft."""
    if not shipped.is_present(BLOCK_DIR):
        return None
    same = shipped.read_sums(out)["model.safetensors"] == shipped.read_sums(BLOCK_DIR)["model.safetensors"]
    old = json.loads((BLOCK_DIR / "config.json").read_text())["training"]["val_accept_by_position"]["block"]
    return dict(same_files=same, accept_by_position=old)


# -- the model card ----------------------------------------------------------------------------------
def measure_cost(pair, block, prompt_ids, ks, repeats=30) -> dict:
    """Median ms (and IQR) of one proposal per K, block vs model draft, interleaved in one run. (Not
    :func:`~specdec_core.study.profiling.time_interleaved`: :func:`proposal_timer` times the proposal alone,
    without the cache rollback around it.)"""
    timers = dict(block=proposal_timer(block, prompt_ids))
    if "model" in pair.drafters:
        timers["model"] = proposal_timer(pair.drafters["model"], prompt_ids)
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
        f"- `{MASKS_FILE}`: mask embeddings `[{cfg['max_block'] - 1}, {cfg['hidden_size']}]` (float32) — "
        f"SHA-256 `{sums[MASKS_FILE]}`",
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


def card(folder: Path = BLOCK_DIR) -> Path:
    """Measure the block draft in ``folder`` against the shipped model draft and (re)write its MODEL_CARD.md."""
    pair = load_pair("smollm2-135m")
    block = BlockDrafter(load_block(folder, pair.target))
    ids = encode(pair, load_prompts()[0])
    ctx = (ids.tolist() * (100 // ids.numel() + 1))[:100]
    ks = list(range(1, block.max_block + 1))
    return write_card(folder, measure_cost(pair, block, ctx, ks), ks)
