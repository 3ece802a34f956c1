"""Accounting of ``specdec_core.study.profiling`` against hand counts; timing helpers' bookkeeping (no timing asserts)."""
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_core.study import profiling as pf
from specdec_core.paths import MODELS_DIR


def tiny_config(tied: bool) -> LlamaConfig:
    # L=2, H=8, I=12, nh=2, nkv=1, hd=4, V=10
    return LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=tied)


def meta_numel(config) -> int:
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.tie_weights()
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("tied", [False, True])
def test_param_count_by_hand_and_by_model(tied):
    # per layer: q 8·8 + k 4·8 + v 4·8 + o 8·8 + gate 12·8 + up 12·8 + down 8·12 = 480, norms 16
    hand = 10 * 8 + 2 * (480 + 16) + 8 + (0 if tied else 10 * 8)
    cfg = tiny_config(tied)
    assert pf.Arch.from_config(cfg).layer_linear_params == 480
    assert pf.param_count(cfg) == hand == meta_numel(cfg)


def test_param_count_smollm2_and_public_shapes():
    cfg = LlamaConfig(**json.loads((MODELS_DIR / "smollm2-135m" / "config.json").read_text()))
    assert pf.param_count(cfg) == meta_numel(cfg)
    published = {"0.5b": 494e6, "1b": 1.236e9, "8b": 8.030e9}  # Qwen2.5-0.5B (with its biases), Llama-3.2-1B, 3.1-8B
    for size, n in published.items():
        assert abs(pf.param_count(pf.llama_config(size)) / n - 1) < 0.01, size
    assert pf.param_count(pf.llama_config("1b")) == meta_numel(pf.llama_config("1b"))


def test_pass_cost_by_hand():
    b, T, S = 4, 3, 5
    c = pf.pass_cost(tiny_config(False), T=T, S=S, dtype_bytes=b)
    assert c["weight_bytes"] == b * (2 * (480 + 16) + 8 + 10 * 8 + T * 8)  # layers, final norm, head, 3 rows
    assert c["kv_read_bytes"] == b * 2 * (2 * 1 * 4) * (S + T)             # L · 2·nkv·hd · (S+T)
    assert c["kv_write_bytes"] == b * 2 * (2 * 1 * 4) * T
    # (in + out) per linear: q 16, k 12, v 12, o 16, gate 20, up 20, down 20 = 116; head 8 + 10
    assert c["act_bytes"] == b * (T * 2 * 116 + T * 18)
    assert c["linear_flops"] == 2 * (T * 2 * 480 + T * 10 * 8)
    assert c["attn_flops"] == 4 * 2 * 2 * 4 * T * (S + T)                  # 4 · L · nh · hd · T · (S+T)
    assert c["bytes"] == c["weight_bytes"] + c["kv_read_bytes"] + c["kv_write_bytes"] + c["act_bytes"]
    assert c["flops"] == c["linear_flops"] + c["attn_flops"]
    last = pf.pass_cost(tiny_config(False), T=T, S=S, dtype_bytes=b, logits="last")
    assert last["linear_flops"] == 2 * (T * 2 * 480 + 10 * 8)
    assert last["act_bytes"] == b * (T * 2 * 116 + 18)
    gqa = pf.pass_cost(tiny_config(False), T=T, S=S, dtype_bytes=b, gqa_expanded=True)
    assert gqa["kv_read_bytes"] == b * 2 * 2 * (S + T) * 4 * (1 + 2 * 2)   # read nkv, write nh, read nh
    two = pf.pass_cost(tiny_config(False), T=T, S=S, dtype_bytes=b, batch=2)
    assert two["weight_bytes"] == c["weight_bytes"] and two["kv_read_bytes"] == 2 * c["kv_read_bytes"]


