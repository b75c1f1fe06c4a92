"""Method-independent state of one invocation (:class:`Context`): the start checkpoint (pinned under v2), tokenizer,
training / test / validation datasets, rewards and the evaluator."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from importlib import import_module

from .evaluation import _generic_evaluate, eval_engine_dtype
from .presets import DIFFICULTY_COLUMN, GRADED_REWARDS, REAL_TASK_MAX_NEW, REAL_TASK_NAMES


def _load_object(spec: str):
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    return getattr(import_module(module), attr)


def checkpoint_fingerprint(path: str) -> str:
    """Short sha256 of a local checkpoint's weights and config (``path`` itself for a Hub id).

    Part of the v2 run keys and of the ``lr_choice.json`` settings, so runs and learning-rate choices made from an
    earlier warm model (e.g. a rebuilt testbed checkpoint at the same path) are not reused.
    """
    if not os.path.isdir(path):
        return str(path)
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        if name == "config.json":
            h.update(name.encode())
            with open(os.path.join(path, name), "rb") as f:
                h.update(_WRITER_FIELD.sub(_WRITER_PINNED, f.read()))
        elif name.endswith((".safetensors", ".bin")):
            h.update(name.encode())
            with open(os.path.join(path, name), "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


# config.json names the transformers release that wrote it; the same weights saved by another release (the real
# model's cache is rebuilt by whatever transformers is installed) must keep their fingerprint, or no committed run
# could be reused. The field is read as the release that wrote every committed checkpoint (5.24.0), so the
# fingerprints of the committed runs are unchanged.
_WRITER_FIELD = re.compile(rb'"transformers_version":\s*"[^"]*"')
_WRITER_PINNED = b'"transformers_version": "5.24.0"'


START_CHECKPOINT_DIR = "start_checkpoint"


def pinned_start_checkpoint(s: dict, build: Callable[[], str]) -> str:
    """The testbed start checkpoint, pinned inside ``--output_dir`` under v2.

    The warm-up is deterministic on one machine but not across machines (CPU kernels change the SFT trajectory), so
    a rebuilt warm model on a fresh clone would differ and none of the committed runs could be reused or extended.
    Under a tuning protocol (v2) the first invocation copies the warm model to ``<output_dir>/start_checkpoint/``
    and every later one (on any machine) starts from that copy; its fingerprint is part of the run keys either way.
    v1 keeps using the cache (``build()``).
    """
    if not s.get("tune_lr"):
        return build()
    pinned = os.path.join(s["output_dir"], START_CHECKPOINT_DIR)
    if os.path.isfile(os.path.join(pinned, "config.json")):
        print(f"start checkpoint pinned in the output directory: {pinned}", flush=True)
        return pinned
    src = build()
    tmp = f"{pinned}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    os.replace(tmp, pinned)
    print(f"start checkpoint {src} pinned as {pinned}", flush=True)
    return pinned


def validation_split(train_pool, train_ds, n_val: int):
    """``n_val`` rows of ``train_pool`` (the task's train split) whose ``question_id`` is not a training prompt.

    The validation set of learning-rate tuning: drawn from the train split (the test split stays untouched) and
    disjoint from the training prompts by construction. Raises ``SystemExit`` when the split has too few rows left.
    """
    used = set(train_ds["question_id"])
    keep = [i for i, q in enumerate(train_pool["question_id"]) if q not in used][:n_val]
    if len(keep) < n_val:
        raise SystemExit(f"--n_val {n_val}: the train split has only {len(keep)} problems outside the {len(used)} "
                         "training prompts; lower --n_val or --n_train")
    return train_pool.select(keep)


class Context:
    """Shared, method-independent state: model path, tokenizer, datasets, rewards, evaluator.

    ``eval_ds`` is the held-out test set of the main runs; ``val_ds`` (built on first use) the validation set of
    learning-rate tuning, from the train split and disjoint from ``train_ds``.
    """

    def __init__(self, s: dict):
        from transformers import AutoTokenizer

        self.s = s
        self._val_ds = None
        self.graded_reward = _load_object(s["graded_reward_fn"]) if s.get("graded_reward_fn") else None
        if s["dataset_fn"]:
            self.task = None
            data = _load_object(s["dataset_fn"])()
            if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
                raise SystemExit("--dataset_fn must return (train_dataset, eval_dataset[, validation_dataset])")
            self.train_ds, self.eval_ds = data[0], data[1]
            self._val_ds = data[2] if len(data) == 3 else None
            self.reward_funcs = [_load_object(s["reward_fn"])]
            if s["model_name_or_path"] is None:
                raise SystemExit("--model_name_or_path is required with --dataset_fn")
            self.model_path = s["model_name_or_path"]
            self.max_new = s["max_completion_length"] or 256
        elif s["task"] in REAL_TASK_NAMES or str(s["task"]).startswith("reasoning_gym:"):
            self._init_real_task(s)
        else:
            from trl_ext.testbed import TASKS, get_reward_funcs, get_warm_model, make_dataset, split_size

            self.task = s["task"]
            if self.task not in TASKS:
                raise SystemExit(f"unknown task {self.task!r}; choose from {sorted(TASKS)}")
            n_train = min(s["n_train"], split_size(self.task, "train"))
            self.train_ds = make_dataset(self.task, n_train, seed=0, split="train")
            self.eval_ds = make_dataset(self.task, min(s["n_eval"], split_size(self.task, "test")), seed=0,
                                        split="test")
            self.reward_funcs = get_reward_funcs(self.task)
            if self.graded_reward is None and self.task in GRADED_REWARDS:
                self.graded_reward = _load_object(GRADED_REWARDS[self.task])
            self.model_path = s["model_name_or_path"] or pinned_start_checkpoint(
                s, lambda: get_warm_model(self.task, seed=s["warm_seed"], verbose=True))
            self.max_new = s["max_completion_length"] or TASKS[self.task].max_answer_chars() + 2
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.cache_dir = s["cache_dir"]
        s["start_checkpoint_sha"] = checkpoint_fingerprint(self.model_path)

    def _init_real_task(self, s: dict) -> None:
        """A real-model chat task (:data:`REAL_TASK_NAMES`, ``trl_ext.realmodel.tasks``): conversational two-shot
        prompts, the strict ``accuracy_reward`` (binary; the format is not rewarded), the offline SmolLM2 model
        unless ``--model_name_or_path`` names another chat model. Rows get a ``question_id`` (the question text,
        unique per item) so outcomes pair across runs and the validation set can exclude the training prompts."""
        from trl_ext.realmodel import get_real_model
        from trl_ext.realmodel.tasks import get_real_reward_funcs, split_items

        self.task = s["task"]
        if self.task.startswith("reasoning_gym:"):  # a task no one here wrote: its own splits and scorer
            from trl_ext.external_tasks.reasoning_gym import make_rg_dataset, rg_accuracy_reward

            def rg_split(split, n):
                rows = make_rg_dataset(self.task, split, None, as_list=True)[:n]
                return Dataset.from_list([{**r, "question_id": f"{r['rg_split']}:{r['rg_index']}"} for r in rows])

            from datasets import Dataset

            self.train_ds, self.eval_ds = rg_split("train", s["n_train"]), rg_split("test", s["n_eval"])
            self._val_ds = rg_split("validation", s["n_val"])  # disjoint from both by construction
            self.reward_funcs = [rg_accuracy_reward]
            self.model_path = s["model_name_or_path"] or get_real_model()
            self.max_new = s["max_completion_length"] or 128
            return
        self.train_ds = real_task_dataset(self.task, min(s["n_train"], len(split_items(self.task, "train"))),
                                          split="train", seed=0)
        self.eval_ds = real_task_dataset(self.task, min(s["n_eval"], len(split_items(self.task, "test"))),
                                         split="test", seed=0)
        self.reward_funcs = get_real_reward_funcs(self.task)
        self.model_path = s["model_name_or_path"] or get_real_model()
        self.max_new = s["max_completion_length"] or REAL_TASK_MAX_NEW[self.task]

    @property
    def val_ds(self):
        """Validation set for learning-rate tuning (train split, disjoint from ``train_ds``)."""
        if self._val_ds is None and self.task in REAL_TASK_NAMES:
            pool = real_task_dataset(self.task, None, split="train", seed=1)
            self._val_ds = validation_split(pool, self.train_ds, self.s["n_val"])
        if self._val_ds is None:
            if self.task is None:
                raise SystemExit("learning-rate tuning with --dataset_fn needs a validation set: return (train, "
                                 "eval, validation) from the dataset function")
            from trl_ext.testbed import make_dataset, split_size

            pool = make_dataset(self.task, split_size(self.task, "train"), seed=1, split="train")
            self._val_ds = validation_split(pool, self.train_ds, self.s["n_val"])
        overlap = set(self._val_ds["question_id"]) & set(self.train_ds["question_id"])
        if overlap:
            raise SystemExit(f"the validation set shares {len(overlap)} questions with the training prompts "
                             f"(e.g. {sorted(overlap)[:3]}); they must be disjoint")
        return self._val_ds

    def dataset(self, split: str):
        """``"test"``: the held-out evaluation set; ``"validation"``: the tuning set."""
        return self.eval_ds if split == "test" else self.val_ds

    def load_model(self):
        import torch
        from transformers import AutoModelForCausalLM

        dtype = torch.bfloat16 if self.s["bf16"] else torch.float32
        return AutoModelForCausalLM.from_pretrained(self.model_path, dtype=dtype)

    def evaluate(self, model, *, greedy: bool = True, num_samples: int = 1, seed: int = 0, split: str = "test"):
        """Held-out accuracy with the task's binary reward (whatever a method trains on); returns
        ``trl_ext.testbed.EvalResult`` (records in the outcome JSONL schema). Test-split evaluations generate on a
        vLLM engine under ``--test_eval_backend vllm`` (:mod:`.vllm_eval`); validation evaluations (the tuning)
        always with transformers."""
        from trl_ext.testbed import EvalResult, evaluate_model

        bs = self.s["eval_batch_size"]
        ds = self.dataset(split)
        if self.task is not None and self.task not in REAL_TASK_NAMES and not self.task.startswith("reasoning_gym:"):
            return evaluate_model(model, self.tokenizer, ds, self.task, greedy=greedy,
                                  num_samples=num_samples, max_new_tokens=self.max_new, seed=seed, batch_size=bs)
        vllm = None
        if split == "test" and self.s.get("test_eval_backend", "transformers") == "vllm":
            vllm = {"dtype": eval_engine_dtype(self.s), "python": self.s.get("eval_vllm_python")}
        return _generic_evaluate(model, self.tokenizer, ds, self.reward_funcs[0], greedy, num_samples,
                                 self.max_new, seed, bs, EvalResult, temperature=self.s.get("temperature", 1.0),
                                 vllm=vllm)

    @property
    def eval_reward_name(self) -> str:
        """Name of the reward that scores every evaluation (the task's first, binary reward)."""
        from trl_ext.priors.value_table import reward_func_name

        return reward_func_name(self.reward_funcs[0])

    def difficulty_levels(self, split: str = "test") -> dict[str, str] | None:
        """``question_id -> str(n_digits)`` of the split's questions, or ``None`` without that column."""
        ds = self.dataset(split)
        if DIFFICULTY_COLUMN not in getattr(ds, "column_names", []):
            return None
        return {str(q): str(v) for q, v in zip(ds["question_id"], ds[DIFFICULTY_COLUMN])}


def real_task_dataset(task: str, n: int | None, *, split: str, seed: int):
    """``trl_ext.realmodel.tasks.make_real_dataset`` plus a ``question_id`` column: the question (the last user
    turn), unique per item, so outcome files pair by question across runs."""
    from datasets import Dataset

    from trl_ext.realmodel.tasks import make_real_dataset

    rows = make_real_dataset(task, n, seed=seed, split=split, as_list=True)
    return Dataset.from_list([{**r, "question_id": f"{task}:{r['prompt'][-1]['content']}"} for r in rows])
