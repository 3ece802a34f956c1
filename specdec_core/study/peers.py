"""transformers' own decoders as benchmark peers: plain ``generate``, assisted generation, prompt lookup.

Each factory returns a runner for :func:`specdec_core.study.bench.run_interleaved` (ids → {"tokens": [...]}).
Settings mirror ours: same K (constant schedule, no confidence cut-off), same EOS, same sampling knobs.
"""
from __future__ import annotations

import copy
import logging

import torch

from ..decode import eos_ids
from ..models.draft import DraftModel
from .exactness import setting_params


def _kwargs(target, temperature: float, top_k: int, top_p: float, max_new_tokens: int) -> dict:
    eos = sorted(eos_ids(target))
    kw = dict(max_new_tokens=max_new_tokens, eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0)
    if temperature == 0:
        kw.update(do_sample=False)
    else:  # transformers' defaults (top_k=50) would change the law: set every knob
        kw.update(do_sample=True, temperature=temperature, top_k=top_k or None, top_p=top_p)
    return kw


def hf_runner(target, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
              seed: int = 0, **generate_kwargs):
    kw = _kwargs(target, temperature, top_k, top_p, max_new_tokens) | generate_kwargs

    @torch.inference_mode()
    def run(ids):
        torch.manual_seed(seed)
        x = ids.view(1, -1).to(next(target.parameters()).device)
        out = target.generate(x, attention_mask=torch.ones_like(x), **kw)
        return {"tokens": out[0, x.shape[1]:].tolist()}

    return run


def hf_assistant(draft, target):
    """A transformers ``LlamaForCausalLM`` equivalent of a :class:`~specdec_core.models.draft.DraftModel` (any other
    draft, a Hugging Face causal LM, is returned as it is).

    Same trunk weights, the target's embedding, and the *full-vocabulary* tied head: transformers cannot
    run a reduced-vocabulary draft as an assistant, so this is the closest runnable equivalent (its draft
    pass pays for the full 49k-row head, and its argmax may pick a token outside our draft vocabulary).
    """
    from transformers import LlamaForCausalLM

    if not isinstance(draft, DraftModel):  # a Hugging Face causal LM (a pair of one's own): an assistant as it is
        return draft
    cfg = copy.deepcopy(draft.config)
    cfg.tie_word_embeddings = True
    m = LlamaForCausalLM(cfg)
    m.model.layers.load_state_dict(draft.trunk.layers.state_dict())
    m.model.norm.load_state_dict(draft.trunk.norm.state_dict())
    m.model.embed_tokens = target.get_input_embeddings()
    m.lm_head.weight = target.get_input_embeddings().weight
    p = next(target.parameters())
    m = m.to(device=p.device, dtype=p.dtype).eval()
    m.generation_config = copy.deepcopy(target.generation_config)
    return m


class _NoAssistantDefaults(logging.Filter):
    """transformers logs, once per assisted run, that it copied the assistant's own ``num_assistant_tokens`` into the
    generation config: that is what :func:`assisted_runner` sets on purpose (a fixed K), so that notice, and only
    that one, is filtered at its logger."""

    def filter(self, record):
        return "default values have been modified to match model-specific defaults" not in record.getMessage()


def assisted_runner(target, assistant, k: int, max_new_tokens: int, temperature: float = 0.0,
                    top_k: int = 0, top_p: float = 1.0, seed: int = 0):
    """transformers' assisted generation with a constant K draft tokens and no confidence cut-off."""
    log = logging.getLogger("transformers.generation.utils")
    if not any(isinstance(f, _NoAssistantDefaults) for f in log.filters):
        log.addFilter(_NoAssistantDefaults())
    assistant.generation_config.num_assistant_tokens = k
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0
    return hf_runner(target, max_new_tokens, temperature, top_k, top_p, seed, assistant_model=assistant)


def prompt_lookup_runner(target, k: int, max_new_tokens: int, max_ngram: int = 3, **kw):
    """transformers' prompt lookup drafting ``k`` tokens. Its candidate generator reads an EOS id where it finds a
    match, even for a model without one (transformers 4.57: ``torch.isin`` on None); such a model gets an id past its
    vocabulary, which it never emits."""
    if not eos_ids(target) and "eos_token_id" not in kw:
        kw["eos_token_id"] = target.config.get_text_config().vocab_size
    return hf_runner(target, max_new_tokens, prompt_lookup_num_tokens=k, max_matching_ngram_size=max_ngram, **kw)


def audit_runners(pair, length: int, k: int = 2) -> dict:
    """transformers' decoders as runners for :func:`specdec_core.study.exactness.audit` (``(ids, setting, seed) ->
    tokens``): plain ``generate`` (the control), assisted generation with the pair's draft as assistant (the draft's
    own model where it is a transformers model, as on the toy pairs; else :func:`hf_assistant`), prompt lookup; each
    decoding ``length`` tokens with every sampling knob of the setting set (``top_k`` 0: none), K = ``k``."""
    from transformers import PreTrainedModel

    target = pair.target

    def runner(make):
        def run(ids, setting, seed):
            p = setting_params(setting)
            return make(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, seed=seed)(ids)["tokens"]
        return run

    out = {"transformers generate": runner(lambda **kw: hf_runner(target, length, **kw))}
    if "model" in pair.drafters:
        draft = pair.drafters["model"].model
        assistant = draft if isinstance(draft, PreTrainedModel) else hf_assistant(draft, target)
        out["transformers assisted"] = runner(lambda **kw: assisted_runner(target, assistant, k, length, **kw))
    out["transformers prompt lookup"] = runner(lambda **kw: prompt_lookup_runner(target, k, length, **kw))
    return out
