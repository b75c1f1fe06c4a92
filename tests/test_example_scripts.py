"""The TRL-style training scripts ``examples/scripts/{grpo,v05_grpo,basis,pair}.py`` and ``trl_ext.scripts_support``.

Default suite (the tiny testbed model, built offline in a temporary folder): every script's ``--help``; a two-step
CPU run of each script that leaves ``trainer_state.json`` and the model (or the LoRA adapter) in ``--output_dir``
(GRPO through the command line with ``--dynamic_sampling``, the others in-process through their ``main``; V0.5 with
``--use_peft``, BASIS building its value table with ``--build_value_table``); ``--use_vllm`` reaching TRL's own vLLM
check, and one step through TRL's vLLM generation path with a stand-in for TRL's ``VLLMGeneration``; the name
resolvers' results and error messages.

``real_model`` (kept out of the default run; ``python -m pytest -m real_model``): each script trains on
SmolLM2-135M-Instruct on the ``sum3`` task with ``--use_cpu --use_peft`` and 32-token completions, and the adapter it
saves loads with ``PeftModel.from_pretrained`` to the trained LoRA weights.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS_DIR = os.path.join(ROOT, "examples", "scripts")
SCRIPTS = ("grpo", "v05_grpo", "basis", "pair")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true"}
#: options every test run shares: CPU, fp32, no checkpoints, one log per step
CPU = ["--use_cpu", "--bf16", "false", "--gradient_checkpointing", "false", "--report_to", "none", "--logging_steps",
       "1", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0"]


def load_script(name: str):
    """Import ``examples/scripts/<name>.py`` under a unique module name (``pair``/``basis`` exist elsewhere too)."""
    mod_name = f"trl_ext_example_script_{name}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, os.path.join(SCRIPTS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    spec.loader.exec_module(module)
    return module


def parse(name: str, argv: list[str]):
    return load_script(name).make_parser().parse_args_and_config(argv)


def run_main(name: str, argv: list[str], **kw):
    import torch

    torch.set_num_threads(1)
    script_args, training_args, model_args = parse(name, argv)
    return load_script(name).main(script_args, training_args, model_args, **kw)


def state_of(out) -> dict:
    return json.loads((out / "trainer_state.json").read_text())


def losses(state: dict) -> list[float]:
    return [h["loss"] for h in state["log_history"] if "loss" in h]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """An untrained tiny testbed model + character tokenizer (built locally in well under a second)."""
    from trl_ext.testbed import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def cpu_testbed_argv(model: str, out, *extra: str) -> list[str]:
    return ["--model_name_or_path", model, "--dataset_name", "addition", "--dataset_num_prompts", "16",
            "--max_completion_length", "5", "--learning_rate", "1e-3", "--max_steps", "2", "--output_dir", str(out),
            *CPU, *extra]


# ============================================================================================ command line
@pytest.mark.parametrize("name", SCRIPTS)
def test_help_exits_zero_and_lists_the_options(name):
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS_DIR, f"{name}.py"), "--help"], env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    common = ["--dataset_name", "--reward_funcs", "--dataset_num_prompts", "--model_name_or_path", "--use_peft",
              "--lora_target_modules", "--use_vllm", "--vllm_mode", "--use_cpu", "--bf16", "--push_to_hub",
              "--output_dir"]
    own = {"grpo": ["--dynamic_sampling", "--advantage_estimator"], "v05_grpo": ["--v05_k_init", "--v05_value_prior"],
           "basis": ["--build_value_table", "--value_table_num_samples", "--basis_value_table_path"],
           "pair": ["--pair_prefix_tokens", "--pair_budget_ratio"]}[name]
    missing = [opt for opt in common + own if opt not in out]
    assert not missing, f"{name}.py --help lacks {missing}"


def test_grpo_command_line_dynamic_sampling_two_steps_on_cpu(tiny, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(SCRIPTS_DIR, "grpo.py"),
                           *cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--num_generations", "4",
                                             "--dynamic_sampling", "--dynamic_sampling_max_rounds", "1")],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    state = state_of(out)
    assert state["global_step"] == 2 and len(losses(state)) == 2 and all(math.isfinite(x) for x in losses(state))
    # DAPO dynamic sampling ran: each step logged its generated groups
    assert sum("dapo/generated_groups" in h for h in state["log_history"]) == 2
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    assert (out / "trl_ext_state.pt").exists()


# ============================================================================================ in-process runs
def test_grpo_estimator_by_name_and_reward_by_import_string(tiny, tmp_path):
    out = tmp_path / "out"
    tr = run_main("grpo", cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--num_generations", "4",
                                           "--advantage_estimator", "rloo",
                                           "--reward_funcs", "accuracy", "trl_ext.testbed.tasks:exact_match_reward"))
    from trl_ext.testbed.tasks import addition_reward, exact_match_reward

    assert tr.args.advantage_estimator == "rloo" and tr.state.global_step == 2
    assert [getattr(f, "__wrapped__", f) for f in tr.reward_funcs] == [addition_reward, exact_match_reward]
    assert {"rewards/addition_reward/mean", "rewards/exact_match_reward/mean"} <= set(state_of(out)["log_history"][0])


def test_grpo_script_runs_v05_by_config_values(tiny, tmp_path):
    """A method selected on the command line of grpo.py (no method script): V0.5's estimator and OSLA rounds."""
    out = tmp_path / "out"
    tr = run_main("grpo", cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--num_generations", "4",
                                           "--advantage_estimator", "v05", "--rollout_strategy", "v05_osla",
                                           "--rollout_strategy_kwargs",
                                           '{"value_prior": "constant", "value_prior_kwargs": {"p": 0.5}}'))
    from trl_ext.trainers.v05 import OSLARounds

    assert type(tr).__name__ == "GRPOTrainer" and isinstance(tr.rollout_strategy, OSLARounds)
    assert tr.state.global_step == 2 and tr.rollout_strategy.options.value_prior == "constant"
    assert sum("v05/rollouts_per_prompt_mean" in h for h in state_of(out)["log_history"]) == 2


