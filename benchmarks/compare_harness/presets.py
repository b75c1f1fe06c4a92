"""What the comparison harness compares and at what size: the method registry (:class:`MethodSpec`), scale, task
and protocol presets, and the constants the other modules share."""

from __future__ import annotations

from dataclasses import dataclass, field

TOKEN_METRIC = "ext/generated_tokens_total"
GRPO_REFERENCE = "grpo_g16"
#: Dataset column whose values split the per-difficulty breakdown (``runs.json`` / ``table.json``).
DIFFICULTY_COLUMN = "n_digits"
#: Graded (partial-credit) reward of each testbed task that has one: the scorer of the ``tiebreak`` method.
GRADED_REWARDS: dict[str, str] = {"scratchpad": "trl_ext.testbed.tasks:scratchpad_steps_reward"}
#: Numbers of runs the BASIS value table is amortized over in the table's total-cost columns.
AMORTIZE_OVER = (1, 10)
LR_CHOICE_FILE = "lr_choice.json"


BASE_CONFIG = "trl_ext.trainers.base:ExtGRPOConfig"
BASE_TRAINER = "trl_ext.trainers.base:GRPOTrainer"


@dataclass(frozen=True)
class MethodSpec:
    """One configuration of the comparison.

    Attributes
    ----------
    name, label : str
        Registry key and plot / table label.
    family : {"grpo", "baseline", "trl_ext"}
        ``"grpo"``: plain GRPO at one group size, the candidates for the "best GRPO setting" reference;
        ``"baseline"``: other published critic-free recipes; ``"trl_ext"``: the package's own trainers and
        measurement options.
    group_size : int
        Rollouts per prompt decided up front, passed as ``num_generations`` (``v05_k_init`` for V0.5, candidates for
        PAIR, 1 for single-rollout methods, whose sampler then yields unique prompts).
    config_kwargs : dict
        Method-specific config fields on top of the shared ones (e.g. ``advantage_estimator``,
        ``advantage_estimator_kwargs``, ``loss_type``, ``dynamic_sampling``, ``v05_k_init``).
    config, trainer : str
        ``"module:Class"`` of the config and trainer classes, imported when the method runs; default
        ``trl_ext.ExtGRPOConfig`` / ``trl_ext.GRPOTrainer`` (a method that is a configuration of the base trainer
        needs only ``config_kwargs``).
    setup : str or None
        Name of a function ``setup(ctx) -> SetupResult`` in ``compare_harness.setups`` (extra config kwargs,
        training reward functions, cost records), run once per invocation; it raises :class:`MethodUnavailable` when the method is
        not defined for the task (the method is then recorded as skipped with the reason).
    """

    name: str
    label: str
    family: str
    group_size: int
    config_kwargs: dict = field(default_factory=dict)
    config: str = BASE_CONFIG
    trainer: str = BASE_TRAINER
    setup: str | None = None


@dataclass
class SetupResult:
    """What a method's ``setup(ctx)`` returns.

    Attributes
    ----------
    config : dict
        Extra config kwargs (precedence: above ``MethodSpec.config_kwargs``, below ``--config_overrides``).
    reward_funcs : list of callables or None
        Training reward functions replacing the task's (evaluation always uses the task's binary reward).
    info : dict
        Cost and provenance records copied into every run record of the method (e.g. the BASIS table's tokens).
    """

    config: dict = field(default_factory=dict)
    reward_funcs: list | None = None
    info: dict = field(default_factory=dict)


class MethodUnavailable(Exception):
    """Raised by a method's setup when the method is not defined for this task (recorded as ``skipped``)."""


