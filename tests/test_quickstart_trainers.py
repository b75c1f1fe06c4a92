"""``examples/testbed/quickstart.py --trainer v05`` hands off to ``examples/testbed/v05_grpo.py`` and leaves the standard
outputs."""

import json
import os
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "testbed")


@pytest.fixture()
def quickstart():
    sys.path.insert(0, EXAMPLES)
    import quickstart

    yield quickstart
    sys.path.remove(EXAMPLES)


def test_grpo_is_not_delegated(quickstart):
    assert quickstart._delegate_to_method_example(["--trainer", "grpo"]) is None
    assert set(quickstart.METHOD_EXAMPLES) == {"basis", "v05", "pair"}
    for name in quickstart.METHOD_EXAMPLES.values():
        assert os.path.exists(os.path.join(EXAMPLES, f"{name}.py"))


def test_quickstart_v05_runs_the_v05_example(quickstart, tmp_path):
    import torch

    torch.set_num_threads(1)
    from trl_ext.testbed import save_tiny_model

    model_dir = save_tiny_model(str(tmp_path / "tiny"), seed=0)
    out = tmp_path / "out"
    rc = quickstart.main(["--trainer", "v05", "--output_dir", str(out), "--max_steps", "1", "--seed", "0",
                          "--model_path", model_dir, "--n_eval", "4", "--eval_samples", "1",
                          "--prior", "constant"])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema"] == "trl_ext.testbed_summary/v1" and summary["trainer"] == "v05"
    assert set(summary["accuracy_before"]) == set(summary["accuracy_after"]) == {"greedy", "sampled"}
    assert summary["generated_tokens"]["train_completion_tokens"] > 0 and len(summary["curve"]) == 2
    for name in summary["outcomes"].values():  # per-question outcomes trl-ext compare reads, and the plot
        assert (out / name).exists()
    assert (out / "accuracy_vs_tokens.png").exists()
    from trl_ext.cli import main as cli

    assert cli(["compare", "--a", str(out / "outcomes_before_sampled.jsonl"), "--b",
                str(out / "outcomes_after_sampled.jsonl"), "--n-boot", "200", "--n-sim", "50"]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and state["log_history"]
