"""GPU readiness check: run every trainer for a few steps on one device and time where each step goes.

One process, one device, transformers generation (no vLLM). For each trainer a freshly, randomly initialised model of a
real configuration is built (``transformers.Qwen2Config`` with the Qwen2.5-0.5B shapes: 24 layers, hidden 896, 14/2
attention/KV heads, vocabulary 151936, about 494M parameters; nothing is downloaded), in bf16 on a GPU and float32 on
the CPU, and trained for ``--warmup-steps`` + ``--steps`` optimizer steps:

=============  ==========================================================================================
``trl_grpo``   plain ``trl.GRPOTrainer`` (the reference every ratio is taken against)
``ext_grpo``   ``trl_ext.GRPOTrainer`` with a default ``ExtGRPOConfig`` (TRL's advantages)
``dapo``       ``trl_ext.GRPOTrainer`` with ``ExtGRPOConfig(dynamic_sampling=True)`` (3 refill rounds max)
``basis``      ``trl_ext.BASISTrainer``, one rollout per prompt, value table built in memory on the spot
``pair``       ``trl_ext.PAIRTrainer``, ``G`` candidates per prompt probed to ``tau``, a subset continued
``v05``        ``trl_ext.V05GRPOTrainer`` (``v05_k_init`` = 4, then Sequential OSLA rounds within the library's
               default ``v05_extra_rollout_budget``); prior chosen with ``--v05-prior`` (default ``embedding``:
               the library default, here a frozen copy of the policy since ``beta = 0`` and no LoRA)
=============  ==========================================================================================

Equal nominal work per step: every trainer is given ``--rollouts`` rollouts per optimizer step (``rollouts / G``
prompts x ``G`` for the group methods, ``rollouts / v05_k_init`` prompts for V0.5's first round, ``rollouts`` unique
prompts for BASIS, ``rollouts`` candidates for PAIR); what a method adds or saves on top (DAPO refill rounds, V0.5
OSLA rounds, PAIR's unselected suffixes) is its own allocation and is reported as ``generated_tokens`` and
``trained_rollouts`` per step. Every completion has exactly ``--completion-length`` tokens
(``generation_kwargs={"min_new_tokens": L}`` and ``max_completion_length=L``; EOS cannot be sampled earlier; PAIR's
probe and continuation caps add up to ``L``), every
prompt ``--prompt-length`` tokens (random digit strings, the offline character tokenizer of ``trl_ext.testbed``; the
model's vocabulary is larger than the tokenizer's, ids without a character decode to nothing). The reward is a
deterministic hash of the completion's token ids, Bernoulli with a per-prompt success probability drawn uniformly from
[0, 1] (so groups have reward spread, some groups are all-equal as in real training, and the synthetic BASIS value
table -- 32 draws per prompt from the same probability -- is consistent with the reward).

Timing (``torch.cuda.synchronize()`` around every timed call on a GPU; exclusive times, nested calls subtracted):

* **generation** -- TRL's ``_generate_single_turn`` (every generation call of every trainer ends there: TRL's own
  ``_generate``, and ``trl_ext.GRPOTrainer.generate_token_ids`` through ``ext_generate_single_turn``);
* **scoring** -- the reward function calls (TRL's ``_calculate_rewards`` and ``score_rollouts_local`` call them);
* **estimator/allocation** -- ``compute_advantages`` (the estimator and the strategy's ``update``) with the base's
  batch bookkeeping (``_ext_build_batch``, ``_ext_finalize``), plus the rollout strategy's ``rollout`` minus the
  phases above (V0.5 prior queries and OSLA decisions, PAIR prefix features, head refresh, design and draw, DAPO
  filtering and refill bookkeeping); the base's padding of the returned ``RolloutGroups`` (``replay_rollouts``) is
  not timed and falls in optimisation; 0 for plain TRL, whose advantages are computed inline;
* **optimisation** -- the rest of the step (from ``on_step_begin`` to ``on_step_end``): forward/backward, optimizer
  step, and TRL's batch preparation around generation (``trl_prep_s``, reported separately as a part of it).

Reported per trainer: seconds per step (mean of the steps after the warm-up), the split above, the estimator/
allocation share of the step, peak GPU memory (``torch.cuda.max_memory_allocated``, reset per trainer) and the ratio
of the step time to ``trl_grpo``'s. The JSON (``--output``) is rewritten after every trainer, so a run killed by a
time limit still leaves the finished trainers; a table is printed at the end.

Default settings (sized to finish in about 8 minutes on one H200, not yet measured there): 64 rollouts per step,
G = 8, completions of 128 tokens, prompts of 64 tokens, 1 warm-up + 3 timed steps per trainer, learning rate 1e-6,
``beta = 0`` (no reference model), ``loss_type = "dapo"`` (TRL's default; V0.5 requires a global token-level loss),
``--time-budget 450`` s for the whole script (a trainer is not started with less than 20 s of it left and is recorded
as skipped) and ``--per-trainer-budget 150`` s (capped by what is left of the whole budget; a trainer stops after
the step that crosses it, keeping at least one timed step).
``--tiny`` is a CPU smoke configuration (2 layers, hidden 64, vocabulary 256; 8 rollouts of 8 tokens; 1 + 1 steps).

When ``datasets`` (or its ``pyarrow``/``pandas``) is not importable -- the GPU image lacks them and their wheels are
too big to carry -- ``--datasets auto`` replaces them by inert import shims (placeholders that raise when used) and
passes the training prompts as a list-backed subclass of the shim's ``datasets.Dataset`` (TRL checks
``isinstance(train_dataset, Dataset)``; its GRPO path only indexes rows); the JSON records
``environment.datasets_mode`` (``"real"`` or ``"shim"``).

Usage::

    python benchmarks/gpu_check.py --output gpu_check.json                 # GPU, the defaults above
    python benchmarks/gpu_check.py --tiny --device cpu --output outputs/gpu_check_tiny.json
    python benchmarks/gpu_check.py --trainers trl_grpo pair --steps 5
    bash benchmarks/gpu_check.sh                                           # the device machine (see docs/gpu.md)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import gc
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import types
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

SCHEMA_VERSION = 1

TRAINERS: dict[str, str] = {
    "trl_grpo": "TRL GRPO (trl.GRPOTrainer)",
    "ext_grpo": "trl_ext.GRPOTrainer",
    "dapo": "DAPO dynamic sampling",
    "basis": "BASIS",
    "pair": "PAIR",
    "v05": "V0.5",
}
REFERENCE = "trl_grpo"

#: Qwen2.5-0.5B's architecture (its config.json), randomly initialised here.
QWEN25_05B: dict = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
}

#: CPU smoke configuration: same architecture family, tiny shapes.
TINY_MODEL: dict = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "attention_dropout": 0.0,
}

PRESETS: dict[str, dict] = {
    "full": dict(rollouts=64, group_size=8, completion_length=128, prompt_length=64, steps=3, warmup_steps=1,
                 time_budget=450.0, per_trainer_budget=150.0),
    "tiny": dict(rollouts=8, group_size=4, completion_length=8, prompt_length=8, steps=1, warmup_steps=1,
                 time_budget=600.0, per_trainer_budget=120.0),
}

V05_K_INIT = 4
VALUE_TABLE_SAMPLES = 32
PHASES = ("generation", "scoring", "estimator", "allocation", "trl_prep")
MIN_TRAINER_SECONDS = 20.0  # a trainer is not started with less of the time budget left


# ------------------------------------------------------------------------------------------------ arguments
def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text}")
    return v


def _nonneg_int(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true",
                   help="tiny model and batch for a CPU smoke run (< 60 s on 2 cores)")
    p.add_argument("--device", default="auto",
                   help="auto (cuda if available, else cpu), cpu, cuda or cuda:N (default auto)")
    p.add_argument("--trainers", nargs="+", default=None, metavar="NAME",
                   help=f"subset to run, in this order (default all): {' '.join(TRAINERS)}")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help="timed optimizer steps per trainer (default 3; --tiny 1)")
    p.add_argument("--warmup-steps", type=_nonneg_int, default=None,
                   help="untimed steps first (CUDA warm-up; default 1)")
    p.add_argument("--rollouts", type=_positive_int, default=None,
                   help="rollouts per optimizer step, every trainer (default 64; --tiny 8); a multiple of "
                        f"--group-size and of {V05_K_INIT}")
    p.add_argument("--group-size", type=_positive_int, default=None,
                   help="G of GRPO, DAPO and PAIR's candidates (default 8; --tiny 4)")
    p.add_argument("--completion-length", type=_positive_int, default=None,
                   help="tokens of every completion (default 128; --tiny 8)")
    p.add_argument("--prompt-length", type=_positive_int, default=None,
                   help="tokens of every prompt (default 64; --tiny 8)")
    p.add_argument("--v05-prior", choices=("embedding", "constant"), default="embedding",
                   help="V0.5 value prior (default embedding: the library default, a frozen copy of the policy; "
                        "constant: p = 0.5, no extra model)")
    p.add_argument("--datasets", choices=("auto", "real", "shim"), default="auto",
                   help="auto: the real `datasets` when importable, else import shims and a list dataset; real: "
                        "require it; shim: always shim (tests the fallback)")
    p.add_argument("--learning-rate", type=_positive_float, default=1e-6)
    p.add_argument("--seed", type=_nonneg_int, default=0)
    p.add_argument("--time-budget", type=_positive_float, default=None,
                   help="seconds for the whole script; a trainer is not started with less than 20 s left (default 450)")
    p.add_argument("--per-trainer-budget", type=_positive_float, default=None,
                   help="a trainer stops after the step that crosses this many seconds of training (default 150)")
    p.add_argument("--num-threads", type=_positive_int, default=None,
                   help="torch CPU threads (default: 1 for --tiny on the CPU, else torch's default)")
    p.add_argument("--output", default=None, help="JSON file to write (rewritten after every trainer)")
    return p


def resolve_settings(args: argparse.Namespace) -> dict:
    s = dict(PRESETS["tiny" if args.tiny else "full"])
    for key in ("steps", "warmup_steps", "rollouts", "group_size", "completion_length", "prompt_length",
                "time_budget", "per_trainer_budget"):
        value = getattr(args, key)
        if value is not None:
            s[key] = value
    names = list(dict.fromkeys(args.trainers or TRAINERS))
    unknown = [n for n in names if n not in TRAINERS]
    if unknown:
        raise SystemExit(f"unknown trainer(s) {unknown}; choose from {list(TRAINERS)}")
    r, g = s["rollouts"], s["group_size"]
    if g < 2:
        raise SystemExit("--group-size must be >= 2 (GRPO needs a group)")
    if r % g or r % V05_K_INIT or r // g < 2 or r // V05_K_INIT < 2:
        raise SystemExit(f"--rollouts ({r}) must be a multiple of --group-size ({g}) and of {V05_K_INIT}, with at "
                         "least 2 prompts per step for each")
    if s["completion_length"] < 2:
        raise SystemExit("--completion-length must be >= 2 (PAIR needs a prefix and a suffix)")
    s.update(trainers=names, tiny=bool(args.tiny), v05_prior=args.v05_prior, learning_rate=args.learning_rate,
             seed=args.seed, datasets_mode=args.datasets)
    return s


def resolve_device(spec: str) -> str:
    """``cpu`` or ``cuda``; ``cuda:N`` selects the GPU through ``CUDA_VISIBLE_DEVICES`` (set before torch loads)."""
    spec = spec.strip().lower()
    if spec.startswith("cuda:"):
        index = spec.split(":", 1)[1]
        if not index.isdigit():
            raise SystemExit(f"--device {spec!r}: expected cuda:N")
        if "torch" in sys.modules:
            raise SystemExit("--device cuda:N must be resolved before torch is imported")
        os.environ["CUDA_VISIBLE_DEVICES"] = index
        spec = "cuda"
    if spec not in ("auto", "cpu", "cuda"):
        raise SystemExit(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N")
    import torch

    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    return spec


# ------------------------------------------------------------------------------------------------ import shims
SHIMMED_PACKAGES = ("datasets", "pyarrow", "pandas")


class _Unavailable:
    """Placeholder for anything taken from a shimmed package: exists for imports and isinstance checks, raises
    ``ImportError`` when called or instantiated."""

    _package = "?"

    def __new__(cls, *args, **kwargs):
        raise ImportError(f"{cls._package}.{cls.__name__} was used, but {cls._package} is only an import shim in "
                          "benchmarks/gpu_check.py (install the real package)")


def _shim_module(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, f"gpu_check import shim for {name} (the real package is not installed)")
    mod.__path__ = []  # a package: submodules resolve through the finder below
    mod.__gpu_check_shim__ = True
    root = name.split(".")[0]
    cache: dict[str, type] = {}

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)  # no __version__ / __file__: "not installed" for transformers' checks
        if attr not in cache:
            cache[attr] = type(attr, (_Unavailable,), {"__module__": name, "_package": root})
        return cache[attr]

    mod.__getattr__ = __getattr__
    return mod


class _ShimFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``import pkg`` and ``import pkg.sub`` for the shimmed packages to inert modules."""

    def __init__(self, roots):
        self.roots = tuple(roots)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _shim_module(spec.name)

    def exec_module(self, module):
        return None


