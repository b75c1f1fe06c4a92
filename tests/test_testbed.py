"""Tests for the offline RLVR testbed (trl_ext.testbed): tokenizer/model round trips, tasks and splits,
rewards with hidden-mapping channel scoring, evaluation helpers and the warm-model cache."""

import json
import os
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_ext import testbed as tb

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return tb.build_tokenizer()


# ----------------------------------------------------------------------------------------------- tokenizer
def test_tokenizer_special_ids_and_char_roundtrip(tok):
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<eos>", "<unk>"]
    text = "0>3,2>7|47=92"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no BOS/EOS added
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text
    assert tok("7x")["input_ids"][1] == tok.unk_token_id


def test_tokenizer_covers_every_task_character(tok):
    for task in tb.TASKS:
        ds = tb.make_dataset(task, 30, split="test")
        for row in ds:
            for field in ("prompt", "answer"):
                assert tok.unk_token_id not in tok(row[field])["input_ids"], (task, row[field])


def test_tokenizer_extra_chars_and_bad_input():
    base = tb.build_tokenizer()
    ext = tb.build_tokenizer(extra_chars="ab+a")  # '+' already present, 'a' duplicated
    assert len(ext) == len(base) + 2
    assert ext.convert_tokens_to_ids(["a", "b"]) == [len(base), len(base) + 1]
    assert ext("1+1")["input_ids"] == base("1+1")["input_ids"]  # existing ids unchanged
    with pytest.raises(TypeError, match="extra_chars"):
        tb.build_tokenizer(extra_chars=["a"])
    with pytest.raises(ValueError, match="control whitespace"):
        tb.build_tokenizer(extra_chars="\n")