def test_v05_with_peft_saves_an_adapter(tiny, tmp_path):
    out = tmp_path / "out"
    tr = run_main("v05_grpo", cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--v05_k_init", "4",
                                               "--use_peft", "--lora_target_modules", "q_proj", "v_proj",
                                               "--lora_r", "4"))
    state = state_of(out)
    assert state["global_step"] == 2 and all(math.isfinite(x) for x in losses(state))
    assert any(k.startswith("v05/") for h in state["log_history"] for k in h)  # V0.5's diagnostics were logged
    assert (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"] and cfg["r"] == 4
    assert type(tr.model).__name__.startswith("Peft")


def test_basis_builds_its_value_table_and_trains(tiny, tmp_path):
    from trl_ext.priors import load_value_table

    out = tmp_path / "out"
    tr = run_main("basis", cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--build_value_table",
                                            "--value_table_num_samples", "2"))
    table = load_value_table(str(out / "value_table.jsonl"))  # complete (loaders refuse unfinished tables)
    assert len(table) == 16 and all(r.n == 2 for r in table)
    assert tr.args.basis_value_table_path == str(out / "value_table.jsonl") and tr.args.num_generations == 1
    state = state_of(out)
    assert state["global_step"] == 2 and all(math.isfinite(x) for x in losses(state))
    assert (out / "model.safetensors").exists()


def test_basis_without_a_table_says_how_to_get_one(tiny, tmp_path):
    with pytest.raises(ValueError, match="--basis_value_table_path.*--build_value_table"):
        run_main("basis", cpu_testbed_argv(tiny, tmp_path / "out", "--per_device_train_batch_size", "8"))


def test_pair_trains_and_logs_its_prefix_tokens(tiny, tmp_path):
    out = tmp_path / "out"
    run_main("pair", cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--num_generations", "4",
                                      "--pair_prefix_tokens", "1"))
    state = state_of(out)
    assert state["global_step"] == 2 and all(math.isfinite(x) for x in losses(state))
    assert [h["pair/prefix_tokens"] for h in state["log_history"] if "pair/prefix_tokens" in h] == [8, 8]
    assert (out / "model.safetensors").exists()


