"""specdec_core.train.feature (the EAGLE-style experiment): its one-pass second draft step is the plain pass."""
import torch

from specdec_core.train.feature import FeatureDraft, second_step, step_pairs


def test_second_step_rows_equal_plain_causal_passes(toy16):
    target = toy16.target
    V, H = target.config.vocab_size, target.config.hidden_size
    m = FeatureDraft(target, torch.arange(V), n_layers=2, init_layer=1).to(torch.float64).eval()
    g = torch.Generator().manual_seed(0)
    R = 9
    f, x = torch.randn(R, H, generator=g, dtype=torch.float64), torch.randint(0, V, (R,), generator=g)
    h = m(f.unsqueeze(0), x.unsqueeze(0))[0]
    t = torch.arange(2, R - 1)
    h2 = second_step(m, f, x, h, t)
    for i, ti in enumerate(t.tolist()):  # row t: the true rows <= t, then (h_t, x_{t+2}) at position t + 1
        ref = m(torch.cat([f[:ti + 1], h[ti:ti + 1]]).unsqueeze(0), torch.cat([x[:ti + 1], x[ti + 1:ti + 2]]).unsqueeze(0))
        torch.testing.assert_close(h2[i], ref[0, -1], rtol=1e-9, atol=1e-9)
    # a pass that also let row t see the true row t + 1 (what decoding never has) differs: the check can fail
    leak = m(torch.cat([f[:4], h[2:3]]).unsqueeze(0), torch.cat([x[:4], x[3:4]]).unsqueeze(0))[0, -1]
    assert not torch.allclose(h2[0], leak)


def test_batched_two_step_pass_matches_each_sequence(toy16):
    """The training pass (padded batch, true rows + second-step rows) gives each sequence's own rows."""
    target = toy16.target
    V, H = target.config.vocab_size, target.config.hidden_size
    m = FeatureDraft(target, torch.arange(V), n_layers=1, init_layer=0).to(torch.float64).eval()
    g = torch.Generator().manual_seed(1)
    L, lens = 8, (8, 5)
    f, x = torch.randn(2, L, H, generator=g, dtype=torch.float64), torch.randint(0, V, (2, L), generator=g)
    mask = torch.zeros(2, L, dtype=torch.long)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
    h = m(f, x, attention_mask=mask)
    f2, x2, kw = step_pairs(f, x, mask, h)
    out = m(f2, x2, **kw)
    for b, n in enumerate(lens):
        alone = m(f[b:b + 1, :n], x[b:b + 1, :n])[0]
        torch.testing.assert_close(out[b, :n], alone, rtol=1e-9, atol=1e-9)
        t = torch.arange(n - 1)
        torch.testing.assert_close(out[b, L + t], second_step(m, f[b, :n], x[b, :n], alone, t), rtol=1e-9, atol=1e-9)
