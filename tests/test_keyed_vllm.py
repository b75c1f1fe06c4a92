"""Keyed sampling on TRL's vLLM colocate path: one ``SamplingParams(seed=per_request_seed(key, j))`` per row.

vLLM is not installed (and there is no GPU), so TRL's real ``VLLMGeneration.generate`` (colocate branch) runs on an
instance built without ``__init__``, with ``SamplingParams`` patched to a stand-in that has ``clone()`` and ``seed``,
and ``llm`` a stand-in engine that records the ``SamplingParams`` list it receives and draws each completion from a
generator seeded with that request's seed only (like vLLM's per-request generator): from the tiny model in the
trainer tests, from a hash of (seed, prompt) in the property tests.
"""

from __future__ import annotations

import copy
import json
import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.generation.keyed_sampler import KeyedRequest, KeyedSampler
from trl_ext.generation.keyed_vllm import VLLM_SEED_SCHEME, PerRequestSeedLLM, check_vllm_keyed_config
from trl_ext.measurement.keyed_sampling import per_request_seed, prompt_key_of, request_key

torch.set_num_threads(1)

PROMPTS = ["1+2=", "12+34=", "5+67=", "9+9="]


# ------------------------------------------------------------------------------------------------ stand-ins
@dataclass
class FakeSamplingParams:
    """The fields TRL 1.16 passes to ``SamplingParams`` in colocate mode, plus ``seed`` and ``clone()``."""

    n: int = 1
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 16
    logprobs: int | None = None
    seed: int | None = None

    def clone(self):
        return copy.copy(self)


class FakeLLM:
    """Records each call's SamplingParams list; a completion depends only on (seed, prompt, weights)."""

    def __init__(self, model_fn=None, eos=None, vocab=20):
        self.model_fn, self.eos, self.vocab = model_fn, eos, vocab
        self.received: list[list[FakeSamplingParams]] = []
        self.fail = False
        self.owner = None  # the VLLMGeneration whose .llm this is (to see the proxy during the call)
        self.seen_proxy: list[bool] = []
        self.woken = 0

    def wake_up(self, tags=None):
        self.woken += 1

    def _draw(self, ids, sp):
        if self.model_fn is None:  # pseudo-random tokens from (seed, prompt) only
            rng = np.random.default_rng([sp.seed, *ids])
            toks = [int(t) for t in rng.integers(0, self.vocab, size=int(rng.integers(1, sp.max_tokens + 1)))]
            return toks, [-1.0] * len(toks)
        model = self.model_fn()
        g = torch.Generator().manual_seed(sp.seed)  # vLLM: one generator per seeded request
        out, lps = [], []
        with torch.no_grad():
            for _ in range(sp.max_tokens):
                logp = torch.log_softmax(model(torch.tensor([ids + out])).logits[0, -1].float() / sp.temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=g))
                out.append(tok)
                lps.append(float(logp[tok]))
                if tok == self.eos:
                    break
        return out, lps

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        if self.owner is not None:
            proxy = self.owner.llm
            self.seen_proxy.append(isinstance(proxy, PerRequestSeedLLM) and proxy._llm is self)
        if self.fail:
            raise RuntimeError("engine failure")
        assert isinstance(sampling_params, list) and len(sampling_params) == len(prompts)
        assert all(sp.seed is not None for sp in sampling_params), "stand-in refuses unseeded requests"
        self.received.append(list(sampling_params))
        outs = []
        for p, sp in zip(prompts, sampling_params):
            ids = list(p["prompt_token_ids"])
            toks, lps = self._draw(ids, sp)
            lp = [{t: types.SimpleNamespace(logprob=v, rank=1)} for t, v in zip(toks, lps)]
            outs.append(types.SimpleNamespace(prompt_token_ids=ids,
                                              outputs=[types.SimpleNamespace(token_ids=toks, logprobs=lp)]))  # fmt: skip
        return outs