class _RowsMixin:
    """A list of row dicts with the few ``datasets.Dataset`` methods TRL and trl_ext use on a training set.

    Only used with the shims: mixed into the shim's ``datasets.Dataset`` placeholder (:func:`list_dataset`) so TRL's
    ``isinstance(train_dataset, Dataset)`` check passes.
    """

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, rows):
        self._rows = [dict(r) for r in rows]

    def __len__(self):
        return len(self._rows)

    def __iter__(self):
        return iter(self._rows)

    def __getitem__(self, key):
        if isinstance(key, str):
            return [r[key] for r in self._rows]
        if isinstance(key, slice):
            rows = self._rows[key]
            return {c: [r[c] for r in rows] for c in self.column_names}
        if hasattr(key, "__iter__"):
            rows = [self._rows[int(i)] for i in key]
            return {c: [r[c] for r in rows] for c in self.column_names}
        return dict(self._rows[int(key)])

    @property
    def column_names(self):
        return list(self._rows[0]) if self._rows else []

    @property
    def num_rows(self):
        return len(self._rows)

    @property
    def cache_files(self):
        return []  # in memory

    def add_column(self, name, column, *args, **kwargs):
        return type(self)([{**r, name: v} for r, v in zip(self._rows, column)])

    def remove_columns(self, names, *args, **kwargs):
        names = {names} if isinstance(names, str) else set(names)
        return type(self)([{k: v for k, v in r.items() if k not in names} for r in self._rows])

    def map(self, function, with_indices=False, *args, **kwargs):
        out = []
        for i, r in enumerate(self._rows):
            new = function(r, i) if with_indices else function(r)
            out.append({**r, **(new or {})})
        return type(self)(out)

    def select(self, indices, *args, **kwargs):
        return type(self)([self._rows[int(i)] for i in indices])

    def shuffle(self, seed=None, *args, **kwargs):
        import random

        rows = list(self._rows)
        random.Random(seed).shuffle(rows)
        return type(self)(rows)


