"""``evaluate``-loadable metrics shipped with trl_ext; load with ``evaluate.load(trl_ext.stats.metric_path(name))``."""
