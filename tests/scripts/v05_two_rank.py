"""A few V0.5 steps with a stand-in reward/prior, run under
``ACCELERATE_DEBUG_MODE=1 torchrun --standalone --nproc_per_node 2 tests/scripts/v05_two_rank.py OUT_DIR [STEPS]``
or in-process through :func:`run` (1 process).

Stand-in: the reward of a rollout is the prompt's fixed success bit ``truth(row) = row % 2`` (so every per-prompt
decision is a function of the prompt and its prior only, and must not depend on the number of processes), and the
prior is exact except on a "corrupted" set of rows where it predicts the opposite. Generation is forced into the
collective mode (``trl_ext.trainers._trl_compat.generation_is_collective`` patched: the base trainer's
``generate_rollouts`` then pads every rank's call to the same length in every round) so the padding path runs too.

With a third argument ``keyed``, generation is left non-collective (a rank whose prompts are all done skips the
round) and ``keyed_sampling=True``: building keyed requests is a collective every rank must still join.

With a third argument ``by_config``, the same run on ``trl_ext.GRPOTrainer`` with ``advantage_estimator="v05",
rollout_strategy="v05_osla"`` and the V0.5 options in ``rollout_strategy_kwargs`` (the prior as a table).

With a third argument ``embedding``, the run uses V0.5's **default** prior (the batch-invariant embedding prior on a
frozen copy of the starting policy), keyed sampling (every rollout's noise is a function of its prompt and sample
index, so both layouts draw the same rollouts) and a reward that depends on the completion; rank 0 also writes
``OUT_DIR/params.pt`` (the final parameters, trained with plain SGD) and the prior's outputs per step (``prior_p``),
for the bitwise 1-vs-2-process comparison.

Per step the global batch is 8 prompts: ``per_device_train_batch_size = 32 // world`` rollouts (TRL's meaning),
``v05_k_init = 4``, so round 1 holds 8 prompts x 4 rollouts on any number of processes. With a third argument
``one_prompt`` the batch is a single prompt (4 rollouts), so with 2 processes rank 1 holds no prompt and contributes a
masked pad row while still joining every collective (forced collective generation).

Each rank writes ``OUT_DIR/rank{r}.json``: per step the global per-prompt decisions ``{row_idx: k}``, rounds,
early stop, buffer fingerprint, the number of rows this rank passed to every ``generate_rollouts`` call (``calls``),
the length of every backend call after the collective padding (``backend_calls``), and its world size.
"""

import json
import os
import sys
import zlib

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

CORRUPTED = frozenset({0, 1, 2, 5, 8, 13})


def truth(row_idx: int) -> float:
    return float(row_idx % 2)


