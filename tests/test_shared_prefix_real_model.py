"""Shared-prefix rollouts on the real model (SmolLM2-135M-Instruct): keyed byte-identity with the non-shared path.

Marked ``real_model`` (kept out of the default run; ``python -m pytest -q -m real_model
tests/test_shared_prefix_real_model.py``). The model is built once into the cache by ``trl-ext fetch-real-model``
(or by the first ``real_model`` test); afterwards no network is used. About a minute on one CPU thread.

The testbed identity tests (``tests/test_shared_prefix.py``) use tiny Llama models of a few thousand parameters.
Here the same claim is checked on a 135M-parameter chat model, with its real chat template and two-shot prompts of
~170 tokens: ``shared_prefix_generate(keyed=...)`` returns exactly the tokens ``keyed_generate`` (the keyed
``model.generate`` path the trainers use without sharing) draws for the same keys, while the ``G`` samples of a
prompt do share long prefixes (so the identity covers real shared branches and forks, not a sampler that forked at
the first token).
"""

from __future__ import annotations

import time

import pytest

G = 4
MAX_NEW_TOKENS = 32


@pytest.fixture(scope="module")
def real_model_and_tokenizer():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.realmodel import get_real_model

    torch.set_num_threads(1)
    path = get_real_model()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tok


def _chat_prompts(tok) -> list[list[int]]:
    """Four two-shot chat prompts from the real tasks' test split (two ``sum3``, two ``largest``), templated as TRL
    templates a conversational prompt (``add_generation_prompt=True``)."""
    from trl_ext.realmodel import make_real_dataset

    rows = (make_real_dataset("sum3", 2, seed=0, split="test", as_list=True)
            + make_real_dataset("largest", 2, seed=0, split="test", as_list=True))  # fmt: skip
    return [list(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]) for r in rows]  # fmt: skip


@pytest.mark.real_model
@pytest.mark.timeout(300)
@pytest.mark.parametrize("temperature,top_p", [(0.7, None), (1.0, 0.95)])
def test_keyed_shared_prefix_is_byte_identical_on_the_real_model(real_model_and_tokenizer, temperature, top_p):
    import torch

    from trl_ext.measurement.keyed_sampling import SamplerSettings, keyed_generate, request_key
    from trl_ext.measurement.shared_prefix import KeyedRows, shared_prefix_generate

    model, tok = real_model_and_tokenizer
    prompts = _chat_prompts(tok)
    assert len(set(map(tuple, prompts))) == 4 and min(map(len, prompts)) > 100
    rows = [p for p in prompts for _ in range(G)]
    keys = [request_key(0, 3, f"prompt{i}") for i in range(len(prompts)) for _ in range(G)]
    sidx = [j for _ in prompts for j in range(G)]
    s = SamplerSettings(temperature=temperature, top_p=top_p, max_new_tokens=MAX_NEW_TOKENS,
                        eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id)  # fmt: skip
    t0 = time.monotonic()
    with torch.no_grad():
        want = keyed_generate(model, rows, keys, sidx, s)
        t1 = time.monotonic()
        got, st = shared_prefix_generate(model, rows, s, keyed=KeyedRows(keys, sidx))
    t2 = time.monotonic()
    print(f"\n[real model] T={temperature} top_p={top_p}: keyed_generate {t1 - t0:.1f}s, shared {t2 - t1:.1f}s, "
          f"decode shared {st['decode_shared_fraction']:.2f}, saved {st['saved_fraction']:.2f}, forks {st['forks']}")
    assert got == want  # same keys -> same tokens, row by row
    assert all(1 <= len(c) <= MAX_NEW_TOKENS for c in got)
    assert len(set(map(tuple, got))) > len(prompts)  # the samples of some prompt differ: branches forked ...
    assert st["forks"] > 0 and st["decode_shared_fraction"] > 0.1  # ... after sharing real decode positions
    assert st["computed_tokens"] < st["independent_tokens"] and st["generated_tokens"] == sum(map(len, got))
    # the keyed tokens do not depend on which rows share the call: the first prompt's group alone gives the same
    with torch.no_grad():
        alone, _ = shared_prefix_generate(model, rows[:G], s, keyed=KeyedRows(keys[:G], sidx[:G]))
    assert alone == want[:G]