# ============================================================================================ vLLM
class StandInVLLMGeneration:
    """Stand-in for TRL's ``VLLMGeneration`` (vLLM is not installed): built with TRL's constructor arguments, it
    samples each prompt once with the policy (TRL's colocate contract: prompts arrive already repeated G times) and
    returns the sampled tokens' log-probabilities, as vLLM does with ``logprobs=0``."""

    instances: list = []

    def __init__(self, model, accelerator, processing_class, **kwargs):
        self.model, self.accelerator, self.kwargs = model, accelerator, kwargs
        self.mode, self.tensor_parallel_size = kwargs["mode"], kwargs["tensor_parallel_size"]
        self.max_completion_length = kwargs["max_completion_length"]
        self.eos = processing_class.eos_token_id
        self.calls: list[int] = []
        self.syncs = 0
        StandInVLLMGeneration.instances.append(self)

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        import torch

        model = self.accelerator.unwrap_model(self.model)
        gen = torch.Generator().manual_seed(len(self.calls))
        self.calls.append(len(prompts))
        comps, logps = [], []
        with torch.no_grad():
            for ids in prompts:
                out, lps = [], []
                for _ in range(self.max_completion_length):
                    logits = model(torch.tensor([list(ids) + out])).logits[0, -1].float()
                    logp = torch.log_softmax(logits / self.kwargs["temperature"], -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                    out.append(tok)
                    lps.append([float(logp[tok])])
                    if tok == self.eos:
                        break
                comps.append(out)
                logps.append(lps)
        return prompts, comps, logps, None


@pytest.mark.parametrize("name", SCRIPTS)
def test_use_vllm_passes_through_to_the_config(name, tmp_path):
    _, training_args, _ = parse(name, ["--output_dir", str(tmp_path), "--use_vllm", "--vllm_mode", "colocate",
                                       *CPU])
    assert training_args.use_vllm is True and training_args.vllm_mode == "colocate"
    _, training_args, _ = parse(name, ["--output_dir", str(tmp_path), *CPU])
    assert training_args.use_vllm is False


def test_use_vllm_without_vllm_stops_at_trls_own_check(tiny, tmp_path):
    from trl.import_utils import is_vllm_available

    if is_vllm_available():
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match="vLLM is not available and `use_vllm` is set to True"):
        run_main("grpo", cpu_testbed_argv(tiny, tmp_path / "out", "--per_device_train_batch_size", "8",
                                          "--num_generations", "4", "--use_vllm", "--vllm_mode", "colocate"))


def test_use_vllm_trains_through_trls_vllm_path_with_a_stand_in(tiny, tmp_path, monkeypatch):
    import trl.trainer.grpo_trainer as grpo_module

    StandInVLLMGeneration.instances.clear()
    monkeypatch.setattr(grpo_module, "VLLMGeneration", StandInVLLMGeneration)
    out = tmp_path / "out"
    tr = run_main("grpo", cpu_testbed_argv(tiny, out, "--per_device_train_batch_size", "8", "--num_generations", "4",
                                           "--use_vllm", "--vllm_mode", "colocate", "--max_steps", "1"))
    (vg,) = StandInVLLMGeneration.instances
    assert tr.use_vllm and tr.vllm_generation is vg and vg.mode == "colocate"
    assert vg.calls == [8] and vg.syncs == 1  # one generation call of 2 prompts x 4, after one weight sync
    state = state_of(out)
    assert state["global_step"] == 1 and all(math.isfinite(x) for x in losses(state))
    # TRL used the stand-in's sampling log-probs for its importance-sampling correction: aligned, so the ratio is ~1
    assert state["log_history"][0]["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)


# ============================================================================================ name resolution
def test_builtin_datasets_and_their_rewards():
    from trl_ext.realmodel.tasks import accuracy_reward, format_reward
    from trl_ext.scripts_support import ExtScriptArguments, load_datasets, resolve_reward_funcs
    from trl_ext.testbed.tasks import addition_reward

    train, test = load_datasets(ExtScriptArguments(dataset_name="sum3", dataset_num_prompts=5, dataset_seed=1))
    assert len(train) == 5 and test is None and isinstance(train[0]["prompt"], list)  # conversational
    ev = type("Args", (), {"eval_strategy": "steps"})()
    train, test = load_datasets(ExtScriptArguments(dataset_name="addition", dataset_num_prompts=3,
                                                   eval_num_prompts=10**6), ev)
    assert len(train) == 3 and len(test) > 100 and isinstance(train[0]["prompt"], str)  # eval capped at the split
    assert resolve_reward_funcs(None, "sum3") == [accuracy_reward]
    assert resolve_reward_funcs(["accuracy", "format"], "largest") == [accuracy_reward, format_reward]
    assert resolve_reward_funcs(None, "addition") == [addition_reward]
    assert resolve_reward_funcs(["trl_ext.realmodel.tasks.format_reward"], "my/data") == [format_reward]  # TRL's form


def test_local_dataset_file(tmp_path):
    from trl_ext.scripts_support import ExtScriptArguments, load_datasets

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5)))
    train, test = load_datasets(ExtScriptArguments(dataset_name=str(path), dataset_num_prompts=3))
    assert train["prompt"] == ["0+1=", "1+1=", "2+1="] and test is None
    with pytest.raises(ValueError, match="--eval_strategy steps needs a test split"):
        load_datasets(ExtScriptArguments(dataset_name=str(path)), type("Args", (), {"eval_strategy": "steps"})())