_V05 = dict(config="trl_ext.trainers.v05:V05GRPOConfig", trainer="trl_ext.trainers.v05:V05GRPOTrainer")
METHODS: dict[str, MethodSpec] = {
    "grpo_g16": MethodSpec("grpo_g16", "GRPO G=16", "grpo", group_size=16),
    "grpo_g8": MethodSpec("grpo_g8", "GRPO G=8", "grpo", group_size=8),
    "grpo_g4": MethodSpec("grpo_g4", "GRPO G=4", "grpo", group_size=4),
    # num_generations=1: the base trainer's sampler yields unique prompts, one rollout each
    "reinforce_pp": MethodSpec("reinforce_pp", "REINFORCE++ (1 rollout)", "baseline", group_size=1,
                               config_kwargs={"advantage_estimator": "reinforce_pp",
                                              "advantage_estimator_kwargs": {"normalize": True}}),
    # James-Stein shrinkage baseline (arXiv:2511.03710): RLOO's leave-one-out mean shrunk toward the other prompts'
    # mean, at G = 4 (the few-rollout regime the paper targets; V0.5's k_init and DAPO's group size)
    "james_stein": MethodSpec("james_stein", "James-Stein G=4", "baseline", group_size=4,
                              config_kwargs={"advantage_estimator": "james_stein"}),
    "rloo": MethodSpec("rloo", "RLOO G=4", "baseline", group_size=4,
                       config_kwargs={"advantage_estimator": "rloo",
                                      "advantage_estimator_kwargs": {"normalize": False}}),
    "dr_grpo": MethodSpec("dr_grpo", "Dr. GRPO G=16", "baseline", group_size=16,
                          config_kwargs={"advantage_estimator": "dr_grpo", "loss_type": "dr_grpo"}),
    "dapo_dynamic": MethodSpec("dapo_dynamic", "GRPO G=4 +DAPO dynamic sampling", "baseline", group_size=4,
                               config_kwargs={"dynamic_sampling": True}),
    "basis": MethodSpec("basis", "BASIS G=1", "trl_ext", group_size=1, config="trl_ext.trainers.basis:BASISConfig",
                        trainer="trl_ext.trainers.basis:BASISTrainer", setup="setup_basis"),
    "v05_osla": MethodSpec("v05_osla", "V0.5 k_init=4 +OSLA", "trl_ext", group_size=4,
                           config_kwargs={"v05_k_init": 4, "v05_extra_rollout_budget": float("inf")}, **_V05),
    # fixed k = 4 without OSLA: cost c = 1/16 makes the OSLA cap round(1/sqrt(c)) = 4 = v05_k_init, so no prompt can
    # get a further round; the prior fusion of the advantages is unchanged.
    "v05_fixed4": MethodSpec("v05_fixed4", "V0.5 k=4 fixed", "trl_ext", group_size=4,
                             config_kwargs={"v05_k_init": 4, "v05_rollout_cost": 1.0 / 16}, **_V05),
    "pair": MethodSpec("pair", "PAIR G=16", "trl_ext", group_size=16, config="trl_ext.trainers.pair:PAIRConfig",
                       trainer="trl_ext.trainers.pair:PAIRTrainer"),
    # GRPO G=8 whose policy loss is divided only by the tokens of groups with a nonzero advantage
    "signal_only": MethodSpec("signal_only", "GRPO G=8 signal-only denominators", "trl_ext", group_size=8,
                              config_kwargs={"signal_only_denominator": True}),
    # GRPO G=8 on reward = binary grade + 0.1 x within-class rank of the graded reward (setup_tiebreak)
    "tiebreak": MethodSpec("tiebreak", "GRPO G=8 +tie-break blend", "trl_ext", group_size=8,
                           config_kwargs={"tie_break_epsilon": 0.1}, setup="setup_tiebreak"),
}

