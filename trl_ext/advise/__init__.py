"""``trl-ext advise``: measure a model's regime on a dataset and say which trainer and settings should pay.

* :mod:`trl_ext.advise.regime` and :mod:`trl_ext.advise.rates`: pure numpy / scipy estimators (no TRL, no torch);
* :mod:`trl_ext.advise.prefix` (with :mod:`trl_ext.advise.prefix_metrics`): PAIR's prefix informativeness;
  :mod:`trl_ext.advise.noise`: the scorer noise floor per reward function; :mod:`trl_ext.advise.vllm_path`: the
  vLLM sampling path;
* :mod:`trl_ext.advise.recommend`: the :class:`Advice` record, :func:`measure` and the rule set :func:`recommend`;
* :mod:`trl_ext.advise.sample`: draw the sample with keyed, replayable transformers generation; :func:`advise`;
* :mod:`trl_ext.advise.cli`: the command line and the plot.

See ``docs/advise.md``. Names are imported lazily so that importing the package stays light.
"""

from .._lazy import lazy_exports

_LAZY = {
    "Advice": "recommend",
    "AdviceWarning": "recommend",
    "Estimate": "recommend",
    "measure": "recommend",
    "recommend": "recommend",
    "RULES": "recommend",
    "advise": "sample",
    "draw_sample": "sample",
    "Sample": "sample",
}

__all__ = sorted(_LAZY)

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
