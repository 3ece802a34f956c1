"""The architecture, checked: layers that import only downwards and never in a circle, a small core, four short
phases per method, one owner of the cache length, and extension by arguments (no test or chapter patches a module).

Each check reads the source (the import graph from every ``import`` statement, those inside functions included) or
imports in a fresh interpreter, so it fails the moment a change breaks the rule; a deliberately broken copy of each
rule is exercised in ``test_checks_can_fail`` and ``test_graph_checks_can_fail``."""
import ast
import dataclasses
import inspect
import re
import subprocess
import sys

import pytest

from specdec_core import loop
from specdec_core.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "specdec_core"
CORE_MODULES = ("sampling", "kvcache", "record", "graphs", "lm", "tree", "verify", "drafters", "loop", "decode")
CORE = [PACKAGE / f"{m}.py" for m in CORE_MODULES]
# the core's cap, readable in a sitting: the decode loop and its methods, the accept rules, the drafters (model,
# n-gram, block, predicted output), the options object, the cache and the CUDA-graph step path
CORE_MAX_LINES = 2200
PHASE_MAX_LINES = 40
PHASES = ("start", "draft", "verify", "accept", "commit")

# The layers, bottom up: a module may import from a lower layer, or from its own package (never in a circle).
# specdec_core/README.md draws the same list; test_readme_structure_matches_the_code holds the two together.
LAYERS = {
    "paths": 0,
    **{m: 1 for m in CORE_MODULES},  # the decoding core
    "kernels": 1,  # the CPU verify path (compiled kernels), part of the core
    "adaptive": 2, "serving": 2,  # drafters built from core drafters; batched decoding
    "models": 3,  # targets, drafts, pairs (assembles core and adaptive drafters)
    "data": 4,  # the prompt sets (encoded through a pair)
    "__init__": 5,  # the public facade: import specdec_core as sd
    "study": 6,  # the chapters' measurement library
    "train": 7,  # training drafts (its cards time the drafts with the study's timers)
    "tools": 8,  # programs: the GPU reference run, the draft evaluation and card, the book's set-up and rendering
}


