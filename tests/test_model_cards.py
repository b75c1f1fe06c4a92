"""Model cards of the trl_ext trainers (TRL 1.16's class-level card settings, set through ``_trl_compat``).

Each trainer is built on the tiny testbed model and writes its card with ``create_model_card()`` (what TRL calls at
every checkpoint and ``push_to_hub`` calls) into ``output_dir/README.md``. Checked: the card names the method and
cites its paper (BibTeX), carries the tags, and records what the run depended on (BASIS: the value table's content
hash and reference model; V0.5: the prior type, the model the default embedding prior embeds with, and for a table
prior the value table's content hash; PAIR: the head settings). ``trl_ext.GRPOTrainer`` keeps GRPO's
card and adds the ``trl-ext`` tag. Also: what ``push_to_hub`` / ``save_model`` put in the uploaded folder.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
import warnings

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))
from base_helpers import binary_reward, hash_reward, tiny_dataset, tiny_model_and_tokenizer  # noqa: E402

from trl_ext.priors.table_format import ValueTable, ValueTableRow, save_value_table  # noqa: E402
from trl_ext.trainers import _trl_compat as compat  # noqa: E402
from trl_ext.trainers import model_card  # noqa: E402
from trl_ext.trainers.base import EXT_STATE_FILE, ExtGRPOConfig, GRPOTrainer  # noqa: E402
from trl_ext.trainers.basis import BASISConfig, BASISTrainer  # noqa: E402
from trl_ext.trainers.pair import PAIRConfig, PAIRTrainer  # noqa: E402
from trl_ext.trainers.v05 import V05GRPOConfig, V05GRPOTrainer, v05_model_card_details  # noqa: E402

COMMON = dict(per_device_train_batch_size=8, max_completion_length=5, max_steps=1, learning_rate=1e-3, use_cpu=True,
              bf16=False, report_to="none", beta=0.0, logging_steps=1, save_strategy="no", seed=0,
              dataloader_num_workers=0, disable_tqdm=True)

V05_CARD = dict(
    name="V0.5", tags=("trl", model_card.TRL_EXT_TAG, "v05"),
    paper=model_card.paper_info(title="V0.5: Generalist Value Model as a Prior for Sparse RL Rollouts", year=2026,
                            arxiv_id="2603.10848", bibtex_key="v05_2026"),
    details=("v05_value_prior", "v05_value_prior_kwargs", v05_model_card_details),
)
"""The arguments of the ``model_card.set_model_card_info(V05GRPOTrainer, ...)`` statement after the class in
``trl_ext/trainers/v05/``."""


def _card(trainer) -> str:
    trainer.create_model_card()
    with open(os.path.join(trainer.args.output_dir, "README.md"), encoding="utf-8") as f:
        return f.read()


def _front_matter_tags(card: str) -> set[str]:
    head = card.split("---")[1]
    return set(re.findall(r"^- (\S+)$", head, flags=re.M))


def _table(prompts, **meta) -> ValueTable:
    rows = [ValueTableRow.from_rewards(p, [1.0, 0.0, 0.0, 1.0], (0.0, 1.0)) for p in prompts]
    return ValueTable(rows, {"reward_funcs": ["binary_reward"], **meta})


def _pair(tmp_path, **over) -> PAIRTrainer:
    torch.set_num_threads(1)
    model, tok = tiny_model_and_tokenizer(0)
    kw = {**COMMON, "output_dir": str(tmp_path), "pair_prefix_tokens": 3, "pair_head_min_labels": 8, **over}
    return PAIRTrainer(model=model, reward_funcs=[binary_reward], args=PAIRConfig(**kw),
                       train_dataset=tiny_dataset(16), processing_class=tok)


def _basis(tmp_path, table, **over) -> BASISTrainer:
    torch.set_num_threads(1)
    model, tok = tiny_model_and_tokenizer(0)
    kw = {**COMMON, "output_dir": str(tmp_path / "out"), **over}
    return BASISTrainer(model=model, reward_funcs=[binary_reward], args=BASISConfig(**kw),
                        train_dataset=tiny_dataset(16), processing_class=tok, value_table=table)


def _v05(tmp_path, cls=V05GRPOTrainer, model=None, tok=None, **over) -> V05GRPOTrainer:
    torch.set_num_threads(1)
    if model is None:
        model, tok = tiny_model_and_tokenizer(0)
    trainer_kw = {k: over.pop(k) for k in ("prior", "peft_config") if k in over}
    kw = {**COMMON, "output_dir": str(tmp_path), "v05_value_prior": "constant", "v05_value_prior_kwargs": {"p": 0.3},
          **over}
    return cls(model=model, reward_funcs=[binary_reward], args=V05GRPOConfig(**kw), train_dataset=tiny_dataset(16),
               processing_class=tok, **trainer_kw)


# ------------------------------------------------------------------------------------------------------ TRL
def test_trl_builds_the_card_from_the_class_attributes_we_set():
    """The TRL contact of the card helpers: GRPOTrainer's class-level card attributes and the public
    ``create_model_card(model_name, dataset_name, tags)`` exist in the installed TRL."""
    import inspect

    import trl

    for name in compat.RELIED_ON_CARD_ATTRIBUTES:
        assert hasattr(trl.GRPOTrainer, name), f"TRL {trl.__version__}: GRPOTrainer.{name} no longer exists"
    info = model_card.model_card_info_of(trl.GRPOTrainer)
    assert info["name"] == "GRPO" and {"title", "id", "citation"} <= set(info["paper"])
    assert info["tags"] == compat.trl_grpo_tags() == ["trl", "grpo"]
    params = list(inspect.signature(trl.GRPOTrainer.create_model_card).parameters)
    assert params[:4] == ["self", "model_name", "dataset_name", "tags"]


# ------------------------------------------------------------------------------------------------------ GRPO
def test_grpo_card_keeps_grpo_and_adds_the_trl_ext_tag(tmp_path):
    model, tok = tiny_model_and_tokenizer(0)
    tr = GRPOTrainer(model=model, reward_funcs=[hash_reward], train_dataset=tiny_dataset(8), processing_class=tok,
                     args=ExtGRPOConfig(**{**COMMON, "output_dir": str(tmp_path), "num_generations": 4}))
    card = _card(tr)
    assert "This model was trained with GRPO, a method introduced in [DeepSeekMath" in card
    assert "@article{shao2024deepseekmath" in card
    assert {"trl", "grpo", "trl-ext"} <= _front_matter_tags(card)
    assert model_card.model_card_info_of(tr)["tags"] == ["trl", "grpo", "trl-ext"]
    assert {"trl", "grpo", "trl-ext"} <= set(tr.model.model_tags)  # TRL also tags the model with them


# ------------------------------------------------------------------------------------------------------ PAIR
def test_pair_card_names_pair_cites_its_paper_and_records_the_head_settings(tmp_path):
    tr = _pair(tmp_path, pair_head_hidden=64, pair_replay_size=512, pair_summary_last_k=4)
    card = _card(tr)
    assert "This model was trained with PAIR, a method introduced in [PAIR: Pairwise-Aware Inclusion Reweighting " \
           "for Adaptive Rollout Allocation in RLVR](https://huggingface.co/papers/2608.11368)" in card
    assert "GRPO" not in card.split("## trl_ext run details")[0].split("## Training procedure")[1]
    assert "DeepSeekMath" not in card
    assert "@misc{voss2026pair" in card and "author       = {Voss and Hale and Reyes}" in card
    assert "eprint       = {2608.11368}" in card
    tags = _front_matter_tags(card)
    assert {"trl", "trl-ext", "pair"} <= tags and "grpo" not in tags
    section = card.split("## trl_ext run details")[1].split("## Citations")[0]
    assert "**prefix heads**: hidden 64, lr 0.001, replay window 512, warm-up 8 labels" in section
    assert "summary of the last 4 hidden states" in section
    assert "tau = 3 tokens" in section and "pair_budget_ratio = 0.5" in section
    assert f"**policy learning rate**: learning_rate {tr.args.learning_rate} x 0.7071 (pair_lr_scaling = " \
           "'sqrt_budget')" in section
    assert "trl_ext.trainers.pair.trainer.PAIRTrainer" in section and EXT_STATE_FILE in section
    assert f"{tr.rollout_strategy.expected_token_factor():.3g}x TRL's generated tokens" in section
    assert card.count("## trl_ext run details") == 1


def test_card_written_at_checkpoints_records_training_state(tmp_path):
    """TRL writes the card at every checkpoint (``_save_checkpoint``): the PAIR section is there, with the heads'
    state after training, and the checkpoint holds the extension state."""
    tr = _pair(tmp_path, save_strategy="steps", save_steps=1, per_device_train_batch_size=16)
    tr.train()
    with open(tmp_path / "README.md", encoding="utf-8") as f:
        card = f.read()
    totals = tr.rollout_strategy.totals
    assert "This model was trained with PAIR" in card
    assert tr.rollout_strategy.heads.heads.n_labels > 0 and totals["prefix_tokens"] > 0  # one generation batch: what the card saw
    assert f"**heads at card time**: {tr.rollout_strategy.heads.heads.n_labels} labels in the replay window" in card
    assert f"**training tokens (prefix / suffix)**: {totals['prefix_tokens']} / {totals['suffix_tokens']} over 2 " \
           "prompts" in card
    assert (tmp_path / "checkpoint-1" / EXT_STATE_FILE).exists()


# ------------------------------------------------------------------------------------------------------ BASIS
def test_basis_card_names_basis_and_records_the_value_table_hash(tmp_path):
    ds = tiny_dataset(16)
    table = _table(ds["prompt"], model="ref/policy-0.5B", n_samples=4)
    path = tmp_path / "table.jsonl"
    save_value_table(path, table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny model is not ref/policy-0.5B: the table check warns
        tr = _basis(tmp_path, str(path))
    card = _card(tr)
    assert "This model was trained with BASIS." in card  # no arXiv id: no paper link, cited below by title
    assert "DeepSeekMath" not in card
    assert "@misc{gong2026basis" in card
    assert "{{BASIS: Batchwise Advantage Estimation from Single-Rollout Information Sharing for LLM Reasoning}}" in card
    assert "year         = 2026" in card
    tags = _front_matter_tags(card)
    assert {"trl", "trl-ext", "basis"} <= tags and "grpo" not in tags
    section = card.split("## trl_ext run details")[1].split("## Citations")[0]
    rows_hash = table.content_hash
    assert f"**value table sha256 (rows)**: `{rows_hash}`" in section
    import hashlib

    assert f"**value table file sha256**: `{hashlib.sha256(path.read_bytes()).hexdigest()}`" in section
    assert "**reference model (table header)**: ref/policy-0.5B" in section
    assert "table.jsonl (16 rows)" in section and str(tmp_path) not in card  # the file name, not the machine's path
    assert "basis_variant = unb" in section


def test_value_table_hash_is_the_rows_content(tmp_path):
    """The card's table hash is the rows' content hash (``ValueTable.content_hash``): same rows -> same hash, in
    memory or loaded from a file; a changed reward -> a different hash. An in-memory table has no file hash."""
    from trl_ext.priors.table_format import load_value_table

    prompts = tiny_dataset(16)["prompt"]
    a = _table(prompts)
    save_value_table(tmp_path / "a.jsonl", a)
    b = load_value_table(tmp_path / "a.jsonl")
    changed = ValueTable([ValueTableRow.from_rewards(p, [1.0, 0.0, 1.0, 1.0], (0.0, 1.0)) for p in prompts],
                         a.metadata)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cards = {name: (_basis(tmp_path / name, t), t) for name, t in (("a", a), ("b", b), ("c", changed))}
    hashes = {}
    for name, (tr, t) in cards.items():
        info = tr.value_table_info()
        assert info["rows_sha256"] == t.content_hash and info["file_sha256"] is None
        assert info["source"] == "in-memory ValueTable" and info["reference_model"] is None
        card = _card(tr)
        assert f"**value table sha256 (rows)**: `{t.content_hash}`" in card
        assert "**reference model (table header)**: not recorded" in card
        hashes[name] = t.content_hash
    assert hashes["a"] == hashes["b"] != hashes["c"]


# ------------------------------------------------------------------------------------------------------ V0.5
def test_v05_one_line_card_settings_name_v05_and_record_the_prior(tmp_path):
    """The statement proposed for ``v05.py`` (applied here to a subclass): V0.5's name, paper, tags and prior type."""

    class V05WithCard(V05GRPOTrainer):
        pass

    model_card.set_model_card_info(V05WithCard, **V05_CARD)
    card = _card(_v05(tmp_path, V05WithCard))
    assert "This model was trained with V0.5, a method introduced in [V0.5: Generalist Value Model as a Prior for " \
           "Sparse RL Rollouts](https://huggingface.co/papers/2603.10848)" in card
    assert "DeepSeekMath" not in card and "@misc{v05_2026" in card and "eprint       = {2603.10848}" in card
    assert {"trl", "trl-ext", "v05"} <= _front_matter_tags(card)
    section = card.split("## trl_ext run details")[1]
    assert "**args.v05_value_prior**: constant" in section
    assert '**args.v05_value_prior_kwargs**: {"p": 0.3}' in section
    assert "**value prior class**: ConstantPrior" in section


