"""Tree speculative decoding: draft a tree, verify every node in one target pass, keep one path.

Trees are data. A static tree is a list of index paths, each index the rank of a node among its
parent's children (rank 0 = the draft's first choice), as Medusa's and EAGLE's "choices"::

    [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]      # 6 nodes, depth 3

:class:`Tree` turns the paths once into parents, depths (the position offsets), the ancestor mask and
the retrieve paths. Node 0 is the root: the last committed token, which the target has not seen yet;
nodes 1..N follow in (depth, path) order, the order in which they are drafted, written to the caches
and verified. :class:`Dynamic` grows the tree instead from the draft's own probabilities (top-k
expansion under a node budget, as in EAGLE-2), one depth per draft pass.

A tree step (:class:`specdec_core.loop.TreeDecoding`) has the four phases of every method:

1. **draft**  the drafter grows the tree (``Drafter.propose_tree``, with :class:`TreeBuilder`): node tokens
   and, when sampling, the law q each node's token was drawn from (:func:`draw_siblings`).
2. **verify** one target pass over [root, node_1..node_N] at positions ``L + depth`` with a 4D mask in
   which each node sees the committed prefix and its own ancestors (:meth:`Tree.bias`): N + 1 laws p.
3. **accept** greedy: :func:`~specdec_core.verify.greedy_tree_accept`; sampling:
   :func:`~specdec_core.verify.tree_speculative_sample`.
4. **commit** copy the accepted path's KV entries to contiguous slots (``KVCache.keep``, an index copy
   in the preallocated buffers) in the target and in the drafter; emit the tokens (cut at EOS/budget).

Choosing a tree from measurements (Sequoia's positional model) is study code:
:mod:`specdec_core.study.treesearch`.

Notation: p = target law, q = draft law.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .sampling import sample

Path = tuple[int, ...]


# -- trees as data ----------------------------------------------------------------------------------
class Tree:
    """A tree built once from index paths. Node 0 is the root; nodes 1..N in (depth, path) order.

    ``paths``    the N paths, sorted;          ``depth``  the longest path (0 for the bare root)
    ``parents``  LongTensor ``[N+1]`` (root: -1)
    ``depths``   LongTensor ``[N+1]``: position offsets (node i sits at position ``L + depths[i]``)
    ``children`` N+1 tuples of child node ids, in rank order
    ``mask``     BoolTensor ``[N+1, N+1]``: ``mask[i, j]`` iff j is i or an ancestor of i
    ``retrieve`` LongTensor ``[leaves, depth+1]``: each root-to-leaf path of node ids, padded with -1

    Build with :meth:`of` (cached: every distinct shape is converted once).
    """

    def __init__(self, paths):
        paths = sorted({tuple(int(i) for i in p) for p in paths}, key=lambda p: (len(p), p))
        if any(len(p) == 0 or min(p) < 0 for p in paths):
            raise ValueError("tree paths must be non-empty tuples of ranks >= 0")
        index = {(): 0, **{p: i + 1 for i, p in enumerate(paths)}}
        for p in paths:
            if p[:-1] not in index:
                raise ValueError(f"tree path {p} has no parent {p[:-1]} in the tree")
            if p[-1] > 0 and p[:-1] + (p[-1] - 1,) not in index:
                raise ValueError(f"tree path {p}: ranks among siblings must be 0, 1, 2, ... without gaps")
        n = len(paths)
        self.paths: tuple[Path, ...] = tuple(paths)
        self._index = index
        self.n = n
        self.depth = max((len(p) for p in paths), default=0)
        parents = [-1] + [index[p[:-1]] for p in paths]
        self.parents = torch.tensor(parents, dtype=torch.long)
        self.depths = torch.tensor([0] + [len(p) for p in paths], dtype=torch.long)
        kids: list[list[int]] = [[] for _ in range(n + 1)]
        for i in range(1, n + 1):
            kids[parents[i]].append(i)  # paths are sorted, so siblings arrive in rank order
        self.children = tuple(tuple(c) for c in kids)
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        for i in range(n + 1):
            if i:
                mask[i] = mask[parents[i]]
            mask[i, i] = True
        self.mask = mask
        leaves = [i for i in range(n + 1) if not kids[i]]
        self.retrieve = torch.full((len(leaves), self.depth + 1), -1, dtype=torch.long)
        for row, leaf in enumerate(leaves):
            chain = mask[leaf].nonzero().flatten()  # ancestors have smaller ids: already root → leaf
            self.retrieve[row, : chain.numel()] = chain
        self._bias: dict = {}

    @staticmethod
    def of(paths) -> "Tree":
        """The (cached) tree of these paths."""
        return _tree_of(tuple(sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))))

    @staticmethod
    def chain(n: int) -> "Tree":
        """n nodes in a row: linear speculative decoding as a tree."""
        return Tree.of([(0,) * d for d in range(1, n + 1)])

    @staticmethod
    def from_branching(branching) -> "Tree":
        """Every node at depth d has ``branching[d-1]`` children: ``[3, 2, 1]`` → 3 + 6 + 6 = 15 nodes."""
        level = [()]  # the paths of the deepest level so far (the root)
        paths = []
        for b in branching:
            level = [p + (r,) for p in level for r in range(int(b))]
            paths += level
        return Tree.of(paths)

    def truncate(self, depth: int) -> "Tree":
        """The same tree cut at ``depth``."""
        return self if depth >= self.depth else Tree.of([p for p in self.paths if len(p) <= depth])

    def __contains__(self, path) -> bool:
        """True if the tree has a node at this index path (``()`` is the root)."""
        return tuple(path) in self._index

    def n_children(self, path: Path) -> int:
        """Number of children of the node at ``path`` (0 if the tree has no such node)."""
        i = self._index.get(path)
        return 0 if i is None else len(self.children[i])

    @property
    def widths(self) -> list[int]:
        """Nodes per depth 1..depth."""
        return torch.bincount(self.depths[1:], minlength=self.depth + 1)[1:].tolist()

    def bias(self, past: int, dtype: torch.dtype, device) -> torch.Tensor:
        """4D additive mask ``[1, 1, N+1, past+N+1]`` for a pass over [root, nodes] after ``past`` slots."""
        key = (dtype, str(device))
        if key not in self._bias:
            self._bias[key] = attention_bias(self.mask, 0, dtype, device)
        block = self._bias[key]
        out = torch.zeros(1, 1, self.n + 1, past + self.n + 1, dtype=dtype, device=device)
        out[..., past:] = block
        return out

    def __repr__(self):
        return f"Tree(nodes={self.n}, depth={self.depth}, widths={self.widths})"


@functools.lru_cache(maxsize=512)
def _tree_of(paths: tuple[Path, ...]) -> Tree:
    return Tree(paths)


def attention_bias(allowed: torch.Tensor, past: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``allowed [T, M]`` or ``[B, T, M]`` (bool) → additive mask ``[1 or B, 1, T, past + M]``: the ``past``
    cache slots are visible to every row; the last M columns follow ``allowed`` (0 = attend, dtype-min = blocked)."""
    allowed = allowed.to(device)
    if allowed.dim() == 2:
        allowed = allowed.unsqueeze(0)
    B, T, M = allowed.shape
    out = torch.zeros(B, 1, T, past + M, dtype=dtype, device=device)
    out[:, 0, :, past:].masked_fill_(~allowed, torch.finfo(dtype).min)
    return out