def module_name(path) -> str:
    """``specdec_core/models/hub.py`` → ``specdec_core.models.hub``; a package's ``__init__.py`` → the package."""
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group(module: str) -> str:
    """The unit a layer is assigned to: a core module, ``paths``, a subpackage, or ``__init__`` (the facade)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def project_sources() -> dict[str, tuple[str, bool]]:
    """``{module: (source, is_package)}`` for every module of the package."""
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in sorted(PACKAGE.rglob("*.py"))}


def imports(module: str, source: str, is_package: bool, known: set[str]) -> list[tuple[str, int, bool, str]]:
    """``(target module, line, inside a function, line text)`` for each project import of ``source``: relative
    imports resolved, ``from pkg import name`` pointing at ``pkg.name`` when that is a module."""
    tree, lines = ast.parse(source), source.splitlines()
    in_function = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
    base = module.split(".") if is_package else module.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            root = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            targets = [f"{root}.{a.name}" if f"{root}.{a.name}" in known else root for a in node.names]
        else:
            continue
        for target in dict.fromkeys(t for t in targets if t == "specdec_core" or t.startswith("specdec_core.")):
            out.append((target, node.lineno, id(node) in in_function, lines[node.lineno - 1].strip()))
    return out


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, list[tuple[str, int, bool, str]]]:
    known = set(sources)
    return {m: imports(m, src, pkg, known) for m, (src, pkg) in sources.items()}


def wrong_direction(graph) -> list[str]:
    """Imports that reach a higher layer, or a different package on the same layer (a module importing its own
    package's modules is judged by :func:`circles`)."""
    bad = []
    for m, edges in graph.items():
        for target, line, _, _ in edges:
            a, b = group(m), group(target)
            if a == b or (LAYERS[a] == LAYERS[b] == 1):
                continue
            if LAYERS[b] >= LAYERS[a]:
                bad.append(f"{m}:{line} imports {target} ({a}, layer {LAYERS[a]} → {b}, layer {LAYERS[b]})")
    return bad


def circles(graph) -> list[list[str]]:
    """Every strongly connected set of two or more modules (an import circle), or a module importing itself."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in {t for t, *_ in graph.get(v, [])}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in {t for t, *_ in graph.get(v, [])}:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def hidden_imports(graph) -> list[str]:
    """Project imports inside a function without a ``deferred`` comment saying why (a heavy dependency)."""
    return [f"{m}:{line}: {text}" for m, edges in graph.items() for _, line, inside, text in edges
            if inside and "deferred" not in text]


def _python_files(*folders):
    return [p for f in folders for p in sorted((REPO_ROOT / f).rglob("*.py"))]


def core_lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in CORE)


def assigns_cache_length(text: str) -> list[str]:
    """Lines that set a cache's committed length directly (``x.length = …``, ``x.length += …``)."""
    return [l.strip() for l in text.splitlines() if re.search(r"\.length\s*[-+]?=(?!=)", l)]


def patches_a_module(text: str) -> list[str]:
    """Lines that rebind an attribute of a module or class at run time (pytest's monkeypatch.setattr, setattr
    on a module alias, or ``alias.name = …`` for the aliases the tests and chapters import specdec_core as)."""
    aliases = set(re.findall(r"import\s+specdec_core[\w.]*\s+as\s+(\w+)", text))
    aliases |= {b for _, b in re.findall(r"from\s+specdec_core[\w.]*\s+import\s+(\w+)\s+as\s+(\w+)", text)}
    out = [l.strip() for l in text.splitlines() if "monkeypatch.setattr" in l or re.match(r"\s*setattr\(", l)]
    for a in aliases:
        out += [l.strip() for l in text.splitlines() if re.match(rf"\s*{re.escape(a)}\.\w+(\.\w+)*\s*=(?!=)", l)]
    return out


def phase_lines(cls) -> int:
    """Source lines of a method's phases (those it defines itself)."""
    return sum(len(inspect.getsourcelines(vars(cls)[name])[0]) for name in PHASES if name in vars(cls))


def test_core_is_small():
    assert core_lines() <= CORE_MAX_LINES, f"core modules hold {core_lines()} lines (> {CORE_MAX_LINES})"


def test_imports_point_down_the_layers():
    bad = wrong_direction(import_graph(project_sources()))
    assert not bad, "imports against the layers (tests/test_layout.py LAYERS):\n" + "\n".join(bad)


def test_no_import_circle():
    found = circles(import_graph(project_sources()))
    assert not found, f"import circles: {found}"


def test_no_project_import_hides_in_a_function():
    bad = hidden_imports(import_graph(project_sources()))
    assert not bad, "imports inside functions (move to the top, or comment why deferred):\n" + "\n".join(bad)


def test_every_module_has_a_layer():
    assert {group(m) for m in project_sources()} <= set(LAYERS), set(map(group, project_sources())) - set(LAYERS)
    assert sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "paths")) == sorted(CORE_MODULES)


def _planted(module: str, line: str) -> dict:
    """The package's sources with ``line`` added at the top of ``module`` (or inside a new function, if indented)."""
    sources = project_sources()
    src, pkg = sources[module]
    sources[module] = ((f"def planted():\n{line}\n" if line.startswith(" ") else line + "\n") + src, pkg)
    return sources


@pytest.mark.parametrize("module, line, check", [
    ("specdec_core.models.hub", "from ..study import bench", wrong_direction),  # a library module reaching up
    ("specdec_core.loop", "from .models import toy_pair", wrong_direction),  # the core reaching up
    ("specdec_core.serving.batch", "from ..adaptive import hybrid_of", wrong_direction),  # a sibling on its layer
    ("specdec_core.study.bench", "from ..train import drafts", wrong_direction),  # study below train
    ("specdec_core.lm", "from .loop import decode_steps", circles),  # loop imports lm
    ("specdec_core.train.wide", "from . import drafts", circles),  # drafts ... wide (through teacher)
    ("specdec_core.study.theory", "    from . import bench", hidden_imports),
])
def test_graph_checks_can_fail(module, line, check):
    """A planted bad import is found by its check (the real tree passes above): the checks are not vacuous."""
    assert check(import_graph(_planted(module, line)))