def test_v05_trainer_card_names_v05(tmp_path):
    card = _card(_v05(tmp_path))
    assert "This model was trained with V0.5" in card and "**args.v05_value_prior**: constant" in card
    assert "**embedding model**" not in card and "value table" not in card  # nothing to record for a constant


def test_v05_card_records_the_value_table_hash_of_a_table_prior(tmp_path):
    """``v05_value_prior="table"``: the card records the table as BASIS's does (rows' content hash, file hash,
    source and rows, reference model from the header); a ``TablePrior`` passed as ``prior=`` is recorded too."""
    import hashlib

    from trl_ext.priors import TablePrior

    table = _table(tiny_dataset(16)["prompt"], model="ref/policy-0.5B", n_samples=4)
    path = tmp_path / "table.jsonl"
    save_value_table(path, table)
    tr = _v05(tmp_path / "file", v05_value_prior="table", v05_value_prior_kwargs={"table": str(path)})
    info = tr.value_table_info()
    assert info["rows_sha256"] == table.content_hash and info["rows"] == 16
    section = _card(tr).split("## trl_ext run details")[1].split("## Citations")[0]
    assert "**value prior class**: TablePrior" in section
    assert f"**value table sha256 (rows)**: `{table.content_hash}`" in section
    assert f"**value table file sha256**: `{hashlib.sha256(path.read_bytes()).hexdigest()}`" in section
    assert "**value table**: table.jsonl (16 rows)" in section
    assert "**reference model (table header)**: ref/policy-0.5B" in section
    assert "**embedding model**" not in section
    section = _card(_v05(tmp_path / "mem", prior=TablePrior(table))).split("## trl_ext run details")[1]
    assert f"**value table sha256 (rows)**: `{table.content_hash}`" in section
    assert "**value table**: in-memory ValueTable (16 rows)" in section and "file sha256" not in section
    assert _v05(tmp_path / "c").value_table_info() is None