def run(out_dir: str, max_steps: int = 2, force_collective: bool = True, v05_dispatch_multiple: int = 1,
        keyed: bool = False, embedding: bool = False, n_prompts: int = 8, by_config: bool = False) -> dict:
    import torch

    torch.set_num_threads(1)
    from trl_ext.priors import CallablePrior
    from trl_ext.testbed import build_tiny_model, build_tokenizer, make_dataset
    from trl_ext.trainers import _trl_compat as compat
    from trl_ext.trainers.v05 import V05GRPOConfig, V05GRPOTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))  # PartialState() before the config may not see the CPU ranks
    ds = make_dataset("addition", 16, seed=0)
    index = {ds[i]["prompt"]: i for i in range(len(ds))}

    def reward(prompts, completions, trl_ext_row_idx, **kw):
        if embedding:  # prompts starting with 0-4 always succeed, the others 1 time in 4 (by completion): the
            # embedding prior has something to learn and the fused advantages depend on the completions
            return [float(p[0] in "01234" or zlib.crc32(c.encode()) % 4 == 0) for p, c in zip(prompts, completions)]
        return [truth(i) for i in trl_ext_row_idx]

    def prior_fn(targets, ctx_prompts, ctx_outcomes):
        out = []
        for t in targets:
            i = index[t]
            out.append(1.0 - truth(i) if i in CORRUPTED else truth(i))
        return out

    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=0)
    cfg = V05GRPOConfig(
        output_dir=os.path.join(out_dir, "run"), per_device_train_batch_size=4 * n_prompts // world, num_generations=2,
        max_completion_length=4, max_steps=max_steps, learning_rate=1e-2 if embedding else 1e-3, use_cpu=True,
        bf16=False, report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
        v05_dispatch_multiple=v05_dispatch_multiple, keyed_sampling=keyed or embedding, v05_context_size=8,
        # embedding: plain SGD, so the final parameters compare at the float-summation level (Adam's first steps are
        # ~lr * g / |g| per entry and blow the reduction-order noise of near-zero gradient entries up to ~lr)
        **({"optim": "sgd"} if embedding else {}),
    )

    base_cls, prior = V05GRPOTrainer, None if embedding else CallablePrior(prior_fn)
    if by_config:  # trl_ext.GRPOTrainer with the V0.5 options in rollout_strategy_kwargs; the same prior as a table
        from trl_ext import ExtGRPOConfig, GRPOTrainer

        own = {f[4:]: v for f, v in vars(cfg).items() if f.startswith("v05_") and f != "v05_value_prior_kwargs"}
        table = {t: p for t, p in zip(ds["prompt"], prior_fn(ds["prompt"], [], []))}
        rest = {k: v for k, v in cfg.to_dict().items() if not k.startswith("v05_") and k in
                ("output_dir", "per_device_train_batch_size", "num_generations", "max_completion_length", "max_steps",
                 "learning_rate", "use_cpu", "bf16", "report_to", "logging_steps", "save_strategy", "disable_tqdm",
                 "seed", "keyed_sampling")}
        cfg = ExtGRPOConfig(**rest, advantage_estimator="v05", rollout_strategy="v05_osla", rollout_strategy_kwargs={
            **own, "value_prior": "table", "value_prior_kwargs": {"table": table}})
        base_cls, prior = GRPOTrainer, None

    records, calls, backend_calls, drawn = [], [], [], []

    class Recording(base_cls):
        def generate_rollouts(self, rows, **kw):
            calls.append(len(rows))
            c_ids, lps = super().generate_rollouts(rows, **kw)
            drawn.extend((int(r["trl_ext_row_idx"]), list(c)) for r, c in zip(rows, c_ids))
            return c_ids, lps

        def generate_token_ids(self, prompt_ids, **kw):
            backend_calls.append(len(prompt_ids))
            return super().generate_token_ids(prompt_ids, **kw)

        def compute_advantages(self, batch):
            adv = super().compute_advantages(batch)
            if batch.mode == "train":
                everyone = compat.gather_object(list(drawn))
                drawn.clear()
                rollouts = zlib.crc32(json.dumps(sorted(everyone)).encode())  # every rollout drawn, all ranks
                r = self.rollout_strategy.last_record
                records.append({"k": {str(i): int(k) for i, k in zip(r["row_idx"], r["k"])}, "rounds": r["rounds"],
                                "early_stop": bool(r["early_stop"]), "fingerprint": r["buffer_fingerprint"],
                                "need_history": r["need_history"], "prior_p": [float(x) for x in r["prior_p"]],
                                "advantages": [float(x) for x in adv[~batch.is_pad].tolist()],
                                "extra_rollouts": int(r["extra_rollouts"]), "rollouts": rollouts,
                                "prior_mode": getattr(self.rollout_strategy.prior, "last_info", {}).get("mode")})
            return adv

    tr = Recording(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok,
                   **({} if by_config else {"prior": prior}))
    real_is_collective = compat.generation_is_collective
    if force_collective:
        compat.generation_is_collective = lambda trainer: trainer.accelerator.num_processes > 1
    try:
        tr.train()
    finally:
        compat.generation_is_collective = real_is_collective
    rank = tr.accelerator.process_index
    assert tr.accelerator.num_processes == world, (tr.accelerator.num_processes, world)
    result = {"rank": rank, "world_size": world, "steps": records, "calls": calls, "backend_calls": backend_calls,
              "buffer_len": len(tr.rollout_strategy.support_buffer)}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if embedding and rank == 0:
        unwrapped = tr.accelerator.unwrap_model(tr.model)
        torch.save({n: p.detach().cpu().clone() for n, p in unwrapped.named_parameters()},
                   os.path.join(out_dir, "params.pt"))
    return result


def main() -> int:
    out_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    if len(sys.argv) > 3 and sys.argv[3] == "keyed":  # keyed sampling, plain (non-collective) generation
        run(out_dir, steps, force_collective=False, keyed=True)
    elif len(sys.argv) > 3 and sys.argv[3] == "embedding":  # default embedding prior, keyed sampling, DDP generation
        run(out_dir, steps, force_collective=False, embedding=True)
    elif len(sys.argv) > 3 and sys.argv[3] == "one_prompt":  # 1 prompt per step on 2 ranks: rank 1 holds none
        run(out_dir, steps, n_prompts=1)
    elif len(sys.argv) > 3 and sys.argv[3] == "by_config":  # trl_ext.GRPOTrainer + rollout_strategy="v05_osla"
        run(out_dir, steps, by_config=True)
    else:
        run(out_dir, steps)
    return 0


if __name__ == "__main__":
    from _dist_exit import run_and_shutdown

    sys.exit(run_and_shutdown(main))