@dataclass(frozen=True)
class Dynamic:
    """Grow the tree from the draft's probabilities: top-k expansion under a node budget (EAGLE-2's
    expansion phase), one depth per draft pass.

    At each depth every frontier node u offers its ``topk`` likeliest continuations; the candidate of
    rank j scores s(u) · q_u(j-th largest), s(u) being u's own score (the product along its path, the
    draft's estimate that the target reaches u). The ``width`` best candidates of the depth become nodes,
    until ``budget`` nodes in all. Scores use only the *sorted* law of the parent, known before any child
    is drawn, so the shape never depends on the children's own tokens (this keeps sampling exact, see
    :func:`~specdec_core.verify.tree_speculative_sample`). Greedy scores with softmax(draft logits).
    """

    budget: int = 16
    width: int = 4
    topk: int = 4

    def __post_init__(self):
        for name in ("budget", "width", "topk"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Dynamic.{name} must be an integer >= 1, got {v!r}")


def default_tree(k: int) -> Tree:
    """The default static tree for depth k: the draft's first-choice chain of length k, its second choice
    as a leaf at every depth, its third choice at depth 1 and the second choice's own first child.
    2k + 2 nodes (k >= 2): a small tree for hardware where a pass over ~2k tokens costs little more than one
    over k (chapter 4 measures which shape is best on the reader's machine)."""
    spine = [(0,) * d for d in range(1, k + 1)]
    side = [(0,) * (d - 1) + (1,) for d in range(1, k + 1)]
    extra = [(2,), (1, 0)] if k >= 2 else [(2,)]
    return Tree.of(spine + side + extra)


def resolve_shape(tree, k: int):
    """``tree`` argument of ``generate`` → a :class:`Tree` cut at depth k, or a :class:`Dynamic`.

    Accepts None (:func:`default_tree`), a :class:`Tree`, a list of index paths, or a :class:`Dynamic`.
    """
    if tree is None:
        return default_tree(k)
    if isinstance(tree, Dynamic):
        return tree
    if isinstance(tree, Tree):
        t = tree
    elif isinstance(tree, (list, tuple)):
        try:
            t = Tree.of(tree)
        except TypeError as e:
            raise ValueError(f"tree must be a list of index paths like [(0,), (1,), (0, 0)]: {e}") from e
    else:
        raise ValueError(f"tree must be None, a Tree, a list of index paths or a Dynamic, got {type(tree).__name__}")
    if t.n == 0:
        raise ValueError("tree has no nodes: give at least one path, e.g. [(0,)]")
    return t.truncate(k)


def tree_size(tree, k: int) -> int:
    """Most nodes (root excluded) one step drafts for this tree argument at depth ``k``."""
    shape = resolve_shape(tree, k)
    return shape.n if isinstance(shape, Tree) else min(shape.budget, shape.width * k)


def shape_depth(shape, k: int) -> int:
    """Longest path the shape allows at depth ``k`` (for drafters that propose a plain chain)."""
    return min(k, shape.depth) if isinstance(shape, Tree) else min(k, shape.budget)


# -- drafting a tree --------------------------------------------------------------------------------
@dataclass
class TreeDraft:
    tree: Tree  # the tree actually drafted (sampling may leave a family short, see draw_siblings)
    tokens: torch.Tensor  # [N] LongTensor: node i's token is tokens[i - 1]
    q: torch.Tensor | None  # [N, V] float64: the law node i's token was drawn from (None when greedy)
    passes: int  # draft forward passes spent
    source: str = ""  # as Draft.source ("prediction": the caller's predicted output)
    state: dict = field(default_factory=dict)  # as Draft.state: what the proposing drafter needs at accept_path


def draw_siblings(logits: torch.Tensor, q: torch.Tensor | None, m: int, generator):
    """The m children of one node. logits ``[V]``; q ``[V]`` its processed law (None when greedy).

    Greedy: the m highest logits, best first. Sampling: m draws **without replacement**: child j is drawn
    from q with children 0..j-1 removed and renormalized; that law is returned as child j's q, which is
    exactly what :func:`~specdec_core.verify.tree_speculative_sample` uses for it. Fewer than m children if q has fewer than
    m tokens with mass (a function of q alone, fixed before any draw). Returns (tokens, laws | None).
    """
    if q is None:
        return torch.topk(logits, m).indices.tolist(), None
    m = min(m, int((q > 0).sum()))
    tokens = []
    laws = []
    law = q  # child j's law: q without the tokens of children 0..j-1, renormalized
    for _ in range(m):
        if tokens:
            law = law.clone()
            law[tokens[-1]] = 0.0
            law = law / law.sum()
        tokens.append(int(sample(law, generator)))
        laws.append(law)
    return tokens, laws


class TreeBuilder:
    """Grows a tree depth by depth while a drafter drafts it (static or :class:`Dynamic` shape).

    The drafter's loop: ``plan`` the family sizes of the frontier, ``add`` each family, ``advance`` to the
    new depth (False: stop drafting), run ``frontier_tokens`` through the draft with ``frontier_bias``.
    Nodes are numbered in the order of :class:`Tree` (depth, then parent, then rank).
    """

    def __init__(self, shape, depth: int, confidence: float | None = None):
        self.shape = shape
        self.max_depth = depth
        self.prune = confidence or 0.0  # nodes scored below it get no children (0: none pruned)
        self.scored = isinstance(shape, Dynamic) or bool(self.prune)  # plan() reads the frontier's laws
        cap = tree_size(shape if isinstance(shape, Dynamic) else shape.truncate(depth), depth)
        self.allowed = torch.zeros(cap + 1, cap + 1, dtype=torch.bool)
        self.allowed[0, 0] = True
        self.paths: list[Path] = [()]
        self.scores = [1.0]  # node u's score: the draft's probability of reaching it
        self.tokens = []  # node i's token is tokens[i - 1] (the root has none)
        self.laws = []  # node i's law is laws[i - 1] (sampling only)
        self.frontier = [0]  # the node ids of the deepest depth
        self.depth = 0
        self._child_scores = {}  # set by plan(), read by add(): frontier node → its children's scores, by rank

    def plan(self, probs: torch.Tensor | None) -> list[int]:
        """Children per frontier node. probs ``[F, V]``: the frontier's laws (for :class:`Dynamic` or a confidence).
        With a confidence θ, a node whose score is below θ gets no children (the root's score is 1)."""
        if isinstance(self.shape, Tree):
            sizes = [self.shape.n_children(self.paths[u]) if self.scores[u] >= self.prune else 0
                     for u in self.frontier]
            if self.prune and any(sizes):  # scores as Dynamic's: parent's score × its law's j-th largest value
                top = probs.topk(max(sizes), dim=-1).values.cpu().tolist()
                self._child_scores = {u: [self.scores[u] * v for v in top[i]] for i, u in enumerate(self.frontier)}
            return sizes
        left = self.shape.budget - (len(self.paths) - 1)
        top = probs.topk(min(self.shape.topk, probs.shape[-1]), dim=-1).values  # [F, topk], sorted
        s = torch.tensor([self.scores[u] for u in self.frontier], dtype=top.dtype)[:, None]
        cand = (s * top.cpu()).masked_fill(s < self.prune, 0.0)  # a pruned parent's candidates score 0
        order = torch.sort(-cand.flatten(), stable=True).indices[: min(self.shape.width, left)]
        order = order[cand.flatten()[order] > 0]  # no children outside the law's support
        sizes = torch.bincount(order // top.shape[1], minlength=len(self.frontier)).tolist()
        self._child_scores = {u: cand[i].tolist() for i, u in enumerate(self.frontier)}
        return sizes

    def add(self, parent: int, tokens: list[int], laws: list[torch.Tensor] | None) -> None:
        for j, x in enumerate(tokens):
            i = len(self.paths)
            self.paths.append(self.paths[parent] + (j,))
            self.scores.append(self._child_scores[parent][j] if self._child_scores else 1.0)
            self.tokens.append(int(x))
            if laws is not None:
                self.laws.append(laws[j])
            self.allowed[i] = self.allowed[parent]
            self.allowed[i, i] = True

    def advance(self) -> bool:
        """Make the nodes just added the frontier; True if they are to be expanded (run through the draft)."""
        first = self.frontier[-1] + 1
        self.frontier = list(range(first, len(self.paths)))
        self.depth += 1
        if self.depth >= self.max_depth or not any(self.scores[u] >= self.prune for u in self.frontier):
            return False  # the last depth, no new nodes, or a confidence pruned them all: no pass to spend
        if isinstance(self.shape, Tree):
            return any(self.shape.n_children(self.paths[u]) and self.scores[u] >= self.prune for u in self.frontier)
        return len(self.paths) - 1 < self.shape.budget

    def frontier_tokens(self) -> torch.Tensor:
        return torch.tensor([self.tokens[u - 1] for u in self.frontier], dtype=torch.long)

    def frontier_bias(self, past: int, dtype, device) -> torch.Tensor:
        """Mask for the pass over the frontier when ``past`` slots precede node 1 in the draft's cache."""
        s, e = self.frontier[0], self.frontier[-1] + 1
        return attention_bias(self.allowed[s:e, 1:e], past, dtype, device)

    def result(self, passes: int) -> TreeDraft:
        tree = Tree.of(self.paths[1:])
        assert tree.paths == tuple(self.paths[1:]), "nodes were not drafted in tree order"
        q = torch.stack(self.laws) if self.laws else None
        return TreeDraft(tree, torch.tensor(self.tokens, dtype=torch.long), q, passes)