def test_v05_card_names_the_model_the_default_embedding_prior_embeds_with(tmp_path):
    """The default embedding prior's model in the card: a frozen policy copy (full fine-tuning, beta = 0), the LoRA
    base with the adapter disabled, or TRL's reference model (beta > 0)."""
    from peft import LoraConfig
    from transformers import AutoTokenizer

    from trl_ext.testbed import save_tiny_model

    def embedding_line(tr):
        assert tr.args.v05_value_prior == "embedding"
        section = _card(tr).split("## trl_ext run details")[1].split("## Citations")[0]
        assert "**value prior class**: EmbeddingInContextPrior" in section and "value table" not in section
        return next(line for line in section.splitlines() if line.startswith("- **embedding model**: "))

    default = dict(v05_value_prior="embedding", v05_value_prior_kwargs=None)
    tr = _v05(tmp_path / "copy", **default)
    n = tr.rollout_strategy.prior_info.get("prior_backbone")["parameters"]
    assert n > 0 and embedding_line(tr).endswith(f"a frozen copy of the starting policy (policy_copy; {n} parameters "
                                                 "copied)")
    tr = _v05(tmp_path / "lora", peft_config=LoraConfig(r=4, target_modules="all-linear"), **default)
    assert "PEFT/LoRA base model with the adapter disabled" in embedding_line(tr)
    assert embedding_line(tr).endswith("(peft_base_model; shared, no copy)")
    path = save_tiny_model(str(tmp_path / "tiny"), seed=0)
    tr = _v05(tmp_path / "ref", model=path, tok=AutoTokenizer.from_pretrained(path), beta=0.1, **default)
    assert embedding_line(tr) == (f"- **embedding model**: TRL's reference model `{path}` (reference_model; shared, "
                                  "no copy)")


