"""V0.5 GRPO (value prior + Sequential OSLA) on the offline testbed, optionally against plain GRPO at G = 16.

Examples::

    python examples/testbed/v05_grpo.py --max_steps 30                          # warm testbed model, addition task
    python examples/testbed/v05_grpo.py --max_steps 30 --baseline_grpo 16       # also plain GRPO (G = 16), same prompts/step
    python examples/testbed/v05_grpo.py --prior constant --use_peft             # no-information prior, LoRA adapters
    python examples/testbed/v05_grpo.py --prompt_weighting rollout              # ablation: prompts weighted by rollout count
    python examples/testbed/v05_grpo.py --model_path my/local/model --dataset data.jsonl   # your model and prompts
    accelerate launch --multi_gpu --num_processes 2 examples/testbed/v05_grpo.py            # 2 CPU ranks

``--dataset`` is a local JSON Lines / JSON file or a ``datasets.save_to_disk`` folder with a ``prompt`` column and
the columns your reward uses (the testbed's reward reads ``answer``). Nothing is downloaded.

Writes ``summary.json`` to ``--output_dir``: held-out accuracy before/after (greedy and sampled, testbed test
split), generated completion tokens, the V0.5 diagnostics averaged over training, and the same for the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

PRIORS = ("embedding", "constant", "table")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _common.add_common_args(p, output_dir="outputs/v05", max_steps=30)
    p.add_argument("--task", default="addition", choices=("addition", "substitution"), help="testbed task")
    p.add_argument("--model_path", default=None, help="local model dir (default: the warm testbed model)")
    p.add_argument("--dataset", default=None, help="local train set (jsonl/json/save_to_disk dir); default testbed")
    p.add_argument("--prior", choices=PRIORS, default="embedding",
                   help="value prior: embedding (frozen starting policy -- the LoRA base weights with --use_peft, else a "
                        "copy -- + in-context head, default), "
                        "constant (p = 0.5 ablation) or table (needs --prior_table)")
    p.add_argument("--prior_table", default=None, help="value-table JSONL for --prior table")
    p.add_argument("--v05_k_init", type=int, default=4, help="rollouts per prompt before the test (default 4)")
    p.add_argument("--v05_rollout_cost", type=_common.positive_float, default=0.0039,
                   help="c; cap round(1/sqrt(c))")
    p.add_argument("--prompts_per_step", type=int, default=8,
                   help="unique prompts per step, all ranks (default 8): per_device_train_batch_size = prompts x "
                        "v05_k_init / processes rollouts, TRL's meaning (round 1 = that many rollouts)")
    p.add_argument("--v05_extra_rollout_budget", type=float, default=1.0,
                   help="OSLA rounds generate at most this x round 1's rollouts per step (default 1.0: <= 2x TRL's "
                        "for the same arguments; 0 = no rounds; inf = the paper's unbounded rounds)")
    p.add_argument("--prompt_weighting", choices=("equal", "rollout"), default="equal",
                   help="equal (paper Eq. 10, default): every prompt weighs the same in the loss whatever its rollout "
                        "count; rollout: every rollout token weighs the same")
    p.add_argument("--learning_rate", type=_common.positive_float, default=1e-4)
    p.add_argument("--use_peft", action="store_true", help="train LoRA adapters (peft) instead of all weights")
    p.add_argument("--push_to_hub", action="store_true", help="push the result (needs --hub_model_id and network)")
    p.add_argument("--hub_model_id", default=None)
    p.add_argument("--baseline_grpo", type=int, default=0, metavar="G",
                   help="also train plain GRPO with G rollouts per prompt from the same start (e.g. 16)")
    p.add_argument("--n_eval", type=int, default=200, help="held-out questions (default 200)")
    p.add_argument("--eval_samples", type=int, default=4, help="samples per question for sampled accuracy")
    args = p.parse_args(argv)
    if args.prior == "table" and not args.prior_table:
        p.error("--prior table needs --prior_table PATH")
    if args.push_to_hub and not args.hub_model_id:
        p.error("--push_to_hub needs --hub_model_id")
    if args.baseline_grpo == 1 or args.baseline_grpo < 0:
        p.error("--baseline_grpo must be 0 (off) or >= 2")
    return args


def load_train_dataset(args):
    from trl_ext.testbed import make_dataset, split_size

    if args.dataset is None:
        return make_dataset(args.task, split_size(args.task, "train"), seed=args.seed, split="train")
    from datasets import load_dataset, load_from_disk

    if os.path.isdir(args.dataset):
        ds = load_from_disk(args.dataset)
    else:
        ds = load_dataset("json", data_files=args.dataset, split="train")
    if "prompt" not in ds.column_names:
        raise SystemExit(f"--dataset {args.dataset} has no 'prompt' column (columns: {ds.column_names})")
    return ds


def evaluate(model, tok, test_ds, args, max_new):
    from trl_ext.testbed import evaluate_model

    g = evaluate_model(model, tok, test_ds, args.task, greedy=True, max_new_tokens=max_new)
    s = evaluate_model(model, tok, test_ds, args.task, greedy=False, num_samples=args.eval_samples,
                       max_new_tokens=max_new, temperature=1.0, seed=args.seed + 1)
    return g, s


def _acc(res) -> dict:
    return {"greedy": res[0].accuracy, "sampled": res[1].accuracy}


def common_config(args, max_new, out_dir):
    return dict(output_dir=out_dir, max_steps=args.max_steps, seed=args.seed, learning_rate=args.learning_rate,
                lr_scheduler_type="constant", warmup_steps=0, gradient_accumulation_steps=1,
                max_completion_length=max_new, temperature=1.0, beta=0.0, use_cpu=True, bf16=False,
                logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
                push_to_hub=args.push_to_hub, hub_model_id=args.hub_model_id)


def peft_config(args):
    if not args.use_peft:
        return None
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def summarize_logs(history, keys):
    out = {}
    for k in keys:
        vals = [h[k] for h in history if k in h]
        if vals:
            out[k] = {"mean": sum(vals) / len(vals), "sum": sum(vals), "n": len(vals)}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    _common.setup_torch(args.num_threads)

    import torch
    from accelerate import PartialState
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from trl_ext.testbed import TASKS, get_warm_model, make_dataset
    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer
    from trl_ext.trainers.v05 import V05GRPOConfig, V05GRPOTrainer

    state = PartialState()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (args.prompts_per_step * args.v05_k_init) % world:
        raise SystemExit(f"--prompts_per_step x --v05_k_init ({args.prompts_per_step * args.v05_k_init} rollouts) "
                         f"must be divisible by {world} processes")
    model_path = args.model_path
    if model_path is None:
        with state.main_process_first():
            model_path = get_warm_model(args.task, seed=0, cache_dir=args.cache_dir, verbose=state.is_main_process)
    tok = AutoTokenizer.from_pretrained(model_path)
    max_new = TASKS[args.task].max_answer_chars() + 2
    test_ds = make_dataset(args.task, args.n_eval, seed=0, split="test")
    train_ds = load_train_dataset(args)
    reward_funcs = list(TASKS[args.task].reward_funcs)

    def fresh_model():
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)

    before = after = None
    if state.is_main_process:
        before = evaluate(fresh_model(), tok, test_ds, args, max_new)
        _common.log(f"before: {_acc(before)}")

    prior_kwargs = {"table": args.prior_table, "missing": "default"} if args.prior == "table" else {}
    # TRL's batch arguments: per_device_train_batch_size counts rollouts; round 1 = prompts_per_step x v05_k_init
    # rollouts (num_generations only sizes evaluation groups and, as in TRL, must divide the generation batch)
    v05_cfg = V05GRPOConfig(**common_config(args, max_new, args.output_dir),
                            per_device_train_batch_size=args.prompts_per_step * args.v05_k_init // world,
                            num_generations=args.v05_k_init, v05_extra_rollout_budget=args.v05_extra_rollout_budget,
                            v05_k_init=args.v05_k_init, v05_rollout_cost=args.v05_rollout_cost,
                            v05_value_prior=args.prior, v05_value_prior_kwargs=prior_kwargs,
                            v05_prompt_weighting=args.prompt_weighting)
    t = time.time()
    trainer = V05GRPOTrainer(model=fresh_model(), reward_funcs=reward_funcs, args=v05_cfg, train_dataset=train_ds,
                             processing_class=tok, peft_config=peft_config(args))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    train_time = time.time() - t
    trainer.save_state()  # trainer_state.json (with log_history) in --output_dir, like every example
    trainer.save_model(v05_cfg.output_dir)
    hist = trainer.state.log_history
    keys = ["ext/generated_tokens", "ext/trained_tokens", "ext/rollouts", "v05/rollouts_per_prompt_mean",
            "v05/rollouts_per_prompt_max", "v05/rounds", "v05/early_stop", "v05/rejection_rate", "v05/mean_weight",
            "v05/prior_brier", "v05/baseline_mse_proxy", "v05/discarded_rollouts", "v05/prompt_weight_max",
            "v05/extra_rollouts", "v05/budget_exhausted", "v05/unscorable_rollouts", "reward"]
    logs = summarize_logs(hist, keys)
    method = {"prior": args.prior, "logs": logs}
    if state.is_main_process:
        model = trainer.model.merge_and_unload() if args.use_peft else trainer.model
        after = evaluate(model, tok, test_ds, args, max_new)
        _common.log(f"V0.5 after: {_acc(after)}, generated tokens {logs['ext/generated_tokens']['sum']:.0f}")
    if args.push_to_hub:
        trainer.push_to_hub()

    if args.baseline_grpo:
        g = args.baseline_grpo
        cfg = ExtGRPOConfig(**common_config(args, max_new, os.path.join(args.output_dir, f"grpo_g{g}")),
                            per_device_train_batch_size=args.prompts_per_step * g // world, num_generations=g)
        t = time.time()
        base = GRPOTrainer(model=fresh_model(), reward_funcs=reward_funcs, args=cfg, train_dataset=train_ds,
                           processing_class=tok, peft_config=peft_config(args))
        base.remove_callback(PrinterCallback)
        base.train()
        method[f"grpo_g{g}"] = {"train_s": time.time() - t,
                                "logs": summarize_logs(base.state.log_history, ["ext/generated_tokens", "reward"])}
        if state.is_main_process:
            model = base.model.merge_and_unload() if args.use_peft else base.model
            method[f"grpo_g{g}"]["accuracy_after"] = _acc(evaluate(model, tok, test_ds, args, max_new))
            _common.log(f"GRPO G={g} after: {method[f'grpo_g{g}']['accuracy_after']}, generated tokens "
                        f"{method[f'grpo_g{g}']['logs']['ext/generated_tokens']['sum']:.0f}")
    if state.is_main_process:
        tokens = logs["ext/generated_tokens"]["sum"]
        _common.write_run_outputs(
            args.output_dir, trainer="v05", task=args.task, before=before, after=after,
            curve=[(0, 0.0, before[0].accuracy, before[1].accuracy),
                   (args.max_steps, tokens, after[0].accuracy, after[1].accuracy)],
            train_tokens=tokens, train_rollouts=logs.get("ext/rollouts", {}).get("sum"),
            wall_total=time.time() - t0, wall_train=train_time, world=world, warm_model=model_path,
            config=vars(args), method=method)
        _common.log(f"summary: {os.path.join(args.output_dir, 'summary.json')}")
    state.wait_for_everyone()
    _common.shutdown_distributed()
    return 0


if __name__ == "__main__":
    sys.exit(main())
