"""The chapters' shared set-up: what every notebook of ``book/`` starts with, in one call.

    from specdec_core.study import book
    ch = book.setup(out_dir, model=model, device=device, threads=threads, per_task=per_task)
    ch.pair, ch.prompts, ch.encoded            # the pair, the evaluation prompts, (prompt, ids) pairs
    ch.save(df, "name"); ch.savefig(fig, "name")  # CSVs and figures under out_dir

:func:`setup` applies the book's plotting theme, creates the output folder, sets the CPU thread count,
loads the model pair (checking that the drafters a chapter needs are there) and the prompts, and encodes
them with the chat template. It prints nothing; ``str(ch)`` is a one-line description for the notebook.
:func:`draw_tree` draws a tree of :mod:`specdec_core.tree` (chapter 4's figures).

What every chapter shows a reader the same way (``tests/test_book_outputs.py`` checks them in the CI book):

    display(book.banner(params_name))        # first output: the parameter file, and at CI size what that means
    display(ch.setting(k, verify_ratio))     # thread count, verify(K+1)/verify(1) here, chapter 1's verdict on it
    book.show(table, "Speedup over ...", prefill=False)   # a speed table with a caption that says prefill in/out
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import os

import numpy as np
import pandas as pd
import torch

from ..data.prompts import encode, load_prompts
from ..models import EMBEDDED, load_pair, resolve_device
from ..paths import REFERENCE_DIR
from ..study import bench, profiling, report

progress = profiling.progress_bar  # tqdm with few updates, and none in the executed book


BANNER = "Parameter file:"  # how every chapter's first output begins (tests/test_book_outputs.py looks for it)
CI_BANNER = "its numbers exercise the code, not the claims"
CHAPTER1_VERDICT = "01_bottleneck/verdict.csv"  # chapter 1's verdict per T: threads, S, T, ratio, one_pass


def banner(params_name: str | None):
    """The one-line banner a chapter opens with: which parameter file it ran with (``run_book.py`` injects
    ``params_name``; ``None``: the parameters cell's own defaults) and, at CI size, that its numbers exercise the
    code and claim nothing. The verdict rule itself is stated once, in ``notation.md``."""
    from IPython.display import Markdown

    rule = ("verdicts come from a paired test over distinct prompts, 5 % false positives a table "
            "([the verdict rule](notation.md))")
    if params_name is None:
        text = f"**{BANNER} none** (the parameters cell's defaults): {rule}."
    elif params_name == "ci":
        text = f"**{BANNER} `ci.yaml`**, the CI size: {CI_BANNER}."
    else:
        name = params_name if params_name.endswith((".yaml", ".yml")) else f"{params_name}.yaml"
        text = f"**{BANNER} `{name}`**: {rule}."
    return Markdown(text)


def show(table, caption: str, prefill: bool, digits: int | None = 3):
    """Display a speed table under its caption (:func:`~specdec_core.study.report.caption`: whether its times
    count the prefill). ``digits``: numbers shown with :func:`~specdec_core.study.report.shown` (None: as given)."""
    from IPython.display import Markdown, display

    display(Markdown(f"*{report.caption(caption, prefill)}*"))
    display(report.shown(table, digits) if digits is not None and isinstance(table, pd.DataFrame) else table)


def chapter1_verdict(out: Path) -> tuple[pd.DataFrame | None, str]:
    """Chapter 1's verdict table (:data:`CHAPTER1_VERDICT`) and where it came from: this run's (the folder beside
    ``out``), else the committed reference run's, else ``(None, "")``."""
    for path, source in ((Path(out).parent / CHAPTER1_VERDICT, "this run"),
                         (REFERENCE_DIR / "book" / CHAPTER1_VERDICT, "the reference run")):
        if path.is_file():
            return pd.read_csv(path), source
    return None, ""


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

    def setting(self, k: int, verify_ratio: float | None = None, ids=None, repeats: int = 7):
        """The setting line every chapter prints: its thread count, the verify cost it decodes with (a target pass
        over K + 1 tokens ÷ one over 1 token, ``verify_ratio`` if the chapter measured it, else timed here on
        ``ids`` or the median-length prompt), and chapter 1's verdict on the same T, naming a thread count that
        differs (then chapter 1's verdict is about another setting)."""
        from IPython.display import Markdown

        threads = torch.get_num_threads()
        cbwr = f", MKL_CBWR={os.environ['MKL_CBWR']}" if os.environ.get("MKL_CBWR") else ""
        where = f"{threads} thread(s){cbwr}" if self.device.type == "cpu" else str(self.device)
        if verify_ratio is None and self.pair is not None:
            ids = ids if ids is not None else bench.median_length(self.bench_prompts) if self.encoded else None
            if ids is not None:
                verify_ratio = bench.pass_costs(self.target, None, ids, ks=(k,), repeats=repeats)["verify_ratio"][k]
        here = (f"a verify pass over {k + 1} tokens costs {verify_ratio:.2f} one-token passes here"
                if verify_ratio is not None else "verify cost not measured here")
        text = f"**Setting**: {where}; {here}."
        table, source = chapter1_verdict(self.out)
        row = table[table["T"] == k + 1] if table is not None else None
        if row is not None and len(row):
            r = row.iloc[0]
            bar = "within" if r.ratio <= r.one_pass else "above"
            other = "" if self.device.type == "cpu" and int(r.threads) == threads else f" at {int(r.threads)} thread(s)"
            text += (f" Chapter 1 ({source}{other}): t({k + 1})/t(1) = {r.ratio:.2f}, "
                     f"{bar} its {r.one_pass:g}× bar.")
        elif table is not None:
            text += f" Chapter 1 ({source}) did not time T = {k + 1}."
        else:
            text += " Chapter 1's verdict is not available (run chapter 1 first)."
        return Markdown(text)

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
        return "; ".join(parts[:4]) + ("\n" + "; ".join(parts[4:]) if parts[4:] else "")


THEME = ("seaborn-v0_8-whitegrid", "seaborn-v0_8-notebook")
# seaborn's "colorblind" palette, in its order: the default colour cycle, as ``sns.color_palette("colorblind")``
COLORBLIND = ("#0173b2", "#de8f05", "#029e73", "#d55e00", "#cc78bc", "#ca9161", "#fbafe4", "#949494", "#ece133",
              "#56b4e9")


def use_theme() -> None:
    """The book's figure theme: seaborn's white grid and notebook sizes, from the copies matplotlib ships
    (``THEME``), and seaborn's colour-blind palette as the colour cycle (``COLORBLIND``). A chapter that draws
    with matplotlib alone need not import seaborn (a second of a short chapter's run)."""
    import matplotlib.pyplot as plt
    from cycler import cycler

    plt.style.use(THEME)
    plt.rcParams["axes.prop_cycle"] = cycler(color=COLORBLIND)


def setup(out_dir, model: str | None = None, *, draft: str | None = None, device="cpu", dtype="float32",
          threads: int | None = None, per_task: int | None = None, tasks=None, prompt_file=None,
          need: tuple[str, ...] = (), reference: bool = False) -> Chapter:
    """A chapter's set-up.

    - the book's theme (:func:`use_theme`); ``out_dir`` created;
    - ``threads``: torch's intra-op thread count on a CPU (``None`` or 0: torch's default, every core);
    - ``model``: load the pair (:func:`~specdec_core.models.load_pair` with ``draft``, ``dtype``, ``device``);
      ``need``: drafter names the chapter cannot do without (a missing one raises, naming ``make models``);
    - ``per_task`` (with ``tasks``, ``prompt_file``): the evaluation prompts, encoded with the pair's chat
      template (:func:`~specdec_core.data.prompts.encode`).
    """
    use_theme()
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


# -- chapter 0's picture of a step (chapter 3 shows its by-hand step the same way) -----------------------------------
STEP_COLOURS = {"accepted": "#009E73", "rejected": "#D55E00", "untested": "#999999", "target": "#0072B2"}
STEP_LEGEND = ("<span style='color:{accepted}'>accepted</span> draft tokens, the first "
               "<span style='color:{rejected}'><s>rejected</s></span> one, those after it never "
               "<span style='color:{untested}'><s>tested</s></span>, and the target's own token "
               "<span style='color:{target}'><b>[in brackets]</b></span>: a correction after a rejection, "
               "a bonus after a full acceptance.").format(**STEP_COLOURS)


def step_parts(drafted: list[int], accepted: int, target_token: int) -> list[tuple[int, str]]:
    """The fate of each token of one step, in order: ``(token, fate)`` with fate ``"accepted"``, ``"rejected"`` (the
    first draft token the target disagreed with), ``"untested"`` (drafts after it) and ``"target"`` (the target's own
    token, which every step adds). ``accepted``: how many draft tokens were kept, in ``[0, len(drafted)]``."""
    if not 0 <= accepted <= len(drafted):
        raise ValueError(f"accepted must be in [0, {len(drafted)}] for a draft of {len(drafted)} tokens, got {accepted}")
    fates = ["accepted"] * accepted + (["rejected"] if accepted < len(drafted) else [])
    fates += ["untested"] * (len(drafted) - len(fates))
    return list(zip(drafted, fates)) + [(target_token, "target")]


def step_html(tokenizer, context: list[int], drafted: list[int], accepted: int, target_token: int,
              context_chars: int = 60) -> str:
    """One speculative step as a line of text: the end of its ``context`` in grey, then the draft's tokens coloured
    by their fate (:func:`step_parts`) and the target's own token in brackets. Returns an HTML fragment."""
    import html

    def text(ids):
        return html.escape(tokenizer.decode(ids)).replace("\n", "⏎")
    tail = tokenizer.decode(context, skip_special_tokens=True)[-context_chars:].replace("\n", "⏎")
    spans = [f"<span style='color:#666'>…{html.escape(tail)}</span>"]
    for tok, fate in step_parts(drafted, accepted, target_token):
        colour = STEP_COLOURS[fate]
        word = text([tok])
        if fate in ("rejected", "untested"):
            word = f"<s>{word}</s>"
        if fate == "target":
            word = f"<b>[{word}]</b>"
        spans.append(f"<span style='color:{colour}'>{word}</span>")
    return "".join(spans)


def steps_table(tokenizer, steps: list[dict], context_chars: int = 60):
    """Several steps (dicts with ``context``, ``drafted``, ``accepted``, ``target``) as an HTML table: one row a
    step, its text (:func:`step_html`), and its counts. Displays in Jupyter and in the rendered book alike."""
    from IPython.display import HTML

    rows = []
    for i, s in enumerate(steps, 1):
        line = step_html(tokenizer, s["context"], s["drafted"], s["accepted"], s["target"], context_chars)
        rows.append(f"<tr><td>{i}</td><td style='text-align:left;font-family:monospace'>{line}</td>"
                    f"<td>{s['accepted']} of {len(s['drafted'])}</td><td>{s['accepted'] + 1}</td></tr>")
    head = ("<tr><th>step</th><th style='text-align:left'>the text so far, then this step's tokens</th>"
            "<th>draft kept</th><th>tokens added</th></tr>")
    return HTML(f"<p>{STEP_LEGEND}</p><table>{head}{''.join(rows)}</table>")
