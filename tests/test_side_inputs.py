"""Estimator side inputs: declared at registration, supplied by a rollout strategy, validated at construction.

Runs the worked example of ``docs/architecture.md`` as written (``tests/scripts/side_inputs_run.py``) on one and on
two CPU ranks and checks the advantages against the example's equation ``A_i = r_i - pass_rate(prompt_i)``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "side_inputs_run.py")
sys.path.insert(0, os.path.dirname(SCRIPT))

import side_inputs_run  # noqa: E402

from trl_ext import ExtGRPOConfig  # noqa: E402
from trl_ext.estimators import estimator_side_inputs  # noqa: E402
from trl_ext.trainers.rollouts import FixedGroups, RolloutStrategy, get_rollout_strategy  # noqa: E402


def _config(**kw):
    return ExtGRPOConfig("out", use_cpu=True, per_device_train_batch_size=8, report_to="none", **kw)


def _check(rec):
    real = ~rec["is_pad"]
    r = rec["rewards"][real].double().numpy()
    prior = np.asarray([side_inputs_run.pass_rate_of(int(i)) for i in rec["row_idx"][real]])
    np.testing.assert_array_equal(rec["prior"][real.numpy()], prior)
    adv = rec["advantages"][real].double().numpy()
    expected = np.where(np.isfinite(r), r - prior, 0.0)
    np.testing.assert_allclose(adv, expected, rtol=0, atol=1e-6)
    assert np.any(np.abs(adv) > 0)  # the example did train on a nonzero signal
    assert rec["strategy"] == "column_prior"


def test_the_worked_example_registers_and_validates():
    ns = side_inputs_run.run_example()
    assert estimator_side_inputs("prior_baseline") == {"prior": "group"}
    assert get_rollout_strategy("column_prior") is ns["ColumnPrior"]
    assert ns["args"].rollout_strategy_kwargs == {"column": "pass_rate"}
    # the estimator without a strategy that provides its side input: refused at construction, naming the fix
    with pytest.raises(ValueError, match=r"needs side input\(s\) \['prior'\].*'fixed_groups'.*column_prior"):
        _config(advantage_estimator="prior_baseline", num_generations=1)


def test_one_process(tmp_path):
    side_inputs_run.train(str(tmp_path), world=1)
    _check(torch.load(tmp_path / "rank0.pt", weights_only=False))


@pytest.mark.multiprocess
def test_two_processes(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_DEBUG_MODE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           SCRIPT, "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert r0["world"] == 2
    for key in ("rewards", "row_idx", "advantages"):  # the gathered batch is identical on both ranks
        assert torch.equal(torch.nan_to_num(r0[key]), torch.nan_to_num(r1[key]))
    _check(r0)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(advantage_estimator="basis", num_generations=1), r"\['p_hat'\].*BASISTrainer"),
        (dict(advantage_estimator="v05"), r"\['priors'\].*V05GRPOTrainer"),
        (dict(advantage_estimator="pair"), r"\['inclusion', 'selected'\].*PAIRTrainer"),
        (dict(advantage_estimator="pair_draw"), r"\['draws'\] \(draws: from its estimator_inputs\).*PAIRTrainer"),
        (dict(rollout_strategy="no_such_strategy"), r"rollout_strategy='no_such_strategy' is not registered"),
        (dict(dynamic_sampling=True, rollout_strategy="fixed_groups"), r"dynamic_sampling=True selects"),
        (dict(rollout_strategy_kwargs="[1]"), r"rollout_strategy_kwargs must be"),
    ],
)
def test_unservable_combinations_fail_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        _config(**kw)


def test_method_configs_refuse_a_rollout_strategy():
    from trl_ext import BASISConfig, PAIRConfig, V05GRPOConfig

    for cls, extra in ((V05GRPOConfig, {}), (BASISConfig, {"num_generations": 1}), (PAIRConfig, {})):
        with pytest.raises(ValueError, match="trains with advantage_estimator=.*ExtGRPOConfig"):
            cls("out", use_cpu=True, per_device_train_batch_size=8, rollout_strategy="fixed_groups", **extra)


def test_a_subclass_strategy_must_provide_the_side_inputs(tmp_path):
    """A trainer subclass overriding create_rollout_strategy is checked against the estimator at construction."""
    side_inputs_run.run_example()
    from base_helpers import hash_reward, make_config, tiny_dataset, tiny_model_and_tokenizer

    from trl_ext import GRPOTrainer

    class Plain(GRPOTrainer):
        def create_rollout_strategy(self):
            return FixedGroups()

    model, tok = tiny_model_and_tokenizer(0)
    args = make_config(tmp_path, advantage_estimator="prior_baseline", rollout_strategy="column_prior",
                       num_generations=1)
    with pytest.raises(ValueError, match=r"needs side input\(s\) \['prior'\]"):
        Plain(model=model, reward_funcs=[hash_reward], args=args, train_dataset=tiny_dataset(16),
              processing_class=tok)


def test_registry_rejects_bad_declarations():
    from trl_ext.estimators import register_advantage_estimator
    from trl_ext.trainers.rollouts import register_rollout_strategy

    with pytest.raises(ValueError, match="level must be one of"):
        register_advantage_estimator("bad_level", side_inputs={"x": "token"})
    with pytest.raises(ValueError, match="other than rewards/group_ids"):
        register_advantage_estimator("bad_name", side_inputs={"rewards": "row"})
    with pytest.raises(TypeError, match="RolloutStrategy subclass"):
        register_rollout_strategy("not_a_strategy")(object)
    with pytest.raises(ValueError, match="already registered"):
        register_rollout_strategy("fixed_groups")(type("Other", (RolloutStrategy,), {}))
