"""The chapters' shared set-up: what every notebook of ``book/`` starts with, in one call.

    from specdec_core.study import book
    ch = book.setup(out_dir, model=model, device=device, threads=threads, per_task=per_task)
    ch.pair, ch.prompts, ch.encoded            # the pair, the evaluation prompts, (prompt, ids) pairs
    ch.save(df, "name"); ch.savefig(fig, "name")  # CSVs and figures under out_dir

:func:`setup` applies the book's plotting theme, creates the output folder, sets the CPU thread count,
loads the model pair (checking that the drafters a chapter needs are there) and the prompts, and encodes
them with the chat template. It prints nothing; ``str(ch)`` is a one-line description for the notebook.
:func:`draw_tree` draws a tree of :mod:`specdec_core.tree` (chapter 4's figures).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.prompts import encode, load_prompts
from ..models import EMBEDDED, load_pair, resolve_device
from ..study import profiling

progress = profiling.progress_bar  # tqdm with few updates, and none in the executed book


ONE_POINT = "has one point (a sweep needs two values)"  # what tests/test_book_outputs.py looks for
ONE_POINT_NOTE = "figure {figure}: series {series!r} " + ONE_POINT + "; drawn as a marker"


def one_point_lines(fig, repair: bool = False) -> list[str]:
    """Names of the series in ``fig`` (a figure or a seaborn grid) drawn with a line style through exactly one
    finite point; ``repair``: give each a marker and no line style, so its point shows and nothing else.

    A series is named by its label, else by its error-bar container's, else by the legend proxy of its colour
    (seaborn draws its hue lines unlabelled and adds empty, labelled lines for the legend).
    """
    from matplotlib.figure import Figure

    fig = fig if isinstance(fig, Figure) else fig.figure  # a seaborn grid holds its figure
    found = []
    for ax in fig.axes:
        lines = ax.get_lines()
        names = {id(c.lines[0]): c.get_label() for c in ax.containers if hasattr(c, "has_xerr") and c.lines[0]}
        proxies = {str(ln.get_color()): ln.get_label() for ln in lines
                   if len(ln.get_xdata()) == 0 and not ln.get_label().startswith("_")}
        for line in lines:
            if line.get_linestyle() in ("None", "", " ") or not line.get_visible():
                continue
            x, y = (np.asarray(v, dtype=float) for v in line.get_data())
            if x.size != y.size or np.isfinite(x + y).sum() != 1:
                continue
            label = line.get_label()
            if label.startswith("_"):
                label = names.get(id(line)) or proxies.get(str(line.get_color()), f"unlabelled ({line.get_color()})")
            found.append(label)
            if repair:
                line.set_linestyle("None")
                if line.get_marker() in ("None", "", " ", None):
                    line.set_marker("o")
    return found


@dataclass
class Chapter:
    """What a chapter works with. ``encoded``: ``(Prompt, ids)`` per prompt; :attr:`bench_prompts`: the
    same as ``({"id", "task"}, ids)``, the form :func:`~specdec_core.study.bench.run_interleaved` takes.
    ``reference``: CSVs are tagged with the device and, on a GPU, also written to ``data/reference/<device>/``
    (:func:`~specdec_core.study.profiling.save_csv`)."""

    out: Path
    device: torch.device
    dtype: torch.dtype
    pair: object | None = None
    prompts: list = field(default_factory=list)
    encoded: list = field(default_factory=list)
    reference: bool = False
    load_s: float = 0.0
    draft: str | None = None  # the draft model the chapter was given (None: the target's own drafters)
    skipped: list = field(default_factory=list)  # (what, why) for each part this pair could not run

    @property
    def own_pair(self) -> bool:
        """Whether this is the book's own pair: the embedded target with its shipped drafts. A pair of one's own
        lacks what belongs to those drafts (a block draft, the θ and K stored with the draft, its learning curve,
        the GGUF comparison): chapters :meth:`skip` those parts, or choose the settings again."""
        return self.pair is not None and self.pair.name in EMBEDDED and self.draft is None

    def skip(self, what: str, why: str) -> None:
        """Skip ``what`` for this pair: printed now with its reason, listed again by :meth:`skipped_summary`."""
        self.skipped.append((what, why))
        print(f"skipped: {what} ({why})")

    def skipped_summary(self) -> str:
        """A summary's line naming every skipped part and why ("" when nothing was skipped)."""
        if not self.skipped:
            return ""
        return "- **Skipped for this pair**: " + "; ".join(f"{what} ({why})" for what, why in self.skipped) + "."

    @property
    def tag(self) -> str:
        """The hardware's name, as :func:`~specdec_core.study.profiling.device_tag` writes it."""
        return profiling.device_tag(self.device)

    @property
    def target(self):
        return self.pair.target

    @property
    def drafters(self) -> dict:
        return self.pair.drafters

    @property
    def bench_prompts(self) -> list[tuple[dict, torch.Tensor]]:
        return [(dict(id=p.id, task=p.task), ids) for p, ids in self.encoded]

    def save(self, df, name: str):
        """Write ``df`` to ``<out>/<name>.csv`` (see ``reference``); returns the frame written."""
        if self.reference:
            df = df.assign(device=self.tag)
            profiling.save_csv(df, name, self.out, self.device, tag=self.tag)
        else:
            df.to_csv(self.out / f"{name}.csv", index=False)
        return df

    def savefig(self, fig, name: str, dpi: int = 120) -> None:
        """Save ``fig`` (a matplotlib figure or a seaborn grid) as ``<out>/<name>.png``.

        A line through one point draws nothing (or suggests a trend that was not measured): each such series
        is redrawn as a marker and named in one printed line, ``ONE_POINT_NOTE`` (the CI book's test fails on it).
        """
        for label in one_point_lines(fig, repair=True):
            print(ONE_POINT_NOTE.format(figure=name, series=label))
        fig.savefig(self.out / f"{name}.png", dpi=dpi, bbox_inches="tight")

    def __str__(self):
        parts = [f"device {self.device}", f"{str(self.dtype).removeprefix('torch.')}",
                 f"{torch.get_num_threads()} thread(s)"]
        if self.pair is not None:
            n = sum(p.numel() for p in self.pair.target.parameters())
            parts.insert(0, f"{self.pair.name or 'target'}: {n / 1e6:.1f} M parameters, loaded in {self.load_s:.1f} s")
            parts.append("drafters " + ", ".join(sorted(self.pair.drafters)))
        if self.prompts:
            tasks = sorted({p.task for p in self.prompts})
            parts.append(f"{len(self.prompts)} prompts over {len(tasks)} task(s)")
        return "; ".join(parts)