@pytest.fixture(scope="module")
def colocate():
    """Factory for TRL's real ``VLLMGeneration`` (colocate, TP=1) around a FakeLLM; records TRL-built templates."""
    import trl.generation.vllm_generation as vgmod

    templates = []

    def make_sp(**kw):
        sp = FakeSamplingParams(**kw)
        templates.append(sp)
        return sp

    mp = pytest.MonkeyPatch()
    mp.setattr(vgmod, "SamplingParams", make_sp, raising=False)

    def build(llm, model=None, max_tokens=5, temperature=1.0):
        vg = vgmod.VLLMGeneration.__new__(vgmod.VLLMGeneration)
        vg.accelerator = types.SimpleNamespace(num_processes=1, process_index=0, is_main_process=True)
        vg.model = model if model is not None else torch.nn.Linear(1, 1)
        vg.mode, vg.tensor_parallel_size = "colocate", 1
        vg.enable_sleep_mode, vg._llm_weights_sleeping, vg.structured_outputs_regex = False, False, None
        vg.temperature, vg.top_p, vg.top_k, vg.min_p, vg.repetition_penalty = temperature, 1.0, 0, None, 1.0
        vg.max_completion_length, vg.logprobs, vg.generation_kwargs = max_tokens, 0, {}
        vg.syncs = 0

        def sync_weights():
            vg.syncs += 1

        vg.sync_weights = sync_weights
        vg.llm = llm
        llm.owner = vg
        return vg

    build.templates = templates
    yield build
    mp.undo()


class _TRLLike(types.SimpleNamespace):
    """A trainer whose unkeyed generation is TRL's vLLM branch of ``_generate_single_turn`` (what the keyed vLLM
    path runs with the per-request-seed engine swapped in)."""

    def generate_unkeyed(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        _, completion_ids, logprobs, _ = self.vllm_generation.generate(
            prompts=prompt_ids, images=images, num_generations=num_generations
        )
        return completion_ids, [[lp[0] for lp in seq] for seq in logprobs]


def _standin(vg, **args):
    base = dict(seed=0, generation_kwargs=None, keyed_sampling=True, keyed_sampling_log=False,
                keyed_sampling_seed=None, keyed_sampling_key_column=None, shared_prefix_rollouts=False,
                vllm_tensor_parallel_size=1)
    trainer = _TRLLike(args=types.SimpleNamespace(**{**base, **args}), use_vllm=True, vllm_mode="colocate",
                       vllm_tensor_parallel_size=1, use_transformers_continuous_batching=False, vllm_generation=vg)
    return KeyedSampler(trainer)


def _run(obj, rows):
    """rows: list of (prompt_ids, key, sample_index) -> completions (one keyed call)."""
    obj.set_requests([KeyedRequest(key=k, sample_index=j) for _, k, j in rows])
    comps, _ = obj.generate([list(p) for p, _, _ in rows], None, {}, 1)
    return comps


# ------------------------------------------------------------------------------------------------ property tests
KEYS = st.integers(0, 2**63 - 1)
ROW = st.tuples(st.lists(st.integers(2, 19), min_size=1, max_size=4), KEYS, st.integers(0, 40))


@settings(max_examples=30, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=8, unique_by=lambda r: (r[1], r[2])), st.randoms(use_true_random=False))
def test_each_row_gets_its_own_seed_independent_of_companions(colocate, rows, rnd):
    llm = FakeLLM()
    vg = colocate(llm)
    obj = _standin(vg)
    comps = _run(obj, rows)
    sent = llm.received[-1]
    assert [sp.seed for sp in sent] == [per_request_seed(k, j) for _, k, j in rows]
    assert len({sp.seed for sp in sent}) == len(rows)  # distinct (key, sample index) -> distinct seeds
    # TRL's single template is cloned, never modified; every clone keeps TRL's other settings
    tmpl = colocate.templates[-1]
    assert tmpl.seed is None and all(sp is not tmpl and sp.max_tokens == tmpl.max_tokens for sp in sent)
    assert vg.llm is llm and llm.seen_proxy == [True]
    # the same rows again: the same seeds and completions (stable across calls)
    assert _run(obj, rows) == comps and [sp.seed for sp in llm.received[-1]] == [sp.seed for sp in sent]
    # any subset in any order: each row keeps its seed and its completion
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    perm = perm[: rnd.randint(1, len(rows))]
    sub = _run(obj, [rows[i] for i in perm])
    assert [sp.seed for sp in llm.received[-1]] == [sent[i].seed for i in perm]
    assert sub == [comps[i] for i in perm]


@given(KEYS, st.integers(0, 1000))
def test_seeds_differ_across_sample_indices_and_keys(key, j):
    s = per_request_seed(key, j)
    assert s != per_request_seed(key, j + 1)
    assert s != per_request_seed((key + 1) % 2**63, j)