#: The methods of the real-model benchmark (issue-independent: the baselines and the paper methods).
REAL_METHODS = ["grpo_g8", "grpo_g4", "reinforce_pp", "dapo_dynamic", "basis", "v05_osla", "pair"]
#: Scale presets (the ``addition`` values; the v1 CPU run used them). ``cpu``: the offline testbed on 2 cores;
#: ``gpu``: a larger budget and GPU-friendly trainer defaults; everything else is the same code path.
SCALES: dict[str, dict] = {
    "cpu": dict(task="addition", rollouts_per_step=64, token_budget=40_000, eval_every_tokens=5_000, n_eval=2000,
                n_train=4000, n_val=1000, learning_rate=1e-4, eval_samples=0, value_table_samples=32, use_cpu=True,
                bf16=False, eval_batch_size=250),
    "gpu": dict(task="addition", rollouts_per_step=256, token_budget=400_000, eval_every_tokens=50_000, n_eval=2000,
                n_train=8000, n_val=1000, learning_rate=1e-4, eval_samples=0, value_table_samples=32, use_cpu=False,
                bf16=True, eval_batch_size=250),
    # the real pretrained chat model on CPU (docs/results.md "Real-LLM benchmark"): SmolLM2-135M-Instruct + LoRA
    # r 16 on the sum3 chat task. Sized from a one-off measurement (one thread, fp32, LoRA): a GRPO G=8 step of 16
    # rollouts (~1,000 generated tokens, prompts ~200 tokens) took about 2 minutes, a third of it HF generation, so
    # a 6,000-token run with 3 evaluations of 64 questions is ~20 min (the committed runs' records have the times).
    # One loss pass over the 16 rollouts (vocabulary 49,152, ~330 tokens a row) needed 12 GB, so two workers ran
    # out of the 24 GB: grad_accum = 4 trains each generation batch in 4 micro-batches of 4 rollouts (one optimizer
    # step, one generation, the same gradient), about 3 GB a worker. The BASIS table is built 64 prompts' samples at a
    # time (the builder writes rows per batch and resumes from them; one batch of all 512 samples took over 20
    # minutes with nothing saved until the end).
    "smollm2": dict(task="sum3", rollouts_per_step=16, token_budget=6_000, eval_every_tokens=2_000, n_eval=64,
                    n_train=128, n_val=48, learning_rate=1e-4, eval_samples=1, eval_mode="sampled",
                    checkpoint_outcomes=True, value_table_samples=4, use_cpu=True, bf16=False, eval_batch_size=64,
                    use_peft=True, lora_r=16, lora_alpha=32, methods=REAL_METHODS, grad_accum=4,
                    value_table_batch_size=64),
}
#: Protocol values a scale replaces (applied after :data:`PROTOCOLS`): on the real model every run costs ~20 CPU
#: minutes, so v2 tunes two learning rates on the 1-3-10 ladder, extends once past an edge winner (the first
#: tuning runs put GRPO's best at the upper edge, 3e-4), and runs 3 seeds.
SCALE_PROTOCOL: dict[tuple[str, str], dict] = {
    ("smollm2", "v2"): dict(tune_lr=[1e-4, 3e-4], seeds=[0, 1, 2], tune_extend=1),
}
#: Per-task overrides of a scale preset. ``scratchpad`` (completions of 18-71 tokens, max_completion_length 73 =
#: the longest completion + 2): the CPU budget is sized from a measurement (untrained tiny model, 73-token
#: completions, one thread, the other core busy): GRPO G=8 took 1.21 s per step of 64 rollouts (4,672 tokens) and
#: 2.8 s to evaluate 250 questions greedily (2.77 s per step when the 2 cores were oversubscribed, load ~5). A warm
#: model writes about 47 tokens per completion on average (10 x 4.5 columns + 2), about 3,000 tokens per step at the
#: same step time (the batch still decodes to its longest completion), so 400,000 tokens are about 130 steps (160 s)
#: plus 4 evaluations of 1,000 questions (45 s): 3.5 min per GRPO G=8 run (2.5 min if completions stay at 73 tokens).
TASK_PRESETS: dict[tuple[str, str], dict] = {
    # the regime benchmark adds the James-Stein shrinkage baseline, the simplest alternative to V0.5 and BASIS
    # and reads its comparison on 4 samples per test question (benchmarks/regime_power.py, calibrated on sum3: with 5
    # seeds the two-level AUC half-width vs GRPO G = 8 is predicted at 0.047 on the 48 test questions, 0.057 with
    # one sample; 0.054 if the evaluation noise cancelled in the paired difference, 0.049 with 6 seeds)
    ("steps_matched", "smollm2"): dict(methods=[*REAL_METHODS, "james_stein"], test_eval_samples=4),
    ("scratchpad", "cpu"): dict(token_budget=400_000, eval_every_tokens=100_000, n_eval=1000, n_val=1000,
                                n_train=4000),
    ("scratchpad", "gpu"): dict(token_budget=4_000_000, eval_every_tokens=500_000, n_eval=2000, n_val=1000,
                                n_train=16000),
}
#: Protocol defaults on top of the preset. ``v1``: one learning rate for every method, seeds 0-2 (the documented
#: CPU run); ``v2``: each method's learning rate tuned on a validation split (grid 3e-5, 1e-4, 3e-4, seed 0), then
#: seeds 0-4 at the chosen rates, the threshold set by the best GRPO setting.
PROTOCOLS: dict[str, dict] = {
    "v1": dict(seeds=[0, 1, 2], tune_lr=None, tune_seeds=[0], threshold_reference=GRPO_REFERENCE, tune_extend=0),
    "v2": dict(seeds=[0, 1, 2, 3, 4], tune_lr=[3e-5, 1e-4, 3e-4], tune_seeds=[0], threshold_reference="best_grpo",
               tune_extend=2),
}
SMOKE = dict(methods=["grpo_g16", "grpo_g4"], seeds=[0], token_budget=500, eval_every_tokens=250, n_eval=40,
             n_train=64, n_val=40, rollouts_per_step=32, n_sim=50, n_boot=200)


#: Real-model chat tasks (``trl_ext.realmodel.tasks``) and their completion caps (the measured regime's,
#: docs/real_model.md).
REAL_TASK_MAX_NEW: dict[str, int] = {"sum3": 128, "largest": 128, "steps": 192, "steps_matched": 192}
REAL_TASK_NAMES = tuple(REAL_TASK_MAX_NEW)


#: Relative cost of one run of each method (train wall time of the scratchpad v1 runs at lr 1e-4, GRPO G=8 = 1;
#: BASIS includes a share of its value table), used only to order each seed's ``--jobs`` queue (costliest first).
METHOD_COST: dict[str, float] = {"pair": 2.0, "rloo": 1.25, "basis": 1.5, "grpo_g4": 1.0, "grpo_g8": 1.0,
                                 "grpo_g16": 0.95, "dr_grpo": 0.95, "signal_only": 1.0, "tiebreak": 1.0,
                                 "v05_osla": 0.8, "v05_fixed4": 0.8, "dapo_dynamic": 0.7, "reinforce_pp": 0.65,
                                 "james_stein": 1.0}