def test_bad_names_list_the_valid_ones(monkeypatch):
    from trl_ext import scripts_support as ss

    tasks = ", ".join(ss.builtin_tasks())
    assert {"addition", "substitution", "sum3", "largest", "steps"} <= set(ss.builtin_tasks())
    with pytest.raises(ValueError, match=r"unknown reward function 'acc'.*\['accuracy', 'accuracy_reward', 'format'"):
        ss.resolve_reward_funcs(["acc"], "sum3")
    with pytest.raises(ValueError, match=f"--reward_funcs is required.*{tasks}"):
        ss.resolve_reward_funcs(None, "someone/dataset")
    with pytest.raises(ValueError, match="no attribute"):
        ss.resolve_reward_funcs(["trl_ext.realmodel.tasks:nope"], "sum3")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match=f"not a built-in task \\({tasks}\\)"):
        ss.load_datasets(ss.ExtScriptArguments(dataset_name="no_such_task_or_dataset"))
    with pytest.raises(ValueError, match="--dataset_name is required"):
        ss.load_datasets(ss.ExtScriptArguments())
    with pytest.raises(ValueError, match="larger than the train split of sum3"):
        ss.load_datasets(ss.ExtScriptArguments(dataset_name="sum3", dataset_num_prompts=10**6))
    with pytest.raises(ValueError, match="testbed-warm.*--dataset_name one of addition, substitution"):
        ss.resolve_model_name("testbed-warm", dataset_name="sum3")
    with pytest.raises(ValueError, match="--model_name_or_path is required.*smollm2"):
        ss.resolve_model_name(None)


def test_model_aliases_resolve_to_the_cached_models(monkeypatch, tmp_path):
    import trl_ext.realmodel as realmodel
    import trl_ext.testbed as testbed
    from trl_ext.scripts_support import resolve_model_name

    calls = []
    monkeypatch.setattr(realmodel, "get_real_model", lambda cache_dir=None: calls.append(("real", cache_dir)) or "R")
    monkeypatch.setattr(testbed, "get_warm_model", lambda task, **kw: calls.append((task, kw["cache_dir"])) or "W")
    assert resolve_model_name("smollm2", cache_dir="c") == "R" and resolve_model_name("real") == "R"
    assert resolve_model_name("testbed-warm", dataset_name="substitution") == "W"
    assert resolve_model_name(str(tmp_path)) == str(tmp_path) and resolve_model_name("org/model") == "org/model"
    assert calls == [("real", "c"), ("real", None), ("substitution", None)]
    (tmp_path / "real").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_model_name("real") == "real" and len(calls) == 3  # a local folder wins over the alias


# ============================================================================================ the real model
@pytest.fixture(scope="module")
def real_model_dir():
    from trl_ext.realmodel import get_real_model

    return get_real_model()  # cached after the first build (see tests/test_real_model.py)


def real_model_argv(model: str, out, *extra: str) -> list[str]:
    return ["--model_name_or_path", model, "--dataset_name", "sum3", "--dataset_num_prompts", "8",
            "--reward_funcs", "accuracy", "format", "--reward_weights", "0.75", "0.25",
            "--max_completion_length", "32", "--learning_rate", "5e-4", "--output_dir", str(out),
            "--use_peft", "--lora_r", "8", "--lora_alpha", "16", "--lora_target_modules", "q_proj", "v_proj",
            *CPU, *extra]