def test_sample_indices_are_the_shared_count_of_the_transformers_path(colocate):
    """No explicit requests: keys and sample indices come from requests_for_rows, as with transformers."""
    llm = FakeLLM()
    obj = _standin(colocate(llm), keyed_sampling_seed=3)
    obj.trainer.model = types.SimpleNamespace(training=True)
    obj.trainer.state = types.SimpleNamespace(global_step=2)
    obj.trainer.accelerator = types.SimpleNamespace(num_processes=1, process_index=0)
    rows = [{"prompt": "a"}, {"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"}]
    ids = [[5, 6], [5, 6], [7], [5, 6]]
    with obj.batch_rows(rows):
        obj.generate(ids, None, {}, 1)
    keys = [request_key(3, 2, prompt_key_of(r["prompt"])) for r in rows]
    expect = [per_request_seed(k, j) for k, j in zip(keys, [0, 1, 0, 2])]
    assert [sp.seed for sp in llm.received[-1]] == expect
    with obj.batch_rows(rows[:2]):  # a second call at the same step continues the count
        obj.generate(ids[:2], None, {}, 1)
    assert [sp.seed for sp in llm.received[-1]] == [per_request_seed(keys[0], 3), per_request_seed(keys[0], 4)]


# ------------------------------------------------------------------------------------------------ proxy and guards
def test_proxy_is_removed_after_a_failing_call(colocate):
    llm = FakeLLM()
    vg = colocate(llm)
    obj = _standin(vg)
    llm.fail = True
    with pytest.raises(RuntimeError, match="engine failure"):
        _run(obj, [([3, 4], 11, 0)])
    assert vg.llm is llm and llm.seen_proxy == [True]
    llm.fail = False
    assert len(_run(obj, [([3, 4], 11, 0)])) == 1 and vg.llm is llm


def test_proxy_refuses_what_would_misassign_seeds():
    llm = FakeLLM()
    sp = FakeSamplingParams()
    prompts = [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]

    def proxy():
        return PerRequestSeedLLM(llm, [[1, 2], [3]], [10, 20])

    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        PerRequestSeedLLM(llm, [[1, 2], [3]], [10])
    with pytest.raises(RuntimeError, match="one SamplingParams"):
        proxy().generate(prompts, sampling_params=[sp, sp])
    with pytest.raises(RuntimeError, match="one SamplingParams"):
        proxy().generate(prompts)
    with pytest.raises(RuntimeError, match="n=1"):
        proxy().generate(prompts, sampling_params=FakeSamplingParams(n=2))
    with pytest.raises(RuntimeError, match="already carries seed=5"):
        proxy().generate(prompts, sampling_params=FakeSamplingParams(seed=5))
    with pytest.raises(RuntimeError, match="got 1 prompts but the keyed call has 2 rows"):
        proxy().generate(prompts[:1], sampling_params=sp)
    with pytest.raises(RuntimeError, match="prompt 1 .* keyed row 1"):
        proxy().generate([prompts[0], {"prompt_token_ids": [4]}], sampling_params=sp)
    p = proxy()
    out = p.generate(prompts, sampling_params=sp, use_tqdm=False)
    assert [o.prompt_token_ids for o in out] == [[1, 2], [3]] and [x.seed for x in p.sampling_params] == [10, 20]
    assert sp.seed is None and p.template is sp
    with pytest.raises(RuntimeError, match="called twice"):
        p.generate(prompts, sampling_params=sp)
    p.wake_up(tags=["kv_cache"])  # other attributes reach the real engine
    assert llm.woken == 1


def test_config_guards():
    check_vllm_keyed_config("colocate", 1, None)
    check_vllm_keyed_config("colocate", 1, {"n": 1, "presence_penalty": 0.1})
    with pytest.raises(NotImplementedError, match="vllm_mode='colocate' only .got 'server'.*per-request seed"):
        check_vllm_keyed_config("server", 1, None)
    with pytest.raises(NotImplementedError, match="vllm_tensor_parallel_size=1 .got 2"):
        check_vllm_keyed_config("colocate", 2, None)
    with pytest.raises(ValueError, match="seed=7"):
        check_vllm_keyed_config("colocate", 1, {"seed": 7})
    with pytest.raises(ValueError, match="n=4"):
        check_vllm_keyed_config("colocate", 1, {"n": 4})