def test_tokenizer_and_model_save_reload_same_logits(tmp_path, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tb.build_tiny_model(tok, seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    prompts = ["12+34=", "0>3,2>7|47="]
    assert tok2(prompts)["input_ids"] == tok(prompts)["input_ids"]
    assert (tok2.pad_token_id, tok2.eos_token_id, tok2.padding_side) == (0, 1, "left")
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        a = model(**enc).logits
        b = model2(**enc).logits
    assert torch.equal(a, b)


def test_model_size_and_seed_determinism(tok):
    m1, m2, m3 = (tb.build_tiny_model(tok, seed=s) for s in (0, 0, 1))
    n = sum(p.numel() for p in m1.parameters())
    assert 0.5e6 < n < 1.5e6
    assert m1.config.vocab_size == len(tok) and m1.config.tie_word_embeddings
    sd1, sd2, sd3 = m1.state_dict(), m2.state_dict(), m3.state_dict()
    assert all(torch.equal(sd1[k], sd2[k]) for k in sd1)
    assert any(not torch.equal(sd1[k], sd3[k]) for k in sd1)
    # the global RNG is untouched by building a model
    torch.manual_seed(123)
    x = torch.rand(1)
    torch.manual_seed(123)
    tb.build_tiny_model(tok, seed=5)
    assert torch.equal(torch.rand(1), x)
    assert tb.build_tiny_model(tok, hidden_size=64, intermediate_size=96).config.hidden_size == 64
    with pytest.raises(ValueError, match="seed"):
        tb.build_tiny_model(tok, seed=-1)


def test_save_tiny_model_loads_with_auto(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tb.save_tiny_model(tmp_path / "m", seed=0)
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "llama"
    tok2 = AutoTokenizer.from_pretrained(path)
    assert tok2.decode(tok2("01+9=")["input_ids"]) == "01+9="


# --------------------------------------------------------------------------------------------------- tasks
@pytest.mark.parametrize("task,params,universe", [("addition", {}, 10000), ("addition", {"digits": 1}, 100),
                                                  ("substitution", {}, 100),
                                                  ("substitution", {"length": 3, "n_hidden": 3}, 1000)])
def test_splits_disjoint_and_cover_universe(task, params, universe):
    n_tr, n_te = tb.split_size(task, "train", **params), tb.split_size(task, "test", **params)
    assert n_tr + n_te == universe
    tr = tb.make_dataset(task, n_tr, seed=1, split="train", **params)
    te = tb.make_dataset(task, n_te, seed=2, split="test", **params)
    ids_tr, ids_te = set(tr["question_id"]), set(te["question_id"])
    assert len(ids_tr) == n_tr and len(ids_te) == n_te  # distinct problems
    assert not ids_tr & ids_te
    assert not set(tr["prompt"]) & set(te["prompt"])


def test_substitution_split_is_the_papers_70_30():
    assert (tb.split_size("substitution", "train"), tb.split_size("substitution", "test")) == (70, 30)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task=st.sampled_from(["addition", "substitution"]), n=st.integers(1, 30), seed=st.integers(0, 10**6),
       split=st.sampled_from(["train", "test"]))
def test_make_dataset_properties(task, n, seed, split):
    ds = tb.make_dataset(task, n, seed=seed, split=split)
    assert len(ds) == n and len(set(ds["question_id"])) == n
    assert ds["question_id"] == tb.make_dataset(task, n, seed=seed, split=split)["question_id"]  # deterministic
    pool = set(tb.make_dataset(task, tb.split_size(task, split), seed=0, split=split)["question_id"])
    assert set(ds["question_id"]) <= pool  # seed only picks from the fixed split
    for row in ds:
        if task == "addition":
            assert row["prompt"] == f"{row['a']}+{row['b']}=" and row["answer"] == str(row["a"] + row["b"])
            assert row["question_id"] == f"add:{row['a']}+{row['b']}"
        else:
            code, hid = row["code"], row["hidden_digits"]
            assert row["answer"] == "".join(code[int(c)] for c in row["source"])
            assert row["prompt"].endswith(f"|{row['source']}=")
            assert row["n_hidden_slots"] == sum(c in hid for c in row["source"])


def test_question_ids_stable_across_seeds():
    a = tb.make_dataset("addition", 200, seed=0)
    b = tb.make_dataset("addition", 200, seed=1)
    assert a["question_id"] != b["question_id"]
    common = set(a["question_id"]) & set(b["question_id"])
    pa = dict(zip(a["question_id"], a["prompt"]))
    pb = dict(zip(b["question_id"], b["prompt"]))
    assert all(pa[q] == pb[q] for q in common)


def test_substitution_code_is_fixed_derangement_and_hides_mappings():
    for code_seed in range(5):
        for n_hidden in (0, 2, 5, 10):
            code, hidden = tb.substitution_code(code_seed, n_hidden)
            assert sorted(code) == list("0123456789")
            assert all(code[d] != str(d) for d in range(10))
            assert len(hidden) == n_hidden == len(set(hidden))
            ds = tb.make_dataset("substitution", 5, n_hidden=n_hidden, code_seed=code_seed)
            header = ds[0]["prompt"].split("|")[0]
            shown = dict(pair.split(">") for pair in header.split(",")) if header else {}
            assert set(shown) == set("0123456789") - set(hidden)
            assert all(code[int(s)] == t for s, t in shown.items())
    assert tb.substitution_code(0) == tb.substitution_code(0)
    assert tb.substitution_code(0)[0] != tb.substitution_code(1)[0]


@pytest.mark.parametrize("call,match", [
    (lambda: tb.make_dataset("multiplication", 5), r"unknown task 'multiplication'; valid tasks: \['addition'"),
    (lambda: tb.make_dataset("addition", 9000), "n=9000 is larger than the 8000 distinct problems"),
    (lambda: tb.make_dataset("substitution", 31, split="test"), "n <= 30"),
    (lambda: tb.make_dataset("addition", 5, digits=-1), "digits=-1 is out of range"),
    (lambda: tb.make_dataset("addition", 5, digits=1.5), "digits must be an int"),
    (lambda: tb.make_dataset("substitution", 5, n_hidden=11), "n_hidden=11 is out of range.*only 10"),
    (lambda: tb.make_dataset("substitution", 5, length=0), "length=0 is out of range"),
    (lambda: tb.make_dataset("substitution", 5, hidden=2), r"unknown parameter\(s\) \['hidden'\]"),
    (lambda: tb.make_dataset("addition", 5, split="val"), "split must be 'train' or 'test'"),
    (lambda: tb.make_dataset("addition", 0), "n must be a positive int"),
    (lambda: tb.make_dataset("addition", 5, seed=-3), "seed must be a non-negative int"),
    (lambda: tb.make_dataset("addition", 5, test_fraction=1.0), "test_fraction"),
    (lambda: tb.get_reward_funcs("nope"), "valid tasks"),
])
def test_bad_task_input_raises_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------------- rewards
def test_exact_match_rewards():
    kw = {"answer": ["46", "7", "100"]}
    comps = ["46", " 7\n", "10"]
    assert tb.addition_reward(["p"] * 3, comps, **kw) == [1.0, 1.0, 0.0]
    assert tb.substitution_reward(["p"] * 3, ["46", "8", "1000"], **kw) == [1.0, 0.0, 0.0]
    conv = [[{"role": "assistant", "content": "46"}], [{"role": "assistant", "content": "8"}],
            [{"role": "assistant", "content": "100"}]]
    assert tb.addition_reward(["p"] * 3, conv, **kw) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="2 completions but 3 values in column 'answer'"):
        tb.addition_reward(["p"] * 2, comps[:2], **kw)
    with pytest.raises(ValueError, match="needs the dataset column 'answer'"):
        tb.addition_reward(["p"], ["1"])
    with pytest.raises(TypeError, match="completion must be"):
        tb.addition_reward(["p"], [3], answer=["3"])
    assert [f.__name__ for f in tb.get_reward_funcs("addition")] == ["addition_reward"]
    assert [f.__name__ for f in tb.get_reward_funcs("substitution")] == ["substitution_reward"]


def test_channel_scores_exhaustive_against_definition():
    """Every 2-digit source x every pattern of right/wrong output digits: channel counts match the definition."""
    ds = tb.make_dataset("substitution", 70, split="train")
    code, hid = ds[0]["code"], ds[0]["hidden_digits"]
    for src in ds["source"]:
        for pattern in range(4):  # bit i set -> position i wrong
            out = "".join(code[int(s)] if not (pattern >> i) & 1 else str((int(code[int(s)]) + 1) % 10)
                          for i, s in enumerate(src))
            sc = tb.substitution_channel_scores([out], [src], [code], [hid])[0]
            right = [not (pattern >> i) & 1 for i in range(2)]
            want_h = (sum(r for r, s in zip(right, src) if s in hid), sum(s in hid for s in src))
            want_r = (sum(r for r, s in zip(right, src) if s not in hid), sum(s not in hid for s in src))
            assert sc["hidden"] == want_h and sc["revealed"] == want_r
            for d in hid:
                assert sc[f"hidden:{d}"] == (sum(r for r, s in zip(right, src) if s == d), src.count(d))
            exact = tb.substitution_reward([""], [out], answer=["".join(code[int(s)] for s in src)])[0]
            assert exact == float(pattern == 0)
            hr = tb.substitution_hidden_reward([""], [out], source=[src], code=[code], hidden_digits=[hid])[0]
            assert hr == (None if want_h[1] == 0 else want_h[0] / want_h[1])


def test_channel_scores_short_long_and_bad_code():
    code, hid = "1234567890", "05"
    sc = tb.substitution_channel_scores(["1", "1699", ""], ["05"] * 3, [code] * 3, [hid] * 3)
    assert sc[0]["hidden:0"] == (1, 1) and sc[0]["hidden:5"] == (0, 1)  # missing char counts wrong
    assert sc[1]["hidden"] == (2, 2)  # trailing extra characters do not affect slots
    assert sc[2]["hidden"] == (0, 2) and sc[2]["revealed"] == (0, 0)
    assert tb.substitution_hidden_reward([""], ["9"], source=["1"], code=[code], hidden_digits=[hid],
                                         no_slot_value=0.0) == [0.0]
    with pytest.raises(ValueError, match="code must be 10 digits"):
        tb.substitution_channel_scores(["1"], ["1"], ["123"], [""])


# ---------------------------------------------------------------------------------------------- evaluation
class FakeModel(torch.nn.Module):
    """Answers prompt q correctly with probability p[q] (1/0 for greedy); otherwise answers '9999'."""

    def __init__(self, tok, answers, p):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.tok, self.answers, self.p = tok, answers, p
        self.calls = []

    def generate(self, input_ids, attention_mask, max_new_tokens, num_return_sequences, do_sample, **kw):
        self.calls.append((do_sample, kw.get("temperature"), self.training))
        rows = []
        for ids in input_ids.tolist():
            prompt = self.tok.decode(ids, skip_special_tokens=True)
            for _ in range(num_return_sequences):
                ok = torch.rand(1).item() < self.p[prompt] if do_sample else self.p[prompt] >= 0.5
                ans = self.answers[prompt] if ok else "9999"
                new = (self.tok(ans)["input_ids"] + [self.tok.eos_token_id])[:max_new_tokens]
                new += [self.tok.pad_token_id] * (max_new_tokens - len(new))
                rows.append(ids + new)
        return torch.tensor(rows)


def test_evaluate_model_on_controlled_fake(tok):
    ds = tb.make_dataset("addition", 40, split="test")
    answers = dict(zip(ds["prompt"], ds["answer"]))
    p = {q: (1.0 if i % 4 == 0 else 0.0) for i, q in enumerate(ds["prompt"])}
    model = FakeModel(tok, answers, p).train()
    res = tb.evaluate_model(model, tok, ds, "addition", batch_size=7)
    assert res.accuracy == pytest.approx(10 / 40)
    assert res.per_prompt_pass_rate == [p[q] for q in ds["prompt"]]
    assert [r["correct"] for r in res.records] == [int(p[q]) for q in ds["prompt"]]
    want_tokens = sum((len(answers[q]) if p[q] else 4) + 1 for q in ds["prompt"])
    assert res.generated_tokens == want_tokens
    assert model.training and model.calls[0] == (False, None, False)  # evaluated in eval mode, mode restored
    rec = res.records[0]
    assert rec["question_id"] == ds[0]["question_id"] and rec["n_samples"] == 1 and rec["completions"] == [ds[0]["answer"]]
    # eos-less output: counted up to max_new_tokens
    res2 = tb.evaluate_model(model, tok, ds.select(range(4)), "addition", max_new_tokens=2)
    assert res2.generated_tokens == 8 and res2.accuracy == 0.0


def test_evaluate_model_sampled_pass_rates_and_majority(tok):
    ds = tb.make_dataset("addition", 30, split="test")
    answers = dict(zip(ds["prompt"], ds["answer"]))
    p = {q: [0.0, 0.3, 1.0][i % 3] for i, q in enumerate(ds["prompt"])}
    model = FakeModel(tok, answers, p)
    res = tb.evaluate_model(model, tok, ds, "addition", greedy=False, num_samples=50, temperature=0.7, seed=4)
    rates = np.array(res.per_prompt_pass_rate)
    want = np.array([p[q] for q in ds["prompt"]])
    assert np.all(rates[want == 0.0] == 0) and np.all(rates[want == 1.0] == 1)
    mid = rates[want == 0.3]
    assert np.all((mid > 0.05) & (mid < 0.6))  # binomial(50, 0.3): far outside is ~impossible
    assert res.accuracy == pytest.approx(rates.mean())
    assert [r["correct"] for r in res.records] == [int(r > 0.5) for r in rates]
    assert all(r["n_samples"] == 50 and len(r["completions"]) == 50 for r in res.records)
    assert model.calls[0][:2] == (True, 0.7)
    again = tb.evaluate_model(model, tok, ds, "addition", greedy=False, num_samples=50, temperature=0.7, seed=4)
    assert again.per_prompt_pass_rate == res.per_prompt_pass_rate  # seeded


def test_evaluate_substitution_records_channels(tok):
    ds = tb.make_dataset("substitution", 30, split="test")
    answers = dict(zip(ds["prompt"], ds["answer"]))
    model = FakeModel(tok, answers, {q: 1.0 for q in ds["prompt"]})
    res = tb.evaluate_model(model, tok, ds, "substitution")
    assert res.accuracy == 1.0
    for rec, row in zip(res.records, ds):
        assert rec["channels"]["hidden"] == [row["n_hidden_slots"]] * 2


def test_evaluate_model_bad_input(tok):
    ds = tb.make_dataset("addition", 3)
    model = FakeModel(tok, {}, {})
    for kwargs, match in [({"num_samples": 2}, "greedy decoding gives identical samples"),
                          ({"num_samples": 0}, "num_samples must be a positive int"),
                          ({"greedy": False, "temperature": 0.0}, "temperature must be"),
                          ({"greedy": False, "temperature": float("nan")}, "temperature must be"),
                          ({"max_new_tokens": 0}, "max_new_tokens"), ({"batch_size": 0}, "batch_size")]:
        with pytest.raises(ValueError, match=match):
            tb.evaluate_model(model, tok, ds, "addition", **kwargs)
    with pytest.raises(ValueError, match="dataset is empty"):
        tb.evaluate_model(model, tok, ds.select([]), "addition")
    with pytest.raises(ValueError, match="lacks column"):
        tb.evaluate_model(model, tok, ds.remove_columns("question_id"), "addition")
    with pytest.raises(ValueError, match="unknown task"):
        tb.evaluate_model(model, tok, ds, "subtraction")


def test_real_tiny_model_evaluation_is_deterministic(tok):
    model = tb.build_tiny_model(tok, seed=0)
    ds = tb.make_dataset("addition", 16, split="test")
    g1 = tb.evaluate_model(model, tok, ds, "addition", max_new_tokens=4)
    g2 = tb.evaluate_model(model, tok, ds, "addition", max_new_tokens=4, batch_size=5)
    assert [r["completions"] for r in g1.records] == [r["completions"] for r in g2.records]  # padding-invariant
    s1 = tb.evaluate_model(model, tok, ds, "addition", greedy=False, num_samples=3, max_new_tokens=4, seed=7)
    s2 = tb.evaluate_model(model, tok, ds, "addition", greedy=False, num_samples=3, max_new_tokens=4, seed=7)
    assert [r["completions"] for r in s1.records] == [r["completions"] for r in s2.records]
    assert all(1 <= r["completion_tokens"] <= 4 for r in s1.records)


def test_outcomes_jsonl_roundtrip_and_validation(tmp_path, tok):
    ds = tb.make_dataset("substitution", 10, split="test")
    answers = dict(zip(ds["prompt"], ds["answer"]))
    res = tb.evaluate_model(FakeModel(tok, answers, {q: 0.5 for q in ds["prompt"]}), tok, ds, "substitution",
                            greedy=False, num_samples=4)
    path = tb.write_outcomes_jsonl(tmp_path / "out.jsonl", res.records)
    back = tb.read_outcomes_jsonl(path)
    assert back == json.loads(json.dumps(res.records))
    lines = open(path).read().splitlines()
    assert len(lines) == 10 and all(set(json.loads(x)) >= {"question_id", "correct", "pass_rate", "n_samples",
                                                            "completion_tokens", "prompt", "answer",
                                                            "completions"} for x in lines)
    good = dict(res.records[0])
    for bad, match in [({**good, "correct": 2}, "'correct' must be 0 or 1"),
                       ({**good, "pass_rate": 1.5}, "pass_rate"),
                       ({k: v for k, v in good.items() if k != "n_samples"}, "lacks key"),
                       ({**good, "n_samples": 0}, "n_samples")]:
        with pytest.raises(ValueError, match=match):
            tb.write_outcomes_jsonl(tmp_path / "bad.jsonl", [bad])
    with pytest.raises(ValueError, match="duplicate question_id"):
        tb.write_outcomes_jsonl(tmp_path / "dup.jsonl", [good, good])
    (tmp_path / "broken.jsonl").write_text(lines[0] + "\n{not json\n")
    with pytest.raises(ValueError, match="broken.jsonl:2: not valid JSON"):
        tb.read_outcomes_jsonl(tmp_path / "broken.jsonl")
    assert not os.path.exists(tmp_path / "bad.jsonl")


# ------------------------------------------------------------------------------------------ warm-up cache

def test_warm_model_cache_built_reused_and_corruption_rebuilt(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext.testbed.warmup import MARKER, META

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh build must not warn about corruption
        path = tb.get_warm_model("addition", seed=0, cache_dir=str(tmp_path), max_steps=2)
    assert path == os.path.join(str(tmp_path), "addition-seed0-steps2-v2")
    assert os.path.exists(os.path.join(path, MARKER))
    meta = json.load(open(os.path.join(path, META)))
    assert meta["task"] == "addition" and meta["seed"] == 0 and meta["steps"] == 2
    assert 0.0 <= meta["test_accuracy_greedy"] <= 1.0
    AutoModelForCausalLM.from_pretrained(path)
    AutoTokenizer.from_pretrained(path)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]  # no leftover temp dirs

    # cached: a second call does not rebuild
    stamp = os.path.getmtime(os.path.join(path, META))
    assert tb.get_warm_model("addition", seed=0, cache_dir=str(tmp_path), max_steps=2) == path
    assert os.path.getmtime(os.path.join(path, META)) == stamp

    # corrupt weights -> warning, rebuilt, intact again
    with open(os.path.join(path, "model.safetensors"), "r+b") as f:
        f.seek(200)
        f.write(b"\x00garbage\x00")
    assert "sha256 mismatch" in tb.validate_cache(path, "addition", 0)
    with pytest.warns(UserWarning, match="corrupt or partial: file model.safetensors changed"):
        assert tb.get_warm_model("addition", seed=0, cache_dir=str(tmp_path), max_steps=2) == path
    assert tb.validate_cache(path, "addition", 0) is None

    # partial write (no marker) -> rebuilt
    os.remove(os.path.join(path, MARKER))
    with pytest.warns(UserWarning, match="no WARMUP_COMPLETE marker"):
        tb.get_warm_model("addition", seed=0, cache_dir=str(tmp_path), max_steps=2)
    assert tb.validate_cache(path, "addition", 0) is None

    # metadata for another seed, or garbage metadata: detected (rebuilding is the same path as above)
    assert "seed=0, expected 1" in tb.validate_cache(path, "addition", 1)
    with open(os.path.join(path, META), "w") as f:
        f.write("{")
    assert "unreadable warmup_meta.json" in tb.validate_cache(path, "addition", 0)


def test_warm_model_env_cache_root_and_bad_input(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXT_CACHE", str(tmp_path / "envroot"))
    assert tb.warm_model_dir("substitution", 2) == str(tmp_path / "envroot" / "substitution-seed2-v2")
    assert tb.warm_model_dir("addition", 0) == str(tmp_path / "envroot" / "addition-seed0-v2")
    with pytest.raises(ValueError, match="unknown task"):
        tb.get_warm_model("division", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="seed"):
        tb.get_warm_model("addition", seed=-1, cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="max_steps"):
        tb.get_warm_model("addition", max_steps=-5, cache_dir=str(tmp_path))


def test_cache_versions_are_per_task_and_checked(tmp_path):
    from trl_ext.testbed import warmup

    # every task has a version; addition v2 checks every 5 steps, the substitution recipe was bumped
    assert set(warmup.CACHE_VERSIONS) == set(tb.TASKS) == set(warmup.EVAL_EVERY) == set(warmup.TEST_QUESTIONS)
    assert warmup.CACHE_VERSIONS["addition"] == 2 and warmup.EVAL_EVERY["addition"] == 5
    assert warmup.CACHE_VERSIONS["substitution"] >= 2
    # a substitution directory written by the old recipe (version 1) is rejected, never used
    path = tmp_path / "substitution-seed0-v1"
    path.mkdir()
    (path / "w.bin").write_bytes(b"x")
    meta = {"task": "substitution", "seed": 0, "version": 1,
            "sha256": {"w.bin": warmup._sha256(str(path / "w.bin"))}}
    (path / warmup.META).write_text(json.dumps(meta))
    (path / warmup.MARKER).write_text("ok\n")
    assert "version=1, expected 2" in tb.validate_cache(str(path), "substitution", 0)
    meta["version"] = warmup.CACHE_VERSIONS["substitution"]
    (path / warmup.META).write_text(json.dumps(meta))
    assert tb.validate_cache(str(path), "substitution", 0) is None


def test_substitution_warmup_data_never_shows_hidden_mappings_or_test_items(tok):
    from trl_ext.testbed.warmup import _batches, _substitution_extra_rows

    extra = _substitution_extra_rows()
    code, hidden = tb.substitution_code(0, 2)
    # exactly the revealed one-digit mappings, each once; no hidden source, no two-digit (test) string
    assert sorted(r["source"] for r in extra) == [d for d in "0123456789" if d not in hidden]
    assert all(len(r["source"]) == 1 and r["answer"] == code[int(r["source"])] for r in extra)
    assert not any(code[int(h)] in r["answer"] for h in hidden for r in extra)
    # the loss mask: labels only on revealed answer slots and <eos>; every hidden slot is -100
    rows = [dict(r) for r in tb.make_dataset("substitution", 70, split="train")] + extra
    ids, att, lab = _batches(tok, rows, "substitution", hidden_mask=True)
    n_hidden_labels = 0
    for i, r in enumerate(rows):
        n = int(att[i].sum())
        p_len = len(r["prompt"])
        assert (lab[i, :p_len] == -100).all() and (lab[i, n:] == -100).all()
        for j, s in enumerate(r["source"]):
            want = -100 if s in r["hidden_digits"] else tok.convert_tokens_to_ids(r["answer"][j])
            assert int(lab[i, p_len + j]) == want
            n_hidden_labels += s in r["hidden_digits"]
        assert int(lab[i, p_len + len(r["source"])]) == tok.eos_token_id
    assert n_hidden_labels == sum(r["n_hidden_slots"] for r in rows) > 0  # hidden slots existed and were masked
    # without the mask (addition path) the answer tokens are all labelled
    _, _, lab_all = _batches(tok, rows[:5], "substitution", hidden_mask=False)
    assert int((lab_all != -100).sum()) == sum(len(r["answer"]) + 1 for r in rows[:5])


def test_cli_task_names_match_registry():
    from trl_ext.testbed import cli

    assert sorted(cli.TASK_NAMES) == sorted(tb.TASKS)


@pytest.mark.slow
@pytest.mark.parametrize(("task", "seed"), [("addition", 0), ("substitution", 0), ("substitution", 1),
                                            ("substitution", 2), ("scratchpad", 0)])
def test_default_warm_model_lands_in_band(tmp_path, task, seed):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither a corrupt-cache nor an out-of-band warning
        path = tb.get_warm_model(task, seed=seed, cache_dir=str(tmp_path))
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    from trl_ext.testbed.warmup import TEST_QUESTIONS

    n = TEST_QUESTIONS[task]
    res = tb.evaluate_model(model, tok, tb.make_dataset(task, n, split="test"), task,
                            max_new_tokens=tb.TASKS[task].max_answer_chars() + 1)
    assert 0.3 <= res.accuracy <= 0.6
    assert json.load(open(os.path.join(path, "warmup_meta.json")))["test_accuracy_greedy"] == res.accuracy
    if task == "substitution":
        # the accuracy comes from the revealed channel; the hidden mappings were never taught (loss-masked), so
        # hidden slots stay at or below uniform-guess level (1 in 10), leaving RL the hidden channel to learn
        hid = [sum(r["channels"]["hidden"][k] for r in res.records) for k in (0, 1)]
        rev = [sum(r["channels"]["revealed"][k] for r in res.records) for k in (0, 1)]
        assert hid[1] > 0 and hid[0] <= 0.1 * hid[1] + 1
        assert rev[0] / rev[1] > 0.6


@pytest.mark.slow
def test_quickstart_smoke_writes_outputs(tmp_path):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "qs"
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "testbed", "quickstart.py"), "--output_dir", str(out),
         "--max_steps", "4", "--warmup_max_steps", "2", "--n_eval", "16", "--eval_samples", "2", "--eval_points", "2",
         "--cache_dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["accuracy_before"]) == {"greedy", "sampled"} == set(summary["accuracy_after"])
    assert summary["generated_tokens"]["train_completion_tokens"] > 0
    assert [p["step"] for p in summary["curve"]] == [0, 2, 4]
    assert (out / "accuracy_vs_tokens.png").read_bytes()[:4] == b"\x89PNG"
    state = json.loads((out / "trainer_state.json").read_text())
    assert sum("loss" in h for h in state["log_history"]) == 4
    assert len(tb.read_outcomes_jsonl(out / "outcomes_after_greedy.jsonl")) == 16


@pytest.mark.slow
def test_default_quickstart_lands_in_the_readme_band(tmp_path):
    """The README's quickstart numbers (empty cache, defaults): held-out greedy 0.435 -> 0.710 on the measuring machine;
    the documented band is 0.30-0.60 before (the warm-up band) and 0.60-0.82 after, ~67k training tokens."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "qs"
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "testbed", "quickstart.py"), "--output_dir", str(out),
         "--cache_dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert 0.30 <= summary["accuracy_before"]["greedy"] <= 0.60
    assert 0.60 <= summary["accuracy_after"]["greedy"] <= 0.82
    assert 60_000 <= summary["generated_tokens"]["train_completion_tokens"] <= 75_000
