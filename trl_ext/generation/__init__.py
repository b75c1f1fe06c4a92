"""Generation back-ends the trainers own, kept apart from the trainer layer as TRL 1.16 keeps ``trl/generation``
apart from ``trl/trainer``.

- :mod:`.keyed_sampler` -- :class:`KeyedSampler`, keyed replayable rollouts (``keyed_sampling=True``) and the rollout
  log ``trl-ext replay`` reads; :class:`KeyedRequest` keys rows a strategy generates from token ids.
- :mod:`.keyed_vllm` -- its vLLM side: per-request seeds through TRL's colocated engine.
- :mod:`.vllm_colocate` -- every contact with vLLM engine internals: the weight sync that works on CPU engines.

The TRL glue they need (the unwrapped generation model, the engine swap) stays in
:mod:`trl_ext.trainers._trl_compat`, the one place that touches TRL's private names. Import from the modules
(``from trl_ext.generation.keyed_sampler import KeyedSampler``): the package exports nothing itself.
"""
