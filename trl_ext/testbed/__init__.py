"""The offline RLVR testbed: a tiny causal LM, a character tokenizer, synthetic verifiable tasks, reward
functions, a cached supervised warm-up and evaluation helpers. Everything is built locally; nothing is
downloaded. See ``docs/testbed.md``.

Names are imported lazily so that ``import trl_ext.testbed.cli`` (used by ``trl-ext --help``) stays free of
torch/transformers.
"""

from .._lazy import lazy_exports
from . import _register  # noqa: F401 - registers the tasks and warm models in trl_ext.registry

_LAZY = {
    "SPECIAL_TOKENS": "tokenizer",
    "TASK_CHARS": "tokenizer",
    "build_tokenizer": "tokenizer",
    "TINY_CONFIG": "model",
    "build_tiny_model": "model",
    "save_tiny_model": "model",
    "TASKS": "tasks",
    "TaskSpec": "tasks",
    "make_dataset": "tasks",
    "split_size": "tasks",
    "substitution_code": "tasks",
    "exact_match_reward": "tasks",
    "addition_reward": "tasks",
    "substitution_reward": "tasks",
    "substitution_hidden_reward": "tasks",
    "substitution_channel_scores": "tasks",
    "get_reward_funcs": "tasks",
    "completion_text": "tasks",
    "EvalResult": "evaluation",
    "evaluate_model": "evaluation",
    "write_outcomes_jsonl": "evaluation",
    "read_outcomes_jsonl": "evaluation",
    "get_warm_model": "warmup",
    "warm_model_dir": "warmup",
    "validate_cache": "warmup",
    "run_warmup": "warmup",
    "default_cache_root": "warmup",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
