"""All TRL contact in ``trl_ext/trainers/_trl_compat.py``, checked against the installed TRL.

* every TRL/transformers private method trl_ext overrides or calls exists with the parameters we pass
  (``RELIED_ON``), and every instance attribute we read exists on a constructed trainer (``RELIED_ON_ATTRIBUTES``):
  a TRL release that renames one fails here, with its name;
* no module of ``trl_ext`` other than ``_trl_compat.py`` uses a private name of TRL's ``GRPOTrainer`` or
  transformers' ``Trainer`` (attribute access or method override), found by parsing the source;
* no module of ``trl_ext`` other than ``_trl_compat.py`` imports from TRL's submodules (``trl.models``,
  ``trl.trainer``, ...) or reaches them as ``trl.<submodule>``: only TRL's public top-level names
  (``from trl import GRPOConfig``, ``trl.GRPOTrainer``) are used elsewhere (``IMPORT_ALLOWLIST`` for exceptions);
* the library's ``nanstd`` is bitwise TRL's.
"""

from __future__ import annotations

import ast
import inspect
import os
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "scripts"))

import transformers  # noqa: E402
import trl  # noqa: E402

from trl_ext.trainers import _trl_compat as compat  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1] / "trl_ext"

ALLOWLIST: dict[str, set[str]] = {
    # file (relative to trl_ext/) -> private TRL names it may use, with the reason
    # (none today: every contact goes through _trl_compat.py)
}


IMPORT_ALLOWLIST: dict[str, set[str]] = {
    # file (relative to trl_ext/) -> TRL submodules it may import from, with the reason
    # (none today: the generation context, nanstd and every other TRL internal are reached through _trl_compat.py)
}


def _trl_submodule_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` for every import from a TRL submodule and every ``trl.<submodule>`` attribute access."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.startswith("trl."):
            out.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("trl.")]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trl" \
                and inspect.ismodule(getattr(trl, node.attr, None)):
            out.append((node.lineno, f"trl.{node.attr}"))
    return out


def test_no_trl_submodule_import_outside_trl_compat():
    probe = ast.parse("from trl.models import unwrap_model_for_generation\nimport trl.trainer.utils\n"
                      "x = trl.trainer.utils.nanstd\nfrom trl import GRPOConfig\ny = trl.GRPOTrainer\n")
    assert [m for _, m in _trl_submodule_uses(probe)] == ["trl.models", "trl.trainer.utils", "trl.trainer"]
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "trainers/_trl_compat.py":
            continue
        allowed = IMPORT_ALLOWLIST.get(rel, set())
        offenders += [f"{rel}:{line}: {mod}" for line, mod in _trl_submodule_uses(ast.parse(path.read_text()))
                      if mod not in allowed]
    assert not offenders, ("TRL submodules used outside _trl_compat.py (add a helper there, or a reasoned "
                           "IMPORT_ALLOWLIST entry):\n" + "\n".join(offenders))


def _trl_private_names() -> set[str]:
    """Private attribute and method names of trl.GRPOTrainer / transformers.Trainer (source scan + dir)."""
    names = {n for n in dir(trl.GRPOTrainer) if n.startswith("_") and not n.startswith("__")}
    for mod in (inspect.getmodule(trl.GRPOTrainer), inspect.getmodule(transformers.Trainer)):
        tree = ast.parse(inspect.getsource(mod))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and node.attr.startswith("_") and not node.attr.startswith("__"):
                names.add(node.attr)
    return names


def test_relied_on_methods_exist_with_the_parameters_we_pass():
    for name, params in compat.RELIED_ON.items():
        owner = trl.GRPOTrainer
        assert hasattr(owner, name), f"TRL {trl.__version__}: GRPOTrainer.{name} no longer exists"
        sig = inspect.signature(getattr(owner, name))
        got = [p for p in sig.parameters if p != "self"]
        assert tuple(got[: len(params)]) == params, f"GRPOTrainer.{name}{sig}: expected parameters {params}"


def test_relied_on_attributes_exist_on_a_constructed_trainer(tmp_path):
    from base_helpers import hash_reward, tiny_dataset, tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(0)
    cfg = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2, max_steps=1,
                         max_completion_length=4, use_cpu=True, report_to="none", save_strategy="no")
    tr = trl.GRPOTrainer(model=model, reward_funcs=[hash_reward], args=cfg, train_dataset=tiny_dataset(4),
                         processing_class=tok)
    missing = [a for a in compat.RELIED_ON_ATTRIBUTES if not hasattr(tr, a)]
    assert not missing, f"TRL {trl.__version__} GRPOTrainer lacks {missing}"
    assert isinstance(tr._metrics["train"], dict) and "prompt" in tr._logs  # the shapes we rely on


def test_no_trl_private_name_outside_trl_compat():
    trl_names = _trl_private_names()
    assert {"_generate_single_turn", "_metrics", "_logs", "_tokenizer", "_compute_loss"} <= trl_names
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "trainers/_trl_compat.py":
            continue
        tree = ast.parse(path.read_text())
        allowed = ALLOWLIST.get(rel, set())
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = node.name
            if name and name in trl_names and name not in allowed:
                offenders.append(f"{rel}:{node.lineno}: {name}")
    assert not offenders, "TRL private names used outside _trl_compat.py:\n" + "\n".join(offenders)


@pytest.mark.parametrize("shape,dim", [((7,), None), ((5, 4), 1), ((3, 6), 0)])
def test_nanstd_is_bitwise_trl(shape, dim):
    from trl.trainer.utils import nanstd as trl_nanstd

    from trl_ext.estimators.baselines import nanstd

    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g)
    x[0] = float("nan")
    ours, theirs = nanstd(x, dim=dim), trl_nanstd(x, dim=dim)
    assert torch.equal(torch.nan_to_num(ours, nan=-1.0), torch.nan_to_num(theirs, nan=-1.0))


def test_glue_is_the_only_subclass_overriding_trl_privates():
    from trl_ext.trainers.base import GRPOTrainer

    overridden = {n for n in vars(compat.TRLGlue) if n in compat.RELIED_ON}
    assert {"_generate_and_score_completions", "_generate", "_generate_single_turn", "_calculate_rewards",
            "_compute_loss", "_save_checkpoint", "_load_optimizer_and_scheduler"} <= overridden
    assert issubclass(GRPOTrainer, compat.TRLGlue)