#: two steps each, one prompt x 4 rollouts (BASIS: 2 prompts x 1) of at most 32 tokens (~1 min 50 s in all)
REAL_RUNS = {
    "grpo": ["--per_device_train_batch_size", "4", "--num_generations", "4", "--max_steps", "2"],
    "v05_grpo": ["--per_device_train_batch_size", "4", "--num_generations", "4", "--v05_k_init", "4",
                 "--v05_extra_rollout_budget", "0.5", "--max_steps", "2"],
    "basis": ["--per_device_train_batch_size", "2", "--build_value_table", "--value_table_num_samples", "2",
              "--dataset_num_prompts", "4", "--max_steps", "2"],
    "pair": ["--per_device_train_batch_size", "4", "--num_generations", "4", "--pair_prefix_tokens", "6",
             "--pair_head_min_labels", "4", "--pair_head_fit_steps", "5", "--max_steps", "2"],
}


@pytest.mark.real_model
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_trains_lora_on_the_real_model(name, real_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    t0 = time.monotonic()
    model = "smollm2" if name == "grpo" else real_model_dir  # the alias resolves to the same cached folder
    tr = run_main(name, real_model_argv(model, out, *REAL_RUNS[name]))
    steps = int(REAL_RUNS[name][REAL_RUNS[name].index("--max_steps") + 1])
    state = state_of(out)
    assert state["global_step"] == steps and len(losses(state)) == steps
    assert all(math.isfinite(x) for x in losses(state))
    assert isinstance(tr.train_dataset[0]["prompt"], list)  # conversational prompts through the chat template
    trained = {k.replace(".default", ""): v.detach().clone() for k, v in tr.model.state_dict().items() if "lora_" in k}
    assert trained and (out / "adapter_config.json").exists() and not (out / "model.safetensors").exists()
    del tr
    gc.collect()
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32), out)
    got = {k.replace(".default", ""): v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert got.keys() == trained.keys() and all(torch.equal(got[k], trained[k]) for k in trained)
    del loaded
    gc.collect()
    print(f"\n[real model] examples/scripts/{name}.py: {steps} steps + adapter reload {time.monotonic() - t0:.0f}s")


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_measure_task_applies_an_adapter(real_model_dir, tmp_path):
    """``measure_task(adapter_path=...)`` evaluates the adapted model: a LoRA adapter whose B matrices are set to
    large values changes the completions, a zero-initialised one does not (merged LoRA with B = 0 is the base)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_ext.realmodel.measure import measure_task

    with pytest.raises(FileNotFoundError, match="not a PEFT adapter folder"):
        measure_task(real_model_dir, "sum3", adapter_path=str(tmp_path))
    for tag, scale in (("zero", 0.0), ("big", 0.5)):
        peft = get_peft_model(AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32),
                              LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        with torch.no_grad():
            for n, p in peft.named_parameters():
                if "lora_B" in n:
                    p.fill_(scale)
        peft.save_pretrained(tmp_path / tag)
    kw = dict(num_prompts=2, num_samples=2, max_new_tokens=12, greedy=False)
    base = measure_task(real_model_dir, "sum3", **kw)
    zero = measure_task(real_model_dir, "sum3", adapter_path=str(tmp_path / "zero"), **kw)
    big = measure_task(real_model_dir, "sum3", adapter_path=str(tmp_path / "big"), **kw)
    assert zero["examples"] == base["examples"] and zero["adapter"] == str(tmp_path / "zero")
    assert big["examples"] != base["examples"]
    assert len(base["per_prompt_success"]) == 2


def test_finish_uses_trainer_end_or_the_accelerator_on_older_transformers():
    """``Trainer.end()`` is missing from older transformers (5.17): the scripts' ``finish`` falls back."""
    from trl_ext.scripts_support import finish

    calls = []
    acc = type("Acc", (), {"end_training": lambda self: calls.append("accelerator")})()
    old = type("Old", (), {"accelerator": acc})()
    new = type("New", (), {"accelerator": acc, "end": lambda self: calls.append("end")})()
    finish(old)
    finish(new)
    assert calls == ["accelerator", "end"]
    for name in SCRIPTS:  # every script ends through finish(), not trainer.end()
        src = open(os.path.join(SCRIPTS_DIR, f"{name}.py")).read()
        assert "finish(main(" in src and ".end()" not in src, name