def test_continuations_are_refused_on_vllm(colocate):
    llm = FakeLLM()
    obj = _standin(colocate(llm))
    obj.set_requests([KeyedRequest(key=1, sample_index=0, position_offset=3)])
    with pytest.raises(NotImplementedError, match="position_offset"):
        obj.generate([[3, 4]], None, {}, 1)
    assert llm.received == []


def _tiny():
    from trl_ext.testbed.model import build_tiny_model
    from trl_ext.testbed.tokenizer import build_tokenizer

    tok = build_tokenizer()
    return tok, build_tiny_model(tok, seed=0)


def _reward_len(completions, **kw):
    return [float(len(c)) for c in completions]


@pytest.mark.parametrize(
    "cfg, exc, msg",
    [
        ({"vllm_mode": "server"}, NotImplementedError, "colocate"),
        ({"vllm_mode": "colocate", "vllm_tensor_parallel_size": 2}, NotImplementedError, "tensor_parallel_size=1"),
        ({"vllm_mode": "colocate", "generation_kwargs": {"seed": 1}}, ValueError, "seed=1"),
    ],
)
def test_unsupported_vllm_configs_fail_at_construction_before_vllm_starts(tmp_path, cfg, exc, msg):
    """The check runs before TRL's __init__: no server connection, no engine start (vLLM is not even installed)."""
    from datasets import Dataset

    from trl_ext import ExtGRPOConfig, GRPOTrainer

    tok, model = _tiny()
    args = ExtGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                         per_device_train_batch_size=2, max_completion_length=3, use_vllm=True, keyed_sampling=True,
                         **cfg)  # fmt: skip
    with pytest.raises(exc, match=msg):
        GRPOTrainer(model=model, reward_funcs=_reward_len, args=args, train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
                    processing_class=tok)  # fmt: skip


# ------------------------------------------------------------------------------------------------ real trainer
def _train_vllm(out_dir, colocate, *, batch=8, steps=2):
    """trl_ext.GRPOTrainer built for transformers, then switched to TRL's vLLM colocate path on the stand-in."""
    from datasets import Dataset

    from trl_ext import ExtGRPOConfig, GRPOTrainer

    tok, model = _tiny()
    ds = Dataset.from_dict({"prompt": PROMPTS * 4})
    args = ExtGRPOConfig(
        output_dir=str(out_dir), use_cpu=True, bf16=False, report_to="none", max_completion_length=5,
        per_device_train_batch_size=batch, num_generations=4, max_steps=steps, learning_rate=5e-2, logging_steps=1,
        save_strategy="no", seed=0, temperature=1.0, disable_tqdm=True, keyed_sampling=True,
    )  # fmt: skip
    tr = GRPOTrainer(model=model, reward_funcs=_reward_len, args=args, train_dataset=ds, processing_class=tok)
    eos = tok.eos_token_id
    llm = FakeLLM(model_fn=lambda: tr.accelerator.unwrap_model(tr.model), eos=eos)
    vg = colocate(llm, model=tr.model, max_tokens=5, temperature=1.0)
    tr.use_vllm, tr.vllm_mode, tr.vllm_tensor_parallel_size = True, "colocate", 1
    tr.vllm_generation, tr._last_loaded_step = vg, -1
    tr.keyed_sampler.check_supported()  # colocate + TP 1 passes the construction-time check
    tr.train()
    recs = [json.loads(x) for x in open(out_dir / "rollouts" / "rank0.jsonl")]
    return tr, llm, vg, recs, tok


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory, colocate):
    root = tmp_path_factory.mktemp("keyed_vllm")
    return _train_vllm(root / "a", colocate), root


