"""Bad input gets a clear error naming the problem."""
import json
from pathlib import Path

import pytest
import torch

import specdec_core as sd
from specdec_core.models import hub as models


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(k=0, method="linear"), "k must"),
    (dict(method="beam"), "unknown method"),
    (dict(method="linear"), "needs a drafter"),
])
def test_bad_generate_arguments(toy, kw, match):
    with pytest.raises(ValueError, match=match):
        sd.generate(toy.target, [1, 2], **kw)


def test_empty_prompt(toy):
    with pytest.raises(ValueError, match="empty prompt"):
        sd.generate(toy.target, [])


def test_prompt_ids_outside_vocabulary(toy):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        sd.generate(toy.target, [1, 99])


def test_prompt_longer_than_cache(toy):
    with pytest.raises(ValueError, match="longer than the KV cache"):
        sd.generate(toy.target, list(range(8)) * 4, cache_len=16)
    with pytest.raises(ValueError, match="exceed the KV cache"):
        sd.generate(toy.target, [1, 2, 3], max_new_tokens=20, cache_len=16)
    with pytest.raises(ValueError, match="positions"):
        sd.generate(toy.target, [1, 2, 3], max_new_tokens=2100)  # toy max_position_embeddings = 2048


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'smollm-9000': not an embedded target"):
        sd.load_pair("smollm-9000")


def test_vocabulary_mismatch(toy):
    other = sd.toy_pair(vocab_size=16, seed=0)
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        sd.generate(toy.target, [1, 2], drafter=other.drafters["model"], method="linear")
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        models.check_same_vocab(toy.target, other.target)


def test_corrupt_model_cache(tmp_path):
    good = tmp_path / "m"
    good.mkdir()
    (good / "weights.bin").write_bytes(b"\x00" * 1024)
    (good / "config.json").write_text("{}")
    models.write_manifest(good)
    models.verify_cache(good)  # intact: no error
    (good / "weights.bin").write_bytes(b"\x01" * 1024)
    with pytest.raises(models.CorruptModelCache, match="weights.bin fails its SHA-256"):
        models.verify_cache(good)
    (good / "config.json").unlink()
    with pytest.raises(models.CorruptModelCache, match="config.json is missing"):
        models.verify_cache(good)
    partial = tmp_path / "p"
    partial.mkdir()
    with pytest.raises(models.CorruptModelCache, match="partial"):
        models.verify_cache(partial)


@pytest.mark.slow
def test_corrupt_embedded_cache_is_rebuilt_or_refused(tmp_path):
    """A damaged cache of the embedded model is never loaded: refused with rebuild=False, else rebuilt."""
    src = models.embedded_path()
    fake_root = tmp_path / "models"
    dest = fake_root / "smollm2-135m"
    dest.mkdir(parents=True)
    for f in src.iterdir():  # cheap copy: link the big file, copy the small ones
        (dest / f.name).symlink_to(f) if f.stat().st_size > 1 << 20 else (dest / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dest / "config.json").read_text())
    cfg["num_hidden_layers"] = 2  # a corrupt config would load a silently wrong model
    (dest / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(models.CorruptModelCache, match="config.json fails its SHA-256"):
        models.embedded_path(rebuild=False, root=fake_root)
    calls = []
    with pytest.warns(UserWarning, match="rebuilding"):
        models.embedded_path(root=fake_root, convert=lambda name, d: calls.append(d))
    assert calls == [dest]


def _slow_convert(name, dest):
    """A stand-in conversion that takes a while and leaves a valid cache, logging each call beside it."""
    import time

    with open(dest.parent / "calls.log", "a") as log:
        log.write(f"{name}\n")
    tmp = dest.with_name(dest.name + ".partial")
    tmp.mkdir()
    time.sleep(0.5)
    (tmp / "config.json").write_text("{}")
    models.write_manifest(tmp)
    tmp.rename(dest)


def _embedded_path_in(root: str) -> str:
    return str(models.embedded_path(root=Path(root), convert=_slow_convert))


def test_concurrent_first_loads_convert_once(tmp_path):
    """Two processes that find no cache at once (pytest's workers, the book's parallel chapters on a fresh clone):
    one converts, the other waits for it and loads its cache; without the lock both wrote one ``.partial`` folder."""
    import multiprocessing as mp

    with mp.get_context("fork").Pool(2) as pool:
        got = pool.map(_embedded_path_in, [str(tmp_path)] * 2)
    assert got == [str(tmp_path / "smollm2-135m")] * 2
    assert (tmp_path / "calls.log").read_text().splitlines() == ["smollm2-135m"]
    models.verify_cache(tmp_path / "smollm2-135m")


# -- a pair of one's own: each wrong input stops at load_pair with one error naming it, within seconds -------
def _tiny_llama(folder, vocab_size: int, layers: int = 1):
    """A random-weight Llama saved with save_pretrained (no tokenizer: load_pair then leaves it None)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    return folder


def test_a_missing_folder_is_named(tmp_path):
    with pytest.raises(ValueError, match="no model folder '/no/such/folder': it does not exist"):
        sd.load_pair("/no/such/folder")
    _tiny_llama(tmp_path / "target", 32)
    with pytest.raises(ValueError, match="no draft folder './no-draft-here/x/y'"):
        sd.load_pair(str(tmp_path / "target"), draft="./no-draft-here/x/y")


def test_a_folder_without_a_model_is_named(tmp_path):
    with pytest.raises(ValueError, match="holds no config.json"):
        sd.load_pair(str(tmp_path))


def test_draft_of_another_vocabulary_names_both_sizes(tmp_path):
    target, draft = _tiny_llama(tmp_path / "target", 48), _tiny_llama(tmp_path / "draft", 40)
    with pytest.raises(ValueError, match="draft vocabulary has 40 entries, target has 48"):
        sd.load_pair(str(target), draft=str(draft))
    pair = sd.load_pair(str(target), draft=str(_tiny_llama(tmp_path / "same", 48)))  # the same sizes load
    assert set(pair.drafters) >= {"model", "ngram", "hybrid"}


@pytest.mark.parametrize("env, why", [
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
    ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "no connection to 127.0.0.1:9"),  # the discard port: refused at once
])
def test_a_hub_id_without_a_hub_fails_fast(monkeypatch, env, why):
    import time

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t = time.perf_counter()
    with pytest.raises(ValueError, match=f"nor in the Hugging Face cache, and the hub cannot be reached: {why}"):
        sd.load_pair("specdec-tests/no-such-model")
    assert time.perf_counter() - t < 10, "a hub that cannot be reached must be reported in seconds, not retried"


@pytest.mark.parametrize("device, match", [("gpu", "unknown device 'gpu'"), ("cuda:x", "unknown device"),
                                           (3.5, "unknown device")])
def test_unknown_device(device, match):
    with pytest.raises(ValueError, match=match):
        models.resolve_device(device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_cuda_device():
    with pytest.raises(ValueError, match="no CUDA device"):
        models.resolve_device("cuda")


@pytest.mark.parametrize("ids", [[1.5, 2], [1.0, 2.0], torch.tensor([[1.5, 2.0]]), [True, False]])
def test_non_integer_ids_are_refused_not_truncated(toy, ids):
    with pytest.raises(ValueError, match="integer token ids"):
        sd.generate(toy.target, ids)
    with pytest.raises(ValueError, match="integer token ids"):
        sd.generate_batch(toy.target, [ids, [1, 2]])
