"""Verification: the accept rules, pure functions on tokens and probability tensors.

Notation (declared once, used everywhere): **p = target law, q = draft law**, both produced by
:func:`specdec_core.sampling.process_logits` with the same parameters. K draft tokens are checked
against K + 1 target positions (the last one yields the bonus token). Chains: :func:`greedy_accept`,
:func:`speculative_sample`; trees: :func:`greedy_tree_accept`, :func:`tree_speculative_sample`; both
sampling rules take what is left after a rejection from the one :func:`residual`. The loops take a rule
as an argument (``generate(..., rule=...)``), which is how the negative controls of
:mod:`specdec_core.study.mutants` run through the real loop.
"""
from __future__ import annotations

import torch

from .sampling import OneHotLaws, sample


def greedy_accept(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Greedy rule. draft_tokens ``[K]``, target_argmax ``[K+1]`` → (tokens ``[n+1]``, n).

    Accept the longest prefix equal to the target's argmax, then append the target's own token.
    """
    K = draft_tokens.numel()
    match = (draft_tokens.to(target_argmax.device) == target_argmax[:K]).to(torch.int64)
    n = int(match.cumprod(0).sum()) if K else 0
    return target_argmax[: n + 1].clone(), n


def speculative_sample(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                       generator: torch.Generator | None) -> tuple[torch.Tensor, int]:
    """Speculative sampling (Leviathan et al. 2023, Alg. 1; Chen et al. 2023).

    draft_tokens ``[K]`` sampled from draft_probs ``[K, V]`` (q); target_probs ``[K+1, V]`` (p).
    Accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a sample of
    norm(max(0, p_i − q_i)) and stop; if all K are accepted emit a bonus sample of p_K.
    Returns (tokens ``[n+1]``: the accepted prefix plus one corrected or bonus token, n accepted).

    Why the emitted token has law p_i: P(x) = q(x)·min(1, p(x)/q(x)) + (1 − Σ_y min(p, q)) · r(x) with
    r = (p − q)^+ / Σ(p − q)^+; since Σ(p − q)^+ = 1 − Σ min(p, q), P(x) = min(p, q)(x) + (p − q)^+(x) = p(x).
    """
    K = draft_tokens.numel()
    dev = target_probs.device
    x = draft_tokens.to(dev)
    if K:
        rows = torch.arange(K, device=dev)
        px, qx = target_probs[rows, x], draft_probs.to(dev)[rows, x]
        if bool((qx <= 0).any()):
            raise ValueError("a draft token has q(x) = 0: q is not the law the draft sampled from")
        u = torch.rand(K, generator=generator, device=dev, dtype=target_probs.dtype)
        accepted = (u * qx < px).to(torch.int64)  # u < p/q without dividing (no NaN/inf when p = q = 0)
        n = int(accepted.cumprod(0).sum())
    else:
        n = 0
    law = residual(target_probs[n], draft_probs[n].to(dev)) if n < K else target_probs[K]
    return torch.cat([x[:n], sample(law, generator).view(1)]), n


def residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm((r − q)^+): what is left of the law r once a draw from q has been rejected."""
    res = (r - q).clamp_min(0.0)
    total = res.sum()
    # total == 0 only if r <= q everywhere, i.e. r == q: rejection then has probability 0; guard rounding
    return res / total if total > 0 else r


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Σ_x min(p, q) = 1 − TV(p, q) per row: the acceptance probability of a draft token. ``[..., V]`` → ``[...]``."""
    return torch.minimum(p, q).sum(-1)


def chain_tests(p: torch.Tensor | None, q: torch.Tensor | None, tokens: torch.Tensor, argmax: torch.Tensor | None,
                proposed: int) -> list[float]:
    """The acceptance probability of each of the first ``proposed`` draft positions of a chain (the positions
    the verifier tested, see :mod:`specdec_core.record`): Σ min(p_i, q_i); greedy (``argmax`` given): 1 where
    the token matched."""
    if not proposed:
        return []
    if argmax is not None:
        return (tokens[:proposed].to(argmax.device) == argmax[:proposed]).double().tolist()
    if isinstance(q, OneHotLaws):  # Σ min(p, one-hot on x) = p(x)
        return p[torch.arange(proposed, device=p.device), q.tokens[:proposed].to(p.device)].tolist()
    return overlap(p[:proposed], q[:proposed].to(p.device)).tolist()


# -- trees -------------------------------------------------------------------------------------------
def greedy_tree_accept(tree, tokens: torch.Tensor, target_argmax: torch.Tensor):
    """Greedy rule on a :class:`~specdec_core.tree.Tree`. tokens ``[N]``, target_argmax ``[N+1]`` →
    (path, new tokens ``[len(path)+1]``).

    Descend from the root while a child's token equals the target's argmax at the current node: the
    longest root-to-node path that plain greedy decoding would also produce; then the target's own token.
    """
    tk, am = tokens.tolist(), target_argmax.tolist()
    node = 0  # the walk starts at the root
    path = []  # the accepted node ids
    while True:
        nxt = next((c for c in tree.children[node] if tk[c - 1] == am[node]), None)
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path, torch.tensor([tk[c - 1] for c in path] + [am[node]], dtype=torch.long)


def tree_speculative_sample(tree, tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator,
                            residual=residual):
    """Recursive rejection sampling down the tree. tokens ``[N]``; q ``[N, V]``: the law node i's token was
    drawn from; p ``[N+1, V]``: the target's law at every node. Returns (path, new tokens ``[len(path)+1]``).

    At a node with children c_1..c_m (rank order): r ← p(node); for j = 1..m accept x_j = token(c_j) with
    probability min(1, r(x_j) / q_j(x_j)) and descend into c_j; else r ← ``residual(r, q_j)`` =
    norm((r − q_j)^+). If no child is accepted, emit a sample of r and stop; at a leaf r = p(leaf) (the bonus).

    This is SpecInfer's multi-step speculative sampling with q_j allowed to change between siblings, which
    covers siblings drawn without replacement (Jeon et al. 2024, Sequoia): our drafters draw them that way
    (:func:`~specdec_core.tree.draw_siblings`). Exact: let r_j be the residual before sibling j. Given
    everything drafted before x_j, x_j ~ q_j, and r_{j+1} = norm((r_j − q_j)^+) is fixed before x_j is drawn.
    By induction from the last step (emit a sample of r_{m+1}), the token emitted from step j on has law
    q_j·min(1, r_j/q_j) + P(reject)·r_{j+1} = min(q_j, r_j) + (r_j − q_j)^+ = r_j; so the node emits p(node).
    Once a child is accepted its own children were drawn from q given that path, and the same argument
    holds one level down: the emitted sequence has the target's law. The only requirement on the drafter
    is that a node's number of children is fixed before they are drawn (:class:`~specdec_core.tree.Dynamic`
    respects it). ``residual`` is an argument so that a negative control can replace it.
    """
    dev = p.device
    tk = tokens.tolist()
    q = q.to(dev)
    node = 0  # the walk starts at the root
    path = []  # the accepted node ids
    while True:
        r = p[node]  # the law the next child is tested against: p(node), then residuals
        accepted = None
        for c in tree.children[node]:
            x, qc = tk[c - 1], q[c - 1]
            if not qc[x] > 0:
                raise ValueError("a draft token has q(x) = 0: q is not the law the draft sampled from")
            u = torch.rand((), generator=generator, device=dev, dtype=p.dtype)
            if u * qc[x] < r[x]:  # u < r/q without dividing
                accepted = c
                break
            r = residual(r, qc)
        if accepted is None:
            last = int(sample(r, generator))
            return path, torch.tensor([tk[c - 1] for c in path] + [last], dtype=torch.long)
        path.append(accepted)
        node = accepted


def tree_tests(tree, path: list[int], q: torch.Tensor | None, p: torch.Tensor | None) -> list[float]:
    """The acceptance probability of every test the tree verifier ran on ``path`` (see
    :mod:`specdec_core.record`): at each node of the walk, its children up to the accepted one (all of them
    at the last node), each Σ min(r_j, q_j) with r_j the residual left by the siblings before it. Greedy
    (``q`` None): one entry per tested depth, 1 if a child matched."""
    nodes = [0] + path
    walked = nodes if tree.children[nodes[-1]] else nodes[:-1]
    if q is None:
        return [1.0 if i < len(path) else 0.0 for i in range(len(walked))]
    out = []
    for i, node in enumerate(walked):
        r = p[node]
        for c in tree.children[node]:
            qc = q[c - 1].to(p.device)
            out.append(float(overlap(r, qc)))
            if i < len(path) and c == path[i]:
                break
            r = residual(r, qc)
    return out
