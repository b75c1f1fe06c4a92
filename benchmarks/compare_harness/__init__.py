"""The comparison harness behind ``benchmarks/compare_trainers.py`` (the script is the entry point and re-exports
these names): ``presets`` (methods, scales, protocols), ``settings`` (arguments), ``context`` (datasets, start
checkpoint), ``evaluation``, ``callbacks`` (token budget, traces), ``setups`` (BASIS table, tie-break rewards),
``runs`` (one run, reuse), ``tuning`` (learning rates), ``report`` (tables, verdicts, plots)."""