# ------------------------------------------------------------------------------------------------------ helper
def test_set_model_card_info_validates_and_inherits(tmp_path):
    with pytest.raises(ValueError, match="paper needs"):
        model_card.set_model_card_info(type("X", (GRPOTrainer,), {}), paper={"title": "t"})
    with pytest.raises(TypeError, match="details item"):
        model_card.set_model_card_info(type("Y", (GRPOTrainer,), {}), details=(3,))
    sub = type("PAIRSub", (PAIRTrainer,), {})
    assert model_card.model_card_info_of(sub) == model_card.model_card_info_of(PAIRTrainer)
    assert "create_model_card" not in vars(sub)  # inherited, writes the section once
    info = model_card.paper_info(title="T", year=2026, bibtex_key="k")
    assert info["id"] is None and "eprint" not in info["citation"] and "author" not in info["citation"]


# ------------------------------------------------------------------------------------------------------ hub
class _FakeHub:
    """Stands in for ``huggingface_hub.HfApi``: records what ``upload_folder`` would upload (no network)."""

    def __init__(self):
        self.uploads = []

    def create_repo(self, repo_id, **kw):
        return type("Repo", (), {"repo_id": f"user/{repo_id}"})()

    def upload_folder(self, *, folder_path, ignore_patterns=(), **kw):
        files = []
        for root, _dirs, names in os.walk(folder_path):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), folder_path)
                if not any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.split(os.sep)[0], p)
                           for p in ignore_patterns):
                    files.append(rel)
        self.uploads.append(sorted(files))


def _push(tmp_path, monkeypatch):
    import transformers.trainer as hf_trainer

    hub = _FakeHub()
    monkeypatch.setattr(hf_trainer, "hf_api", lambda: hub)
    tr = _pair(tmp_path, save_strategy="steps", save_steps=1, per_device_train_batch_size=16)
    tr.train()
    tr.push_to_hub()
    return tr, hub


def test_push_to_hub_uploads_the_pair_card(tmp_path, monkeypatch):
    tr, hub = _push(tmp_path, monkeypatch)
    uploaded = hub.uploads[-1]
    assert "README.md" in uploaded and "model.safetensors" in uploaded
    assert not any(f.startswith("checkpoint-") for f in uploaded)  # TRL/transformers never upload checkpoints here
    with open(tmp_path / "README.md", encoding="utf-8") as f:
        card = f.read()
    assert "This model was trained with PAIR" in card and card.count("## trl_ext run details") == 1


def test_push_to_hub_and_save_model_include_the_extension_state(tmp_path, monkeypatch):
    tr, hub = _push(tmp_path, monkeypatch)
    assert EXT_STATE_FILE in hub.uploads[-1]
    out = tmp_path / "saved"
    tr.save_model(str(out))
    assert (out / EXT_STATE_FILE).exists()