def test_trainer_logs_vllm_rollouts_with_per_row_seeds(vllm_run):
    (tr, llm, vg, recs, tok), _ = vllm_run
    assert vg.llm is llm and llm.seen_proxy == [True, True] and vg.syncs == 2  # one call per step, proxy removed
    assert len(recs) == 16 and [len(c) for c in llm.received] == [8, 8]
    sent = [sp.seed for call in llm.received for sp in call]
    assert [r["request_seed"] for r in recs] == sent  # the log says which seed each row was sampled with
    for r in recs:
        assert r["backend"] == "vllm" and r["seed_scheme"] == VLLM_SEED_SCHEME and "sampler" not in r
        assert r["request_seed"] == per_request_seed(r["key"], r["sample_index"])
        assert r["key"] == request_key(0, r["step"], prompt_key_of(r["prompt"]))
        assert r["vllm_sampling_params"]["max_tokens"] == 5 and r["vllm_sampling_params"]["n"] == 1
        assert r["checkpoint"] == (None if r["step"] == 0 else str(tr.args.output_dir) + f"/checkpoint-{r['step']}")
        assert tok.decode(r["prompt_ids"]).endswith(r["prompt"])
    for step in (0, 1):  # G = 4 rollouts of each prompt: sample indices 0..3, four distinct seeds
        by_key = {}
        for r in recs:
            if r["step"] == step:
                by_key.setdefault(r["key"], []).append(r)
        assert len(by_key) == 2
        for group in by_key.values():
            assert sorted(r["sample_index"] for r in group) == [0, 1, 2, 3]
            assert len({r["request_seed"] for r in group}) == 4
    # TRL consumed the stand-in's sampling log-probs: the importance-sampling ratio is ~1 (aligned rows)
    assert tr.state.log_history[0]["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)


def test_logged_record_regenerates_alone_from_its_seed(vllm_run):
    """On the stand-in engine the log suffices to re-issue a step-0 request alone (prompt ids + params + seed)."""
    (_, _, _, recs, tok), _ = vllm_run
    _, init = _tiny()
    fresh = FakeLLM(model_fn=lambda: init, eos=tok.eos_token_id)
    for r in [r for r in recs if r["step"] == 0][:3]:
        sp = FakeSamplingParams(**r["vllm_sampling_params"], seed=r["request_seed"])
        out = fresh.generate([{"prompt_token_ids": r["prompt_ids"]}], sampling_params=[sp])
        assert list(out[0].outputs[0].token_ids) == r["completion_ids"]


def test_seed_of_a_request_does_not_depend_on_the_batch_it_was_in(vllm_run, colocate):
    """Half the batch size: step-0 rows shared with the first run carry the same seeds and completions."""
    (_, _, _, recs_a, _), root = vllm_run
    *_, recs_b, _ = _train_vllm(root / "b", colocate, batch=4, steps=1)
    a = {(r["key"], r["sample_index"]): r for r in recs_a if r["step"] == 0}
    b = {(r["key"], r["sample_index"]): r for r in recs_b if r["step"] == 0}
    shared = set(a) & set(b)
    assert len(shared) >= 4 and {r["call"]["rows"] for r in b.values()} == {4}
    for k in shared:
        assert a[k]["request_seed"] == b[k]["request_seed"] and a[k]["completion_ids"] == b[k]["completion_ids"]


def test_record_backends_and_what_replay_accepts(tmp_path):
    """Transformers records carry the keyed sampler; vLLM records do not, and trl-ext replay refuses them."""
    from trl_ext.measurement.keyed_sampling import HASH_VERSION, SamplerSettings
    from trl_ext.measurement.replay import load_rollout_log

    obj = _standin(None, keyed_sampling_log=True)
    t = obj.trainer
    t.args.output_dir = str(tmp_path)
    t.state = types.SimpleNamespace(global_step=0)
    t.accelerator = types.SimpleNamespace(process_index=0)
    t.model = torch.nn.Linear(1, 1)
    settings_ = SamplerSettings(temperature=1.0, max_new_tokens=3, eos_token_ids=[1], pad_token_id=0)
    obj._write_transformers_records([[4, 5]], [[6, 1]], [KeyedRequest(key=9, sample_index=2)], settings_,
                                    {"padded_prompt_length": 2})
    (rec,) = load_rollout_log(tmp_path / "rollouts" / "rank0.jsonl")
    assert rec["backend"] == "transformers" and rec["hash_version"] == HASH_VERSION
    assert SamplerSettings.from_dict(rec["sampler"]) == settings_ and rec["call"]["padded_prompt_length"] == 2
    assert "request_seed" not in rec and rec["completion_ids"] == [6, 1]
    vllm_log = tmp_path / "vllm.jsonl"
    vrec = {k: v for k, v in rec.items() if k not in ("sampler", "hash_version")}
    vllm_log.write_text(json.dumps({**vrec, "backend": "vllm", "request_seed": per_request_seed(9, 2)}) + "\n")
    with pytest.raises(ValueError, match="sampled by vLLM"):
        load_rollout_log(vllm_log)

