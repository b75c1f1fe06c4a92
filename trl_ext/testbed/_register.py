"""The testbed's tasks and warm models in :mod:`trl_ext.registry` (``--task addition``, ``--model testbed:TASK``,
``--model testbed-warm``). Imported by the package, so importing any testbed module registers them; the loaders
import ``datasets`` and torch only when a name is used. The warm model is read from the package at call time (a
test's replacement of ``trl_ext.testbed.get_warm_model`` is the one called)."""

from __future__ import annotations

import sys
from functools import partial

from .. import registry
from .tasks import TASKS, get_reward_funcs, make_dataset, split_size


def _dataset(name: str) -> registry.BuiltinDataset:
    spec = TASKS[name]

    def make(split: str, n: int | None, seed: int):
        return make_dataset(name, split_size(name, split) if n is None else n, seed=seed, split=split)

    return registry.BuiltinDataset(
        name=name, source="testbed", make=make, split_size=partial(split_size, name),
        rewards=lambda: {"accuracy": get_reward_funcs(name)[0]},
        max_answer_chars=int(spec.max_answer_chars(**spec.defaults)))


def _warm_model_of_dataset(name: str, *, dataset_name: str | None, cache_dir: str | None) -> str:
    """``testbed-warm``: the warm model of the testbed task the run trains on."""
    if dataset_name not in TASKS:
        raise ValueError(f"--model_name_or_path testbed-warm is the warm model of a testbed task: pass "
                         f"--dataset_name one of {', '.join(TASKS)} (got --dataset_name {dataset_name!r}).")
    return sys.modules[__package__].get_warm_model(dataset_name, seed=0, cache_dir=cache_dir, verbose=True)


def _warm_model_of_task(name: str, *, dataset_name: str | None, cache_dir: str | None) -> str:
    """``testbed:TASK``: the warm model of TASK."""
    return sys.modules[__package__].get_warm_model(name.split(":", 1)[1], seed=0, cache_dir=cache_dir, verbose=True)


for _name in TASKS:
    registry.register_dataset(_name, partial(_dataset, _name), source="testbed")
registry.register_model("testbed-warm", _warm_model_of_dataset)
registry.register_model("testbed:", _warm_model_of_task)
