"""Golden trajectories: a few real training steps of every trainer configuration, recorded so a refactor of
``trl_ext/trainers/`` can be checked to leave them unchanged (``tests/test_golden_trajectories.py``).

Every scenario builds a trainer on the offline tiny testbed model (``trl_ext.testbed``, ~0.86M parameters,
5-token completions), samples from the model for real (temperature 1, ``seed=0``; the sampler is not replaced) and
trains 3 optimizer steps. Recorded, per (scenario, world size, rank):

* per training generation batch (TRL's ``_generate_and_score_completions``, wrapped on the trainer instance): this
  rank's completion token ids (padding stripped with ``completion_mask``; a masked pad row is an empty list), its
  advantages as TRL's loss receives them, and the global rewards of the ``RolloutBatch`` (``None`` for NaN: pad or
  unscorable rows);
* per logged step: the sorted metric keys and every numeric value (``loss``, ``num_tokens``, all ``ext/*`` and the
  method's own metrics);
* at the end: the sum and the sum of squares (float64) of all trainable parameters of the policy (PAIR: also of its
  heads).

Floats are stored with their full repr; the test compares with a tolerance (see :func:`compare`). Every scenario
runs with one torch intra-op thread (``torch.set_num_threads(1)``, restored afterwards); ``OMP_NUM_THREADS=2`` then
changes only the last bit of a few of PAIR's float64 diagnostics (``pair/ess_mean``, ``pair/pi_min``, ...: numpy's
BLAS threads), far inside the tolerance. Recording is bitwise reproducible for a given thread setting.

Usage::

    python tests/scripts/golden_trajectories.py --record      # (re)write tests/golden/ (1 and 2 processes)
    python tests/scripts/golden_trajectories.py               # run into a temp dir and compare with tests/golden/
    python tests/scripts/golden_trajectories.py --scenarios grpo,pair --world1-only
    python tests/scripts/golden_trajectories.py --golden DIR  # compare with another reference folder
    torchrun --standalone --nproc_per_node 2 tests/scripts/golden_trajectories.py --out DIR   # the 2-rank set

Under torchrun (``WORLD_SIZE`` 2) the two-rank scenarios run one after the other in the same launch, each with half
the per-device batch of the one-process run (same global batch); each rank writes its own file. A re-record is
only allowed for a documented bug fix (``docs/architecture.md``, "Golden trajectories").
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zlib

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GOLDEN_DIR = os.path.join(ROOT, "tests", "golden")
sys.path.insert(0, HERE)

MAX_STEPS = 3
SCENARIOS = ("grpo", "rloo", "dr_grpo", "reinforce_pp", "dapo_dynamic", "signal_only", "tiebreak", "keyed",
             "v05_osla", "v05_fixed", "basis", "pair", "lora")
TWO_RANK_SCENARIOS = ("grpo", "dapo_dynamic", "v05_osla", "basis", "pair")
GZIP_ABOVE = 8000  # bytes of compact JSON above which a golden file is stored gzipped

RTOL, ATOL = 1e-5, 1e-6
CHECKSUM_RTOL = 1e-5

V05_CORRUPTED = frozenset({0, 1, 2, 5, 8, 13})  # dataset rows on which the V0.5 prior predicts the wrong outcome


# --------------------------------------------------------------------------------------------- rewards and priors
def _text(c) -> str:
    return c if isinstance(c, str) else c[-1]["content"]


def partly_dead_reward(prompts, completions, trl_ext_row_idx, **kw) -> list[float]:
    """Dataset rows 0, 3, 6, ...: constant 1 (a tied group, no signal); the others: a {0, 0.5, 1} hash of the
    completion (rarely tied)."""
    return [1.0 if i % 3 == 0 else float(zlib.crc32(_text(c).encode()) % 3) / 2.0
            for c, i in zip(completions, trl_ext_row_idx)]


def prompt_bit_reward(prompts, completions, trl_ext_row_idx, **kw) -> list[float]:
    """The prompt's fixed success bit (row parity): V0.5's OSLA decisions then follow from the prior alone."""
    return [float(i % 2) for i in trl_ext_row_idx]


def hash_bit_reward(prompts, completions, **kw) -> list[float]:
    return [float(zlib.crc32(b"v05" + _text(c).encode()) % 2) for c in completions]


def parity_reward(prompts, completions, **kw) -> list[float]:
    return [float(zlib.crc32(_text(c).encode()) % 2) for c in completions]


def flipped_prior(ds):
    """Exact prior (row parity) except on ``V05_CORRUPTED`` rows, where it predicts the opposite."""
    from trl_ext.priors import CallablePrior

    index = {ds[i]["prompt"]: i for i in range(len(ds))}

    def fn(targets, ctx_p, ctx_y):
        return [1.0 - (index[t] % 2) if index[t] in V05_CORRUPTED else float(index[t] % 2) for t in targets]

    return CallablePrior(fn)


def basis_table(prompts):
    """Deterministic per-prompt reference samples with pass rate k/8, k in 1..7 (as tests/test_basis_trainer.py)."""
    from trl_ext.priors.table_format import ValueTable, ValueTableRow

    rows = []
    for p in prompts:
        k = 1 + zlib.crc32(("t" + str(p)).encode()) % 7
        rows.append(ValueTableRow.from_rewards(p, [1.0] * k + [0.0] * (8 - k), (0.0, 1.0)))
    return ValueTable(rows, {"reward_funcs": ["binary_reward"]})


# --------------------------------------------------------------------------------------------- trainers
COMMON = dict(max_completion_length=5, max_steps=MAX_STEPS, learning_rate=1e-3, use_cpu=True, bf16=False,
              report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0, temperature=1.0,
              dataloader_num_workers=0, disable_tqdm=True)


def build_trainer(scenario: str, run_dir: str, world: int):
    """The trainer of ``scenario`` with the global batch of the one-process run split over ``world`` ranks."""
    from base_helpers import binary_reward, hash_reward, length_score, tiny_dataset, tiny_model_and_tokenizer

    from trl_ext.trainers.base import ExtGRPOConfig, GRPOTrainer

    model, tok = tiny_model_and_tokenizer(0)
    ds = tiny_dataset(16)
    base = dict(COMMON, output_dir=run_dir, per_device_train_batch_size=8 // world, num_generations=4)
    reward_funcs = [hash_reward]
    extra = {}
    if scenario in ("grpo", "rloo", "dr_grpo", "reinforce_pp", "dapo_dynamic", "signal_only", "tiebreak", "keyed",
                    "lora"):
        cls = GRPOTrainer
        over = {
            "grpo": {},
            "rloo": dict(advantage_estimator="rloo"),
            "dr_grpo": dict(advantage_estimator="dr_grpo", loss_type="dr_grpo"),
            "reinforce_pp": dict(advantage_estimator="reinforce_pp", num_generations=1),
            "dapo_dynamic": dict(dynamic_sampling=True, loss_type="dapo"),
            "signal_only": dict(signal_only_denominator=True),
            "tiebreak": dict(tie_break_scorer_index=1),
            "keyed": dict(keyed_sampling=True),
            "lora": {},
        }[scenario]
        if scenario in ("dapo_dynamic", "signal_only"):
            reward_funcs = [partly_dead_reward]  # tied groups: filtered (dynamic sampling) / left out of the denominator
        elif scenario == "tiebreak":
            reward_funcs = [binary_reward, length_score]  # checker + scorer
        if scenario == "lora":
            from peft import LoraConfig

            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0)
        args = ExtGRPOConfig(**{**base, **over})
    elif scenario in ("v05_osla", "v05_fixed"):
        from trl_ext.trainers.v05 import V05GRPOConfig, V05GRPOTrainer

        cls = V05GRPOTrainer
        # 8 prompts x v05_k_init 4 per generation batch; v05_osla: the flipped prompts get OSLA rounds (default
        # budget 1.0 x 32 extra rollouts); v05_fixed: budget 0 (fixed k = 4, the fusion still applies)
        kw = {k: v for k, v in base.items() if k != "num_generations"}
        kw.update(per_device_train_batch_size=32 // world)
        if scenario == "v05_fixed":
            kw["v05_extra_rollout_budget"] = 0.0
            reward_funcs = [hash_bit_reward]
        else:
            reward_funcs = [prompt_bit_reward]
        args = V05GRPOConfig(**kw)
        extra["prior"] = flipped_prior(ds)
    elif scenario == "basis":
        from trl_ext.trainers.basis import BASISConfig, BASISTrainer

        cls = BASISTrainer
        args = BASISConfig(**{k: v for k, v in base.items() if k != "num_generations"})
        reward_funcs = [binary_reward]
        extra["value_table"] = basis_table(ds["prompt"])
    elif scenario == "pair":
        from trl_ext.testbed import make_dataset
        from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer

        cls = PAIRTrainer
        # tests/test_pair_trainer.py's defaults for 5-token completions: a 2-token probe, small head warm-up
        args = PAIRConfig(**dict(base, per_device_train_batch_size=16 // world, num_generations=8,
                                 pair_prefix_tokens=2, pair_head_min_labels=8, pair_head_fit_steps=20))
        reward_funcs = [parity_reward]
        ds = make_dataset("addition", 32, seed=0)
    else:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    return cls(model=model, reward_funcs=reward_funcs, args=args, train_dataset=ds, processing_class=tok, **extra)


# --------------------------------------------------------------------------------------------- recording
def _floats(values) -> list:
    """Full-precision Python floats (NaN -> None), nested lists kept."""
    out = []
    for v in values:
        if isinstance(v, list):
            out.append(_floats(v))
        else:
            v = float(v)
            out.append(None if math.isnan(v) else v)
    return out


def _checksums(trainer) -> dict:
    import torch

    def sums(params) -> tuple[int, float, float]:
        # math.fsum: the exactly rounded sum, independent of torch's thread count and reduction order
        flat = torch.cat([p.detach().double().reshape(-1) for p in params]).numpy()
        return int(flat.size), math.fsum(flat.tolist()), math.fsum((flat * flat).tolist())

    model = trainer.accelerator.unwrap_model(trainer.model)
    n, s, sq = sums(p for p in model.parameters() if p.requires_grad)
    out = {"trainable_numel": n, "param_sum": s, "param_sumsq": sq}
    design_heads = getattr(trainer.rollout_strategy, "heads", None)  # PAIR's (DesignHeads)
    heads = getattr(design_heads, "heads", None)
    if heads is not None:
        _, out["pair_heads_sum"], out["pair_heads_sumsq"] = sums(
            p for m in (heads.success_head, heads.cost_head) for p in m.parameters())
    return out


def timing(key: str) -> bool:
    """Wall-clock metrics (TRL's ``step_time``): their keys are recorded, their values are not."""
    return "time" in key or "per_second" in key


def run_scenario(scenario: str, run_dir: str | None = None) -> dict:
    """Train ``scenario`` for ``MAX_STEPS`` steps and return its golden record (this rank's)."""
    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        from accelerate import PartialState

        PartialState(cpu=True)  # without cpu=True a CPU torchrun rank believes it is alone
    own_dir = run_dir is None
    run_dir = run_dir or tempfile.mkdtemp(prefix=f"golden_{scenario}_")
    threads = torch.get_num_threads()
    # one intra-op thread, whatever OMP_NUM_THREADS says: with 2 torch threads PAIR's head fits (float32 matmuls)
    # round differently (advantages moved by up to 9e-7, a third of the tolerance, after 3 steps; the other scenarios
    # stayed bitwise)
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer = build_trainer(scenario, os.path.join(run_dir, scenario), world)
            generations = []
            orig = trainer._generate_and_score_completions  # TRL's entry point (private name: allowed in tests)

            def recording(inputs):
                trainer.last_rollout_batch = None
                out = orig(inputs)
                if trainer.model.training:
                    mask = out["completion_mask"].bool().cpu()
                    ids = out["completion_ids"].cpu()
                    b = trainer.last_rollout_batch
                    generations.append({
                        "completion_ids": [row[m].tolist() for row, m in zip(ids, mask)],
                        "advantages": _floats(out["advantages"].detach().double().cpu().tolist()),
                        "rewards": _floats(b.rewards.double().tolist()),
                    })
                return out

            trainer._generate_and_score_completions = recording
            trainer.train()
        logs = []
        for e in trainer.state.log_history:
            if "loss" not in e:  # the end-of-training summary (runtime, samples per second)
                continue
            logs.append({"step": int(e["step"]), "keys": sorted(e),
                         "values": {k: (None if isinstance(v, float) and math.isnan(v) else float(v))
                                    for k, v in sorted(e.items()) if isinstance(v, (int, float)) and not timing(k)}})
        record = {
            "scenario": scenario,
            "world_size": trainer.accelerator.num_processes,
            "rank": trainer.accelerator.process_index,
            "trainer": type(trainer).__name__,
            "torch_threads": torch.get_num_threads(),
            "global_step": int(trainer.state.global_step),
            "generations": generations,
            "logs": logs,
            "checksums": _checksums(trainer),
        }
        assert record["world_size"] == world, (record["world_size"], world)
        return record
    finally:
        torch.set_num_threads(threads)
        if own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------- files
def golden_name(scenario: str, world: int, rank: int) -> str:
    return f"{scenario}_w{world}_r{rank}"


def write_record(record: dict, out_dir: str) -> str:
    """Compact JSON (full float repr), gzipped (reproducible bytes) when larger than ``GZIP_ABOVE``."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, golden_name(record["scenario"], record["world_size"], record["rank"]))
    text = json.dumps(record, separators=(",", ":"), sort_keys=True, allow_nan=False) + "\n"
    for old in (stem + ".json", stem + ".json.gz"):
        if os.path.exists(old):
            os.remove(old)
    if len(text) > GZIP_ABOVE:
        path = stem + ".json.gz"
        with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(text.encode())
    else:
        path = stem + ".json"
        with open(path, "w") as f:
            f.write(text)
    return path


def load_record(scenario: str, world: int, rank: int, directory: str = GOLDEN_DIR) -> dict:
    stem = os.path.join(directory, golden_name(scenario, world, rank))
    if os.path.exists(stem + ".json.gz"):
        with gzip.open(stem + ".json.gz", "rt") as f:
            return json.load(f)
    with open(stem + ".json") as f:
        return json.load(f)


# --------------------------------------------------------------------------------------------- comparison
def _close(a, b, rtol: float, atol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return abs(a - b) <= atol + rtol * abs(b)


def _first_float_diff(got: list, want: list, rtol: float, atol: float):
    """Index, got, want of the first element outside the tolerance (None when all agree and lengths match)."""
    if len(got) != len(want):
        return ("length", len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want)):
        if isinstance(w, list):
            sub = _first_float_diff(g, w, rtol, atol)
            if sub is not None:
                return (f"{i}/{sub[0]}", sub[1], sub[2])
        elif not _close(g, w, rtol, atol):
            return (i, g, w)
    return None


ADDED_METRICS: dict[str, set[str]] = {
    # scenario -> metric keys a documented change of the trainer layer added since the goldens were recorded (the
    # golden's values are still compared for every key it has). Method presets now run their estimator through the
    # base's valid-row adapter, which counts unscorable and degenerate rows for every estimator.
    "v05_osla": {"adv/unscorable_rows", "adv/degenerate_rows"},
    "v05_fixed": {"adv/unscorable_rows", "adv/degenerate_rows"},
    "basis": {"adv/unscorable_rows", "adv/degenerate_rows"},
    # PAIR's Eq. 13 runs as the registered "pair_draw" estimator through the same adapter; the heads' ROC AUC on
    # their calibration slice is logged beside their Brier score (pair/head_auc)
    "pair": {"adv/unscorable_rows", "adv/degenerate_rows", "pair/head_auc"},
}


def compare(got: dict, want: dict) -> list[str]:
    """Every difference between a fresh record and its golden, one line each, naming scenario, step and field.

    Token ids, rewards, metric keys (up to the documented :data:`ADDED_METRICS`), step numbers and counts: identical. Advantages, losses and every other logged
    value: ``rtol=1e-5, atol=1e-6``, except integer counts (``num_tokens``, ``*/rollouts``, ``*_tokens``,
    ``*/rows``), which must be identical. Parameter checksums: ``rtol=1e-5``; the trainable parameter count: identical.
    """
    where = f"{want['scenario']} (world {want['world_size']}, rank {want['rank']})"
    errs = []
    for key in ("scenario", "world_size", "rank", "trainer", "global_step"):
        if got.get(key) != want.get(key):
            errs.append(f"{where}: {key}: got {got.get(key)!r}, golden {want.get(key)!r}")
    gg, wg = got["generations"], want["generations"]
    if len(gg) != len(wg):
        errs.append(f"{where}: {len(gg)} generation batches, golden {len(wg)}")
    for s, (g, w) in enumerate(zip(gg, wg), start=1):
        tag = f"{where}, generation {s}"
        if len(g["completion_ids"]) != len(w["completion_ids"]):
            errs.append(f"{tag}: completion_ids: {len(g['completion_ids'])} rows, golden {len(w['completion_ids'])}")
        else:
            for i, (a, b) in enumerate(zip(g["completion_ids"], w["completion_ids"])):
                if a != b:
                    errs.append(f"{tag}: completion_ids row {i}: got {a}, golden {b}")
                    break
        if g["rewards"] != w["rewards"]:
            d = _first_float_diff(g["rewards"], w["rewards"], 0.0, 0.0)
            errs.append(f"{tag}: rewards differ at {d[0]}: got {d[1]!r}, golden {d[2]!r}")
        d = _first_float_diff(g["advantages"], w["advantages"], RTOL, ATOL)
        if d is not None:
            errs.append(f"{tag}: advantages differ at {d[0]}: got {d[1]!r}, golden {d[2]!r}")
    gl, wl = got["logs"], want["logs"]
    if len(gl) != len(wl):
        errs.append(f"{where}: {len(gl)} logged steps, golden {len(wl)}")
    for g, w in zip(gl, wl):
        tag = f"{where}, logged step {w['step']}"
        if g["step"] != w["step"]:
            errs.append(f"{tag}: step number {g['step']}")
        added = ADDED_METRICS.get(want["scenario"], set())
        if set(g["keys"]) - added != set(w["keys"]) - added or not set(w["keys"]) <= set(g["keys"]) | added:
            errs.append(f"{tag}: metric keys differ: missing {sorted(set(w['keys']) - set(g['keys']))}, "
                        f"new {sorted(set(g['keys']) - set(w['keys']))}")
        for k, wv in w["values"].items():
            if k not in g["values"]:
                continue  # reported with the keys
            gv = g["values"][k]
            exact = k in ("num_tokens", "step") or k.endswith(("/rollouts", "_tokens", "/rows"))
            ok = gv == wv if exact and wv is not None and float(wv).is_integer() else _close(gv, wv, RTOL, ATOL)
            if not ok:
                errs.append(f"{tag}: {k}: got {gv!r}, golden {wv!r}")
    for k, wv in want["checksums"].items():
        gv = got["checksums"].get(k)
        ok = gv == wv if isinstance(wv, int) else gv is not None and abs(gv - wv) <= CHECKSUM_RTOL * abs(wv)
        if not ok:
            errs.append(f"{where}, final parameters: {k}: got {gv!r}, golden {wv!r}")
    if set(got["checksums"]) != set(want["checksums"]):
        errs.append(f"{where}, final parameters: checksum keys {sorted(got['checksums'])}, "
                    f"golden {sorted(want['checksums'])}")
    return errs


# --------------------------------------------------------------------------------------------- launching
def launch_two_ranks(out_dir: str, scenarios=TWO_RANK_SCENARIOS, timeout: float = 600) -> subprocess.CompletedProcess:
    """One ``torchrun --standalone --nproc_per_node 2`` launch of this script (gloo, CPU) for ``scenarios``."""
    env = {**os.environ, "ACCELERATE_DEBUG_MODE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           os.path.abspath(__file__), "--out", out_dir, "--scenarios", ",".join(scenarios)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", action="store_true", help=f"write the golden files into {GOLDEN_DIR}")
    parser.add_argument("--out", default=None, help="output folder (default: a temp dir; --record: tests/golden)")
    parser.add_argument("--golden", default=GOLDEN_DIR, help="reference folder of the comparison (default mode)")
    parser.add_argument("--scenarios", default=None, help="comma-separated (default: all of the mode)")
    parser.add_argument("--world1-only", action="store_true", help="skip the two-rank torchrun launch")
    parser.add_argument("--world2-only", action="store_true", help="only the two-rank torchrun launch")
    a = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out = a.out or (GOLDEN_DIR if a.record else tempfile.mkdtemp(prefix="golden_"))
    if world > 1:  # a torchrun rank: run the scenarios, write this rank's files
        for scenario in (a.scenarios.split(",") if a.scenarios else TWO_RANK_SCENARIOS):
            write_record(run_scenario(scenario), out)
        return 0
    chosen = a.scenarios.split(",") if a.scenarios else None
    written = []
    if not a.world2_only:
        for scenario in chosen or SCENARIOS:
            written.append((scenario, 1, 0, write_record(run_scenario(scenario), out)))
            print(f"world 1: {scenario}: {written[-1][3]}", flush=True)
    two = [s for s in (chosen or TWO_RANK_SCENARIOS) if s in TWO_RANK_SCENARIOS]
    if two and not a.world1_only:
        proc = launch_two_ranks(out, two)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-6000:], file=sys.stderr)
            return 1
        written += [(s, 2, r, os.path.join(out, golden_name(s, 2, r))) for s in two for r in (0, 1)]
        print(f"world 2: {', '.join(two)}: {out}", flush=True)
    if a.record:
        import json

        import torch
        import transformers
        import trl

        with open(os.path.join(out, "RECORDED_ON.json"), "w", encoding="utf-8") as f:  # where the test compares
            # a list: platforms where a rerun matched are appended by hand (see tests/test_golden_trajectories.py)
            json.dump([{"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                        "transformers": transformers.__version__, "trl": trl.__version__}], f, indent=1)
        return 0
    errors = []
    for scenario, w, r, _ in written:  # default mode: compare the fresh run with the committed goldens
        try:
            want = load_record(scenario, w, r, a.golden)
        except FileNotFoundError:
            errors.append(f"{scenario} (world {w}, rank {r}): no golden file")
            continue
        errors += compare(load_record(scenario, w, r, out), want)
    print("\n".join(errors) if errors else "all golden trajectories match", flush=True)
    return 1 if errors else 0


if __name__ == "__main__":
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from _dist_exit import run_and_shutdown

        sys.exit(run_and_shutdown(main))
    sys.exit(main())