def test_pass_cost_is_about_2PT_flops_and_P_bytes():
    cfg = pf.llama_config("1b")
    P = pf.param_count(cfg)
    c = pf.pass_cost(cfg, T=1, S=0, dtype_bytes=2)
    assert abs(c["linear_flops"] / (2 * P) - 1) < 0.01   # tied head: every parameter is one MAC per token
    assert abs(c["weight_bytes"] / (2 * P) - 1) < 0.01
    assert 0.9 < c["intensity"] < 1.0                     # bf16 decode: ~1 FLOP per byte


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="logits"):
        pf.pass_cost(tiny_config(True), 1, 0, 4, logits="some")
    with pytest.raises(ValueError, match="T >= 1"):
        pf.pass_cost(tiny_config(True), 0, 0, 4)
    with pytest.raises(ValueError, match="unknown size"):
        pf.llama_config("70b")
    with pytest.raises(ValueError, match="unknown dtype"):
        pf.resolve_dtype("float8")


def test_kv_bytes_per_token_matches_the_cache():
    from specdec_core.kvcache import KVCache

    for size in ("0.5b", "8b"):
        cfg = pf.llama_config(size)
        cache = KVCache(cfg, 1000, torch.bfloat16, "meta")  # meta: shapes without memory
        assert cache.nbytes() == 1000 * pf.kv_bytes_per_token(cfg, 2)
    assert pf.kv_bytes_per_token(pf.llama_config("8b"), 2, per_layer=True) == 2 * 8 * 128 * 2


def test_roofline_knee_and_fitted_knee():
    cfg = tiny_config(False)
    bw, peak = 1e9, 1e10
    knee = pf.roofline_knee(cfg, S=5, dtype_bytes=4, bw=bw, peak=peak)
    lo, hi = int(knee), int(knee) + 1
    assert pf.roofline_time(pf.pass_cost(cfg, lo, 5, 4), bw, peak) == pf.pass_cost(cfg, lo, 5, 4)["bytes"] / bw
    assert pf.roofline_time(pf.pass_cost(cfg, hi, 5, 4), bw, peak) == pf.pass_cost(cfg, hi, 5, 4)["flops"] / peak
    assert pf.roofline_knee(cfg, 5, 4, bw=1e9, peak=1e3) == 1.0  # compute-bound at once
    Ts = [1, 2, 4, 8, 16, 32, 64]
    m = pf.fit_roofline(Ts, [max(0.010, 0.001 * T) for T in Ts])  # plateau 10 ms, 1 ms per token
    assert m["knee"] == pytest.approx(10.0, rel=0.02) and m["slope"] == pytest.approx(0.001, rel=0.02)
    assert m["resolved"] and m["rms_log"] < 0.01
    flat = pf.fit_roofline(Ts, [0.010] * len(Ts))
    assert not flat["resolved"]


def test_time_interleaved_bookkeeping():
    calls = {"a": 0, "b": 0}

    def bump(k):
        calls[k] += 1

    df = pf.time_interleaved({"a": lambda: bump("a"), "b": lambda: bump("b")}, repeats=4, warmup=2)
    assert calls == {"a": 6, "b": 6}
    assert len(df) == 8 and set(df["name"]) == {"a", "b"} and (df["seconds"] >= 0).all()
    s = pf.summarize(df)
    assert list(s["runs"]) == [4, 4] and (s["q25"] <= s["median"]).all() and (s["median"] <= s["q75"]).all()
    with pytest.raises(ValueError, match="repeats"):
        pf.time_interleaved({"a": lambda: None}, repeats=0)


def test_device_tag_and_reference_paths(tmp_path):
    import pandas as pd

    tag = pf.device_tag("cpu")
    assert tag.startswith("cpu-") and tag == pf._slug(tag)
    df = pd.DataFrame({"x": [1, 2]})
    paths = pf.save_csv(df, "t", tmp_path / "out", "cpu")
    assert paths == [tmp_path / "out" / "t.csv"]
    paths = pf.save_csv(df, "t", tmp_path / "out", "cuda", tag="cuda-nvidia-h200", root=tmp_path)
    assert paths[1] == tmp_path / "data" / "reference" / "cuda-nvidia-h200" / "t.csv"
    assert all(p.exists() for p in paths)
    with pytest.raises(ValueError, match="slug"):
        pf.reference_dir("NVIDIA H200")


