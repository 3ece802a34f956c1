"""A deterministic draft's laws kept as its tokens (``OneHotLaws``) decide exactly as the dense ``[K, V]`` one-hot:
the same accept decisions, emitted tokens and test probabilities, bit for bit, under the same random numbers."""
import torch

import specdec_core as sd
from specdec_core.drafters import Draft, NGramDrafter
from specdec_core.sampling import PROB_DTYPE, OneHotLaws
from specdec_core.tree import Tree, TreeDraft
from specdec_core.verify import chain_tests, speculative_sample, tree_speculative_sample, tree_tests


def _laws(K: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g, dtype=PROB_DTYPE) * 2, -1)
    x = torch.multinomial(p[:K], 1, generator=g).view(-1)  # tokens the target likes: rejections and accepts
    x[::3] = torch.randint(0, V, (len(x[::3]),), generator=g)
    return p, x


def test_the_tokens_answer_as_the_dense_one_hot():
    laws = OneHotLaws(torch.tensor([3, 0, 5]), 8)
    dense = laws.dense()
    rows, x = torch.arange(3), torch.tensor([3, 1, 5])
    assert torch.equal(laws[rows, x], dense[rows, x]) and torch.equal(laws[1], dense[1])
    assert torch.equal(laws[1:].dense(), dense[1:]) and laws.shape == dense.shape and len(laws) == 3


def test_chain_decisions_are_bit_for_bit_the_dense_ones():
    for seed in range(200):
        p, x = _laws(6, 50, seed)
        dense, tokens = torch.nn.functional.one_hot(x, 50).to(PROB_DTYPE), OneHotLaws(x, 50)
        a = speculative_sample(x, dense, p, torch.Generator().manual_seed(seed))
        b = speculative_sample(x, tokens, p, torch.Generator().manual_seed(seed))
        assert torch.equal(a[0], b[0]) and a[1] == b[1], seed
        proposed = a[1] + (a[1] < 6)
        assert chain_tests(p, dense, x, None, proposed) == chain_tests(p, tokens, x, None, proposed)


def test_tree_decisions_are_bit_for_bit_the_dense_ones():
    tree = Tree.of([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    for seed in range(200):
        p, x = _laws(tree.n, 40, seed)
        dense, tokens = torch.nn.functional.one_hot(x, 40).to(PROB_DTYPE), OneHotLaws(x, 40)
        a = tree_speculative_sample(tree, x, dense, p, torch.Generator().manual_seed(seed))
        b = tree_speculative_sample(tree, x, tokens, p, torch.Generator().manual_seed(seed))
        assert a[0] == b[0] and torch.equal(a[1], b[1]), seed
        assert tree_tests(tree, a[0], dense, p) == tree_tests(tree, b[0], tokens, p)


class DenseNGram(NGramDrafter):
    """The n-gram drafter as it was: dense one-hot laws."""

    def propose(self, context, k, params, generator, confidence=None):
        d = super().propose(context, k, params, generator)
        return Draft(d.tokens, None if d.q is None else d.q.dense(), d.passes)

    def propose_tree(self, context, shape, k, params, generator, confidence=None):
        d = super().propose_tree(context, shape, k, params, generator)
        return TreeDraft(d.tree, d.tokens, None if d.q is None else d.q.dense(), d.passes)


def test_sampled_decodes_are_the_dense_ones(toy16):
    prompt = [4, 4, 4, 4, 9, 3, 2, 4, 4]
    for method in ("linear", "tree"):
        for seed in range(5):
            kw = dict(method=method, k=6, max_new_tokens=30, temperature=1.0, seed=seed)
            a = sd.generate(toy16.target, prompt, drafter=NGramDrafter(), **kw)
            b = sd.generate(toy16.target, prompt, drafter=DenseNGram(), **kw)
            assert a.tokens == b.tokens and a.stats.accepted_lengths == b.stats.accepted_lengths
            assert a.stats.accept_probs == b.stats.accept_probs and sum(a.stats.drafted) > 0