def setup(out_dir, model: str | None = None, *, draft: str | None = None, device="cpu", dtype="float32",
          threads: int | None = None, per_task: int | None = None, tasks=None, prompt_file=None,
          need: tuple[str, ...] = (), reference: bool = False) -> Chapter:
    """A chapter's set-up.

    - the book's seaborn theme; ``out_dir`` created;
    - ``threads``: torch's intra-op thread count on a CPU (``None`` or 0: torch's default, every core);
    - ``model``: load the pair (:func:`~specdec_core.models.load_pair` with ``draft``, ``dtype``, ``device``);
      ``need``: drafter names the chapter cannot do without (a missing one raises, naming ``make models``);
    - ``per_task`` (with ``tasks``, ``prompt_file``): the evaluation prompts, encoded with the pair's chat
      template (:func:`~specdec_core.data.prompts.encode`).
    """
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dev = resolve_device(device)
    dt = profiling.resolve_dtype(dtype)
    if dev.type == "cpu" and threads:
        torch.set_num_threads(int(threads))
    ch = Chapter(out=out, device=dev, dtype=dt, reference=reference, draft=draft)
    if model is not None:
        t0 = time.perf_counter()
        ch.pair = load_pair(model, draft=draft, dtype=dt, device=dev)
        ch.load_s = time.perf_counter() - t0
        missing = [n for n in need if n not in ch.pair.drafters]
        if missing:
            raise RuntimeError(f"{model}: no {missing} drafter (the shipped drafts live in data/drafts/; "
                               "`make models` checks or retrains them)")
    if per_task is not None:
        if ch.pair is None:
            raise ValueError("prompts are encoded with the pair's tokenizer: give a model")
        ch.prompts = load_prompts(prompt_file, tasks=tasks, per_task=per_task)
        ch.encoded = [(p, encode(ch.pair, p)) for p in ch.prompts]
    return ch


def draw_tree(ax, tree, labels=None, path=(), title: str = ""):
    """Draw ``tree`` (a :class:`~specdec_core.tree.Tree`) on ``ax``: nodes at (depth, row), leaves on
    consecutive rows, a parent at the mean row of its children. ``labels``: one per node (root excluded;
    default: the node's rank among its siblings); ``path``: node ids drawn in red (an accepted path)."""
    y, row = {}, [0]

    def place(i):
        kids = tree.children[i]
        for c in kids:
            place(c)
        if kids:
            y[i] = float(np.mean([y[c] for c in kids]))
        else:
            y[i], row[0] = row[0], row[0] + 1

    place(0)
    on_path = {0, *path}
    for i in range(1, tree.n + 1):
        par = int(tree.parents[i])
        ax.plot([tree.depths[par], tree.depths[i]], [y[par], y[i]],
                color="C3" if i in on_path else "0.6", lw=2.5 if i in on_path else 1, zorder=1)
    for i in range(tree.n + 1):
        label = "root" if i == 0 else (labels[i - 1] if labels else str(tree.paths[i - 1][-1]))
        ax.annotate(label, (float(tree.depths[i]), y[i]), ha="center", va="center", fontsize=8,
                    bbox=dict(boxstyle="round", fc="C3" if i in on_path else "w", alpha=0.25 if i in on_path else 1,
                              ec="0.4"))
    ax.set(xlim=(-0.5, tree.depth + 0.5), ylim=(max(y.values()) + 0.8, -0.8), xlabel="depth", yticks=[],
           title=title)
    ax.grid(False)
    return ax