def test_random_models_run_and_are_labelled():
    cfg = tiny_config(True)
    m = pf.build_llama(cfg, seed=1, label="tiny (random weights)")
    assert m.label == "tiny (random weights)" and m.lm_head.weight is m.model.embed_tokens.weight
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert torch.isfinite(m(torch.tensor([[1, 2, 3]])).logits).all()
    twin = pf.dispatch_twin(pf.llama_config("1b"))
    assert twin.config.num_hidden_layers == 16 and "twin" in twin.label and twin.config.head_dim == 4
    wide = pf.dispatch_twin(cfg, head_dim=16)  # a head dim the CPU kernel's attention takes
    assert wide.config.head_dim == 16 and wide.config.num_attention_heads == cfg.num_attention_heads
    assert torch.isfinite(wide(torch.tensor([[1, 2, 3]])).logits).all()
    with pytest.raises(ValueError, match="head_dim"):
        pf.dispatch_twin(cfg, head_dim=0)
    ws = pf.model_linears(m)
    assert len(ws) == 2 * 7 + 1
    pf.matmul_chain(ws, M=3)()
    pf.matmul_chain([w.t().contiguous() for w in ws], M=3, transposed=True)()


def test_ceilings_and_profiler_report_what_they_promise():
    cb = pf.copy_bandwidth(1 << 20, repeats=2)
    assert cb["bytes_moved"] == 2 << 20 and cb["gbps_best"] >= cb["gbps_median"] > 0
    mp = pf.matmul_peak(64, repeats=2)
    assert mp["flops"] == 2 * 64 ** 3 and mp["gflops_best"] >= mp["gflops_median"] > 0
    a, b = torch.randn(32, 32), torch.randn(32, 32)
    prof = pf.profile_ops(lambda: a @ b, repeats=2)
    assert {"op", "calls", "self_s", "total_s"} <= set(prof.columns) and prof.attrs["wall_s"] > 0
    assert prof.set_index("op").loc["aten::mm", "calls"] == 1


def test_a_ceiling_below_a_measured_rate_fails_the_check():
    """Chapter 1's check: the best rate measured is the ceiling, so any rate above it is an error (the defect: an
    MKL peak at n = 2048 of 221 GFLOP/s under matmuls that ran at 409)."""
    rates = [("MKL square matmul", 221.0), ("bare matmuls, T = 256", 409.0)]
    with pytest.raises(AssertionError, match="bare matmuls, T = 256 409"):
        pf.check_ceiling(rates, 221.0)
    table = pf.check_ceiling(rates, 409.0)
    assert table.of_ceiling.tolist() == pytest.approx([221 / 409, 1.0])


class _NumpyLinear(torch.nn.Linear):
    """A linear layer whose product runs outside torch's operators (as a compiled kernel called from Python does):
    the profiler has no operator to show for it."""

    def forward(self, x):
        return torch.from_numpy(x.detach().numpy() @ self.weight.detach().numpy().T)


def test_profile_ops_sees_marked_modules_on_any_path():
    """The range of the marked modules holds their time even where no torch operator does the work, and counts
    every forward call; without ``modules`` there is no such row, and no matmul operator either."""
    layers = torch.nn.Sequential(*[_NumpyLinear(256, 256, bias=False) for _ in range(3)])
    x = torch.randn(4, 256)
    plain = pf.profile_ops(lambda: layers(x), repeats=2)
    assert pf.MODULES_RANGE not in set(plain.op)
    assert not set(plain.op) & {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul"}
    prof = pf.profile_ops(lambda: layers(x), repeats=2, modules=list(layers))
    row = prof.set_index("op").loc[pf.MODULES_RANGE]
    assert row.calls == 3 and 0 < row.total_s <= prof.attrs["wall_s"] * 1.5
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in layers)  # the hooks are gone
    named = pf.profile_ops(lambda: layers(x), repeats=1, modules=list(layers[:1]), label="first layer")
    assert named.set_index("op").loc["first layer", "calls"] == 1