def test_import_is_light():
    """``import specdec_core`` loads the core and models only: no study, training, pandas, scipy or plotting."""
    code = ("import sys, specdec_core; heavy = [m for m in sys.modules if m.startswith(('specdec_core.study', "
            "'specdec_core.train', 'pandas', 'scipy', 'matplotlib', 'seaborn'))]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out


def test_each_method_fits_on_one_screen():
    methods = [c for c in vars(loop).values() if inspect.isclass(c) and issubclass(c, loop.Method)]
    assert {m.__name__ for m in methods} >= {"Method", "Autoregressive", "Linear", "TreeDecoding"}
    long = {m.__name__: phase_lines(m) for m in methods if phase_lines(m) > PHASE_MAX_LINES}
    assert not long, long
    assert len(inspect.getsourcelines(loop.decode_steps)[0]) <= PHASE_MAX_LINES


def test_only_the_cache_sets_its_length():
    files = [p for p in _python_files("specdec_core", "tests", "book", "scripts")
             if p.name not in ("kvcache.py", "test_layout.py")]
    bad = {str(p.relative_to(REPO_ROOT)): assigns_cache_length(p.read_text()) for p in files}
    assert not any(bad.values()), {k: v for k, v in bad.items() if v}


def test_no_test_or_chapter_patches_a_module():
    files = [p for p in _python_files("tests", "book") if p.name != "test_layout.py"]
    bad = {str(p.relative_to(REPO_ROOT)): patches_a_module(p.read_text()) for p in files}
    assert not any(bad.values()), {k: v for k, v in bad.items() if v}


def test_scripts_are_command_lines():
    bad = [str(p.relative_to(REPO_ROOT)) for p in _python_files("scripts") if "sys.path" in p.read_text()]
    assert not bad, f"scripts edit sys.path instead of importing the library: {bad}"


@pytest.mark.parametrize("check, text", [
    (assigns_cache_length, "self.lm.cache.length = 0\n"),
    (assigns_cache_length, "cache.length += 3\n"),
    (patches_a_module, "monkeypatch.setattr(T, 'residual', r)\n"),
    (patches_a_module, "import specdec_core.tree as T\nT.residual = lambda r, q: r\n"),
    (patches_a_module, "from specdec_core.study import mutants as mu\nmu.RULES = {}\n"),
])
def test_checks_can_fail(check, text):
    """Each rule flags a line that breaks it (and the real tree passes above): the checks are not vacuous."""
    assert check(text)


@pytest.mark.parametrize("check, text", [
    (assigns_cache_length, "n = lm.length\nif lm.length == 3: pass\n"),
    (patches_a_module, "import specdec_core as sd\nx = sd.generate\n"),
])
def test_checks_pass_clean_code(check, text):
    assert not check(text)


def test_notebook_parameters_are_read_by_papermill():
    """Every name a chapter's parameters cell assigns, and every key ci.yaml and full.yaml pass to it, is a name
    papermill finds in that cell.

    papermill reads that cell line by line and skips, with an "Unable to parse line" warning, any line holding more
    than one '=' (in a string or a comment too: ``{"name": "T=1"}``); a name it cannot read is missing from
    ``papermill --help-notebook``, is injected only after a "Passed unknown parameter" notice, and the rendered
    chapter then lists it as unknown. Fails with the chapter and the names papermill missed."""
    import ast

    import jupytext
    import yaml
    from papermill.translators import PythonTranslator

    params = {name: yaml.safe_load((REPO_ROOT / "book" / "params" / name).read_text()) for name in ("ci.yaml", "full.yaml")}
    missed = {}
    for path in sorted((REPO_ROOT / "book").glob("[0-9][0-9]_*.py")):
        cell = next(c for c in jupytext.read(path).cells if "parameters" in c.metadata.get("tags", []))
        found = {p.name for p in PythonTranslator.inspect(cell)}
        assigned = {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        if assigned - found:
            missed[f"{path.stem}'s parameters cell"] = sorted(assigned - found)
        for name, table in params.items():
            lost = set((table or {}).get(path.stem) or {}) - found
            if lost:
                missed[f"{name}:{path.stem}"] = sorted(lost)
    assert not missed, ("papermill cannot read these parameter lines (one '=' a line, in strings and comments too): "
                        f"{missed}")


def readme_structure(text: str) -> dict[str, int]:
    """``{file: layer}`` from ``specdec_core/README.md``: each ``- `file`: …`` line under a ``## Layer N`` heading."""
    out, layer = {}, None
    for line in text.splitlines():
        if m := re.match(r"## Layer (\d+)\b", line):
            layer = int(m.group(1))
        elif m := re.match(r"- `([\w/]+\.py)`: \S", line):
            out[m.group(1)] = layer
    return out


def structure_mismatch(listed: dict[str, int]) -> list[str]:
    files = {str(p.relative_to(PACKAGE)): LAYERS[group(module_name(p))] for p in PACKAGE.rglob("*.py")}
    bad = [f"{f} is not listed" for f in sorted(set(files) - set(listed))]
    bad += [f"{f} is listed but does not exist" for f in sorted(set(listed) - set(files))]
    bad += [f"{f} is listed under layer {listed[f]}, its package is on layer {files[f]}"
            for f in sorted(set(files) & set(listed)) if listed[f] != files[f]]
    return bad


def test_readme_structure_matches_the_code():
    """The newcomer's map (specdec_core/README.md) lists every module once, one line each, on its layer."""
    bad = structure_mismatch(readme_structure((PACKAGE / "README.md").read_text()))
    assert not bad, bad


def test_readme_check_can_fail():
    listed = readme_structure((PACKAGE / "README.md").read_text())
    assert structure_mismatch({k: v for k, v in listed.items() if k != "loop.py"}) == ["loop.py is not listed"]
    assert structure_mismatch(listed | {"study/bench.py": 1}) == [
        "study/bench.py is listed under layer 1, its package is on layer 6"]
    assert structure_mismatch(listed | {"study/gone.py": 6}) == ["study/gone.py is listed but does not exist"]


# -- one vocabulary: each name of the code means one thing (the glossary in specdec_core/README.md) -------------
# a retired name → what replaced it; none may appear outside the deprecated aliases (DEPRECATED_ALIASES)
RETIRED_NAMES = {
    r"\btv_alpha\b": "accept_probs (each test's acceptance probability; not a total variation)",
    r"\balpha_tv\b": "alpha_predicted",
    r"\buse_steps\b": "set_step_mode",
    r"\bTreeSearch\b": "TreeDecoding (the method searches nothing)",
    r"\b_Cached\b": "BatchDraftCache",
    r"\bbdraft\b": "batch_drafter",
    r"\bkeep_last\b|\blast_only\b": "logits_to_keep (transformers' name)",
    r"\bcache\.keep\(|\bdef keep\(": "KVCache.retain / BatchKVCache.select_rows",
    r"\bself\.steps\b|\blm\.steps\b|\bsteps: str\b|\bsteps=\"(eager|static|graph)\"": "step_mode",
    r"\bdef steps\(|\bloop\.steps\b|\bimport steps\b": "decode_steps",
    r"\blm\.graphs\b|\bself\.graphs\s*=|\bself\.graphs\.(run|clear)\b": "step_graphs (``graphs``: generate's argument)",
    r"\bname=method\b": "a Method class per method (Parallel)",
    r"\bt\[\"(draft|verify|accept|commit|end)\"\]": "phase_start",
    r"\bcheck_arguments\b": "DecodeOptions.check",
}
DEPRECATED_ALIASES = {"specdec_core/record.py"}  # where the old stats keys are still read, with a warning


def retired_names(text: str) -> list[str]:
    """The lines of ``text`` that use a retired name, with what replaced it."""
    return [f"{line.strip()}  ← use {new}" for line in text.splitlines()
            for old, new in RETIRED_NAMES.items() if re.search(old, line)]


def test_one_meaning_per_name():
    files = [p for p in _python_files("specdec_core", "tests", "book", "scripts")
             if p.name != "test_layout.py" and str(p.relative_to(REPO_ROOT)) not in DEPRECATED_ALIASES]
    files += [REPO_ROOT / "specdec_core" / "README.md", REPO_ROOT / "book" / "notation.md"]
    bad = {str(p.relative_to(REPO_ROOT)): retired_names(p.read_text()) for p in files}
    assert not any(bad.values()), {k: v for k, v in bad.items() if v}


@pytest.mark.parametrize("line", ["lm.forward(ids, last_only=True)", "s = stats['tv_alpha']", "class TreeSearch:",
                                  "self.steps = 'eager'", "for new in loop.steps(run):"])
def test_retired_names_are_found(line):
    assert retired_names(line), line


def test_old_stats_keys_still_read_with_a_warning():
    from specdec_core.record import Stats
    s = Stats("linear", proposed=[2], accepted_lengths=[1], accept_probs=[1.0, 0.5])
    for old, new in Stats.DEPRECATED.items():
        with pytest.warns(DeprecationWarning, match=new):
            assert s[old] == s[new]
    assert "tv_alpha" in s and "accept_probs" in s.keys() and "tv_alpha" not in s.keys()


# -- decoding options written once -------------------------------------------------------------------------
def _options(fn) -> dict:
    """The keyword parameters of ``fn`` that are decoding options, with their defaults."""
    from specdec_core.decode import DecodeOptions
    names = {f.name for f in dataclasses.fields(DecodeOptions)}
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if n in names}


def test_options_are_written_once():
    """generate, stream and generate_batch take every field of DecodeOptions, with its default (a batch's seed
    may also be one per prompt), and build the options from their arguments (DecodeOptions.of), checked in one
    place (DecodeOptions.check); generate_batch names what it refuses."""
    import specdec_core as sd
    from specdec_core import decode
    from specdec_core.serving import batch
    fields = {f.name: f.default for f in dataclasses.fields(decode.DecodeOptions)}
    for fn in (sd.generate, sd.stream, sd.generate_batch):
        assert _options(fn) == fields, (fn.__name__, set(fields) ^ set(_options(fn)))
        assert "DecodeOptions.of(locals())" in inspect.getsource(fn), fn.__name__
    assert set(batch.BATCH_REFUSES) <= set(fields)
    assert list(inspect.signature(decode._prepare).parameters) == ["target", "input_ids", "drafter", "options"]
    assert not hasattr(decode, "check_arguments")


def test_generate_batch_refuses_what_it_cannot_do(toy16):
    import specdec_core as sd
    from specdec_core.serving.batch import BATCH_REFUSES
    for name, value in (("prediction", [1, 2]), ("tree", "chain")):
        with pytest.raises(ValueError, match=f"{name}=.*{BATCH_REFUSES[name][:20]}"):
            sd.generate_batch(toy16.target, [[1, 2, 3]], drafter=toy16.drafters["model"], method="linear",
                              max_new_tokens=4, **{name: value})


def test_no_calibration_date_in_the_shipped_drafts():
    """A calibration is described by what it ran on (prompts, tokens, machine), never by when: no shipped draft's
    files carry a date (the run records in data/reference/book/timings.csv are the one place for dates)."""
    import re

    date = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
    for path in sorted((REPO_ROOT / "data" / "drafts").rglob("*")):
        if path.suffix in (".json", ".md"):
            assert not date.search(path.read_text()), f"{path.relative_to(REPO_ROOT)} names a date"