def list_dataset(rows: list[dict]):
    """A training set TRL accepts when ``datasets`` is a shim: the shim's ``Dataset`` class backed by a list."""
    import datasets

    cls = type("Dataset", (_RowsMixin, datasets.Dataset), {"__module__": __name__})
    return cls(rows)


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - a broken install counts as missing
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
        return False


def setup_datasets(mode: str) -> str:
    """Make ``import datasets`` work: ``"real"`` when the package imports, else shims (``auto``/``shim``)."""
    if mode != "shim" and _importable("datasets"):
        return "real"
    if mode == "real":
        raise SystemExit("--datasets real: `import datasets` fails (pip install datasets, or use --datasets auto)")
    roots = ["datasets"] + [p for p in ("pyarrow", "pandas") if mode == "shim" or not _importable(p)]
    for key in [k for k in sys.modules if k.split(".")[0] in roots]:
        del sys.modules[key]
    sys.meta_path.insert(0, _ShimFinder(roots))
    return "shim"


# ------------------------------------------------------------------------------------------------ timing
class PhaseTimer:
    """Exclusive wall time per phase: a call's time minus the time of timed calls nested inside it.

    ``sync`` (``torch.cuda.synchronize`` on a GPU) runs before reading the clock, so asynchronous kernels are charged
    to the phase that launched them.
    """

    def __init__(self, sync):
        self.sync = sync
        self.stack: list[list] = []
        self.reset()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)
        self.generated_tokens = 0
        self.generated_sequences = 0

    def run(self, phase: str, fn, *args, **kwargs):
        self.sync()
        t0 = time.perf_counter()
        self.stack.append([phase, 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            self.sync()
            elapsed = time.perf_counter() - t0
            _, nested = self.stack.pop()
            self.seconds[phase] += elapsed - nested
            self.calls[phase] += 1
            if self.stack:
                self.stack[-1][1] += elapsed

    def wrap(self, phase: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            return self.run(phase, fn, *args, **kwargs)

        return timed


_TIMER: PhaseTimer | None = None  # the active timer, read by the class-level patches


def patch_trl_classes() -> None:
    """Time TRL's generation and batch preparation at class level (covers trl.GRPOTrainer and every subclass)."""
    import trl

    cls = trl.GRPOTrainer
    if getattr(cls, "_gpu_check_patched", False):
        return
    gen, prep = cls._generate_single_turn, cls._generate_and_score_completions

    @functools.wraps(gen)
    def _generate_single_turn(self, *args, **kwargs):
        if _TIMER is None:
            return gen(self, *args, **kwargs)
        out = _TIMER.run("generation", gen, self, *args, **kwargs)
        _TIMER.generated_sequences += len(out[0])
        _TIMER.generated_tokens += int(sum(len(c) for c in out[0]))
        return out

    @functools.wraps(prep)
    def _generate_and_score_completions(self, *args, **kwargs):
        if _TIMER is None:
            return prep(self, *args, **kwargs)
        return _TIMER.run("trl_prep", prep, self, *args, **kwargs)

    cls._generate_single_turn = _generate_single_turn
    cls._generate_and_score_completions = _generate_and_score_completions
    cls._gpu_check_patched = True


def instrument_ext(trainer, timer: PhaseTimer) -> None:
    """Instance-level timers on the trl_ext hooks (estimator and rollout allocation)."""
    for name in ("compute_advantages", "_ext_build_batch", "_ext_finalize"):
        setattr(trainer, name, timer.wrap("estimator", getattr(trainer, name)))
    strategy = trainer.rollout_strategy
    strategy.rollout = timer.wrap("allocation", strategy.rollout)


def _step_callback_class():
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of every optimizer step and its phase split; stops a trainer past its time budget."""

        def __init__(self, timer: PhaseTimer, budget_s: float, min_steps: int, trained_rollouts):
            self.timer, self.budget_s, self.min_steps = timer, budget_s, min_steps
            self.trained_rollouts = trained_rollouts
            self.records: list[dict] = []
            self.logs: list[dict] = []
            self.t0 = None
            self.train_s = 0.0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:  # the trainer's per-step metrics (dapo/*, v05/*, pair/*, ext/* ...)
                self.logs.append({"step": int(state.global_step), **{k: v for k, v in logs.items()
                                                                     if isinstance(v, int | float | None)}})

        def on_step_begin(self, args, state, control, **kwargs):
            self.timer.sync()
            self.timer.reset()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.timer.sync()
            step_s = time.perf_counter() - self.t0
            self.train_s += step_s
            sec = dict(self.timer.seconds)
            attributed = sum(sec.values())
            rec = {"step": int(state.global_step), "step_s": step_s, **{f"{k}_s": v for k, v in sec.items()},
                   "estimator_allocation_s": sec["estimator"] + sec["allocation"],
                   "optimisation_s": step_s - (attributed - sec["trl_prep"]),
                   "unattributed_s": step_s - attributed,
                   "generation_calls": self.timer.calls["generation"],
                   "generated_tokens": self.timer.generated_tokens,
                   "generated_sequences": self.timer.generated_sequences,
                   "trained_rollouts": self.trained_rollouts(self.timer)}
            self.records.append(rec)
            if self.train_s > self.budget_s and len(self.records) >= self.min_steps:
                control.should_training_stop = True
            return control

    return StepTimer


# ------------------------------------------------------------------------------------------------ workload
def make_prompts(n: int, length: int, seed: int) -> list[dict]:
    """``n`` unique random digit strings of ``length`` characters (= tokens) with a success probability each."""
    import numpy as np

    rng = np.random.default_rng([seed, 0x6C0])
    rows, seen = [], set()
    while len(rows) < n:
        text = "".join(rng.choice(list("0123456789"), size=length))
        if text in seen:
            continue
        seen.add(text)
        rows.append({"prompt": text, "p_success": float(rng.uniform(0.0, 1.0))})
    return rows


def bernoulli_reward(prompts, completions, completion_ids=None, p_success=None, **kwargs):
    """1.0 with the prompt's ``p_success``, decided by a hash of the completion's token ids (deterministic)."""
    out = []
    for ids, p in zip(completion_ids, p_success):
        digest = hashlib.blake2b(",".join(str(int(t)) for t in ids).encode(), digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 2.0 ** 64
        out.append(1.0 if u < float(p) else 0.0)
    return out


def build_value_table(rows: list[dict], seed: int):
    """BASIS value table in memory: ``VALUE_TABLE_SAMPLES`` Bernoulli(p_success) draws per training prompt."""
    import numpy as np

    from trl_ext.priors import ValueTable, ValueTableRow

    rng = np.random.default_rng([seed, 0xBA515])
    table_rows = [ValueTableRow.from_rewards(r["prompt"], rng.binomial(1, r["p_success"], VALUE_TABLE_SAMPLES)
                                             .astype(float).tolist(), (0.0, 1.0)) for r in rows]
    return ValueTable(table_rows, metadata={"model": None, "reward_funcs": ["bernoulli_reward"], "seed": seed,
                                            "n_samples": VALUE_TABLE_SAMPLES, "dataset": "gpu_check synthetic"})


def count_parameters(spec: dict) -> int:
    h, v, i, n = spec["hidden_size"], spec["vocab_size"], spec["intermediate_size"], spec["num_hidden_layers"]
    kv = spec["num_key_value_heads"] * (h // spec["num_attention_heads"])
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    return v * h * (1 if spec["tie_word_embeddings"] else 2) + n * per_layer + h


def build_model(spec: dict, tok, device: str, dtype, seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**spec, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = None
    return model


class Context:
    def __init__(self, s: dict, device: str, datasets_mode: str):
        import torch

        from trl_ext.testbed import build_tokenizer

        self.s, self.device, self.datasets_mode = s, device, datasets_mode
        self.on_gpu = device == "cuda"
        self.dtype = torch.bfloat16 if self.on_gpu else torch.float32
        self.model_spec = dict(TINY_MODEL if s["tiny"] else QWEN25_05B)
        self.tok = build_tokenizer()
        self.tok.model_max_length = s["prompt_length"] + s["completion_length"] + 8
        total_steps = s["steps"] + s["warmup_steps"]
        n = max(4 * s["rollouts"] * total_steps, 64)
        self.rows = make_prompts(n, s["prompt_length"], s["seed"])
        if datasets_mode == "real":
            from datasets import Dataset

            self.train_dataset = Dataset.from_list(self.rows)
        else:  # shims: a list-backed subclass of the shim's Dataset (TRL checks isinstance(train_dataset, Dataset))
            self.train_dataset = list_dataset(self.rows)
        self.value_table = None

    def sync(self) -> None:
        if self.on_gpu:
            import torch

            torch.cuda.synchronize()

    def common_config(self, out_dir: str) -> dict:
        s = self.s
        L = s["completion_length"]
        return dict(
            output_dir=out_dir, max_steps=s["steps"] + s["warmup_steps"], learning_rate=s["learning_rate"],
            lr_scheduler_type="constant", warmup_steps=0, gradient_accumulation_steps=1, steps_per_generation=1,
            max_completion_length=L, generation_kwargs={"min_new_tokens": L}, temperature=1.0, beta=0.0,
            loss_type="dapo", use_cpu=not self.on_gpu, bf16=self.on_gpu, logging_steps=1, save_strategy="no",
            report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=s["seed"],
        )


def make_trainer(name: str, ctx: Context, model, reward, out_dir: str):
    """The trainer ``name`` at equal nominal rollouts per step. Returns ``(trainer, config_fields)``."""
    s = ctx.s
    R, G = s["rollouts"], s["group_size"]
    kw = ctx.common_config(out_dir)
    common = dict(reward_funcs=[reward], train_dataset=ctx.train_dataset, processing_class=ctx.tok)
    if name == "trl_grpo":
        import trl

        kw.update(per_device_train_batch_size=R, num_generations=G)
        return trl.GRPOTrainer(model=model, args=trl.GRPOConfig(**kw), **common), kw
    import trl_ext

    if name in ("ext_grpo", "dapo"):
        kw.update(per_device_train_batch_size=R, num_generations=G, dynamic_sampling=name == "dapo")
        return trl_ext.GRPOTrainer(model=model, args=trl_ext.ExtGRPOConfig(**kw), **common), kw
    if name == "basis":
        if ctx.value_table is None:
            ctx.value_table = build_value_table(ctx.rows, s["seed"])
        kw.update(per_device_train_batch_size=R, num_generations=1)
        return trl_ext.BASISTrainer(model=model, args=trl_ext.BASISConfig(**kw), value_table=ctx.value_table,
                                    **common), kw
    if name == "pair":
        kw.update(per_device_train_batch_size=R, num_generations=G)
        return trl_ext.PAIRTrainer(model=model, args=trl_ext.PAIRConfig(**kw), **common), kw
    if name == "v05":
        kw.update(v05_k_init=V05_K_INIT, v05_value_prior=s["v05_prior"])
        if "v05_extra_rollout_budget" in trl_ext.V05GRPOConfig.__dataclass_fields__:
            # TRL's batch semantics: R rollouts in the first round (R / v05_k_init prompts), OSLA rounds bounded by
            # v05_extra_rollout_budget x R; num_generations is the evaluation group size
            kw.update(per_device_train_batch_size=R, num_generations=G)
        else:  # older V0.5: per_device_train_batch_size counts unique prompts, v05_k_init rollouts each first
            kw.update(per_device_train_batch_size=R // V05_K_INIT, num_generations=2)
        return trl_ext.V05GRPOTrainer(model=model, args=trl_ext.V05GRPOConfig(**kw), **common), kw
    raise KeyError(name)


# ------------------------------------------------------------------------------------------------ one trainer
def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def summarize(records: list[dict], warmup: int) -> dict:
    timed = records[warmup:] if len(records) > warmup else records[-1:]
    keys = ("step_s", "generation_s", "scoring_s", "estimator_s", "allocation_s", "estimator_allocation_s",
            "trl_prep_s", "optimisation_s", "unattributed_s", "generated_tokens", "generated_sequences",
            "generation_calls", "trained_rollouts")
    out = {f"mean_{k}": _mean([r[k] for r in timed]) for k in keys}
    step = out["mean_step_s"]
    out["seconds_per_step"] = step
    out["timed_steps"] = len(timed)
    out["split"] = {k: out[f"mean_{k}_s"] for k in ("generation", "scoring", "estimator_allocation", "optimisation")}
    out["split_sum_s"] = sum(out["split"].values())
    out["estimator_allocation_share"] = out["mean_estimator_allocation_s"] / step if step else None
    out["generation_share"] = out["mean_generation_s"] / step if step else None
    return out


def run_trainer(name: str, ctx: Context, timer: PhaseTimer, budget_s: float) -> dict:
    import torch

    global _TIMER
    s = ctx.s
    rec: dict = {"name": name, "label": TRAINERS[name], "status": "ok"}
    trainer = model = None
    gc.collect()
    if ctx.on_gpu:
        torch.cuda.empty_cache()
    t0 = time.perf_counter()
    if ctx.on_gpu:  # what earlier trainers left allocated (should be ~0)
        rec["start_memory_gib"] = torch.cuda.memory_allocated() / 2 ** 30
    try:
        with tempfile.TemporaryDirectory(prefix=f"gpu_check_{name}_") as out_dir:
            model = build_model(ctx.model_spec, ctx.tok, ctx.device, ctx.dtype, s["seed"])
            ctx.sync()
            rec["model_build_s"] = time.perf_counter() - t0
            rec["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
            if ctx.on_gpu:
                torch.cuda.reset_peak_memory_stats()
                rec["model_memory_gib"] = torch.cuda.memory_allocated() / 2 ** 30
            t1 = time.perf_counter()
            reward = timer.wrap("scoring", bernoulli_reward)
            trainer, cfg = make_trainer(name, ctx, model, reward, out_dir)
            ctx.sync()
            rec["trainer_build_s"] = time.perf_counter() - t1
            rec["trainer_class"] = f"{type(trainer).__module__}.{type(trainer).__name__}"
            rec["config"] = {k: v for k, v in cfg.items() if k != "output_dir"}
            is_ext = hasattr(trainer, "rollout_strategy")
            if is_ext:
                instrument_ext(trainer, timer)
                rec["rollout_strategy"] = trainer.rollout_strategy.describe(trainer)

            def trained_rollouts(t, _trainer=trainer, _ext=is_ext):
                if _ext:
                    batch = _trainer.last_rollout_batch
                    return None if batch is None else int((~batch.is_pad).sum())
                return t.generated_sequences

            cb = _step_callback_class()(timer, budget_s, s["warmup_steps"] + 1, trained_rollouts)
            trainer.add_callback(cb)
            from transformers import PrinterCallback

            trainer.remove_callback(PrinterCallback)  # the metrics go to the JSON (``logs``), not to stdout
            _TIMER = timer
            t2 = time.perf_counter()
            try:
                trainer.train()
            finally:
                _TIMER = None
            ctx.sync()
            rec["train_s"] = time.perf_counter() - t2
            rec["steps"] = cb.records
            rec["logs"] = cb.logs
            rec["budget_s"] = budget_s
            rec["stopped_by_budget"] = len(cb.records) < s["steps"] + s["warmup_steps"]
            if not cb.records:
                raise RuntimeError("no optimizer step completed")
            rec.update(summarize(cb.records, s["warmup_steps"]))
            if ctx.on_gpu:
                rec["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
                rec["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2 ** 30
            else:
                rec["peak_memory_gib"] = None
            if name == "v05":
                rec["v05_prior"] = s["v05_prior"]
                rec["v05_prior_backbone"] = trainer.rollout_strategy.prior_info.get("prior_backbone")  # its weights
    except Exception as e:  # noqa: BLE001 - every trainer is tried; the failure is recorded and the exit code set
        rec.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-6000:])
        if ctx.on_gpu:
            rec["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2 ** 30
    finally:
        _TIMER = None
        del trainer, model
        gc.collect()
        if ctx.on_gpu:
            torch.cuda.empty_cache()
    rec["wall_s"] = time.perf_counter() - t0
    return rec


# ------------------------------------------------------------------------------------------------ report
def environment(device: str, datasets_mode: str) -> dict:
    import torch

    env = {"python": platform.python_version(), "platform": platform.platform(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "datasets_mode": datasets_mode}
    for pkg in ("transformers", "trl", "accelerate", "peft", "datasets", "scipy", "numpy", "trl-ext"):
        try:
            from importlib.metadata import version

            env[pkg] = version(pkg)
        except Exception:  # noqa: BLE001
            env[pkg] = None
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=props.total_memory / 2 ** 30, gpu_count=torch.cuda.device_count())
    return env


def add_ratios(results: dict) -> None:
    ref = results.get(REFERENCE, {})
    ref_step = ref.get("seconds_per_step") if ref.get("status") == "ok" else None
    for rec in results.values():
        step = rec.get("seconds_per_step")
        rec["ratio_to_trl_grpo"] = step / ref_step if step and ref_step else None


def _fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec)


def format_table(report: dict) -> str:
    head = (f"{'trainer':<10} {'status':<8} {'s/step':>7} {'gen':>7} {'score':>7} {'est+alloc':>9} {'optim':>7} "
            f"{'e+a %':>6} {'peak GiB':>8} {'xTRL':>6} {'tokens':>7} {'rollouts':>8}")
    lines = [head, "-" * len(head)]
    for name, r in report["trainers"].items():
        share = r.get("estimator_allocation_share")
        lines.append(
            f"{name:<10} {r['status']:<8} {_fmt(r.get('seconds_per_step'), '.3f'):>7} "
            f"{_fmt(r.get('mean_generation_s'), '.3f'):>7} {_fmt(r.get('mean_scoring_s'), '.3f'):>7} "
            f"{_fmt(r.get('mean_estimator_allocation_s'), '.3f'):>9} {_fmt(r.get('mean_optimisation_s'), '.3f'):>7} "
            f"{_fmt(None if share is None else 100 * share, '.1f'):>6} {_fmt(r.get('peak_memory_gib')):>8} "
            f"{_fmt(r.get('ratio_to_trl_grpo')):>6} {_fmt(r.get('mean_generated_tokens'), '.0f'):>7} "
            f"{_fmt(r.get('mean_trained_rollouts'), '.1f'):>8}")
    return "\n".join(lines)


def write_report(path: str | None, report: dict) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    s = resolve_settings(args)
    t_start = time.perf_counter()
    device = resolve_device(args.device)
    datasets_mode = setup_datasets(s["datasets_mode"])
    import torch

    threads = args.num_threads or (1 if s["tiny"] and device == "cpu" else None)
    if threads:  # the tiny CPU run: one thread (several threads on tiny tensors mostly wait on each other)
        torch.set_num_threads(threads)
    import transformers

    transformers.logging.set_verbosity_error()
    # PAIR caps its probe/continuation below min_new_tokens on purpose (probe + continuation = L): not a problem
    warnings.filterwarnings("ignore", message=r".*Unfeasible length constraints.*")
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecations inside TRL/transformers
    patch_trl_classes()
    ctx = Context(s, device, datasets_mode)
    timer = PhaseTimer(ctx.sync)
    spec = ctx.model_spec
    report = {
        "schema": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "finished": False,
        "settings": {
            **{k: v for k, v in s.items() if k != "datasets_mode"}, "device": device, "dtype": str(ctx.dtype),
            "model": "Qwen2ForCausalLM, random init, " + ("tiny config" if s["tiny"] else "Qwen2.5-0.5B config"),
            "model_config": spec, "parameters": count_parameters(spec), "tokenizer": "trl_ext.testbed char tokenizer",
            "tokenizer_vocab": len(ctx.tok), "v05_k_init": V05_K_INIT, "value_table_samples": VALUE_TABLE_SAMPLES,
            "generation": "transformers (no vLLM)", "reward": "hash Bernoulli(p_success), p_success ~ U[0, 1]",
        },
        "environment": environment(device, datasets_mode),
        "trainers": {},
    }
    print(f"gpu_check: device={device} dtype={ctx.dtype} model={report['settings']['model']} "
          f"({report['settings']['parameters'] / 1e6:.1f}M params) rollouts/step={s['rollouts']} G={s['group_size']} "
          f"L={s['completion_length']} prompt={s['prompt_length']} steps={s['warmup_steps']}+{s['steps']} "
          f"datasets={datasets_mode} trainers={' '.join(s['trainers'])}", flush=True)
    failed = False
    for name in s["trainers"]:
        elapsed = time.perf_counter() - t_start
        remaining = s["time_budget"] - elapsed
        if remaining < MIN_TRAINER_SECONDS:
            report["trainers"][name] = {"name": name, "label": TRAINERS[name], "status": "skipped",
                                        "error": f"time budget {s['time_budget']:.0f} s used up ({elapsed:.0f} s)"}
            failed = True
            continue
        print(f"[{elapsed:6.1f}s] {name}: {TRAINERS[name]} ...", flush=True)
        rec = run_trainer(name, ctx, timer, min(s["per_trainer_budget"], remaining))
        report["trainers"][name] = rec
        add_ratios(report["trainers"])
        if rec["status"] == "ok":
            print(f"[{time.perf_counter() - t_start:6.1f}s] {name}: {rec['seconds_per_step']:.3f} s/step "
                  f"(gen {rec['mean_generation_s']:.3f}, est+alloc {rec['mean_estimator_allocation_s']:.3f}, "
                  f"peak {_fmt(rec.get('peak_memory_gib'))} GiB)", flush=True)
        else:
            failed = True
            print(f"[{time.perf_counter() - t_start:6.1f}s] {name}: FAILED {rec['error']}\n{rec['traceback']}",
                  flush=True)
        report["total_s"] = time.perf_counter() - t_start
        write_report(args.output, report)
    report["total_s"] = time.perf_counter() - t_start
    report["finished"] = True
    write_report(args.output, report)
    print("\n" + format_table(report), flush=True)
    print(f"\ntotal {report['total_s']:.1f} s; columns: seconds per step (timed steps), generation, scoring, "
          "estimator+allocation, optimisation (rest), estimator+allocation share, peak allocated GiB, step time / "
          "trl_grpo, generated tokens and trained rollouts per step", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
