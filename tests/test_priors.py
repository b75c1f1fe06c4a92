"""Tests for trl_ext.priors: interface validation, the in-context embedding prior and its heads, the table prior
and its file format, the callable prior, and the factory."""

import importlib.machinery
import json
import sys
import types
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_ext.priors import (
    PRIOR_KINDS,
    CallablePrior,
    ConstantPrior,
    EmbeddingInContextPrior,
    KernelHead,
    LogisticHead,
    PriorOutputError,
    TablePrior,
    ValueTable,
    ValueTableRow,
    ValueTableWriter,
    build_prior,
    hf_mean_pool_embedder,
    jeffreys_mean,
    load_value_table,
    model_footprint,
    prompt_key,
    save_value_table,
    to_probability,
    to_value,
    validate_probabilities,
)

# ----------------------------------------------------------------------------------------------- helpers


class DictEmbedder:
    """embed_fn over a fixed prompt -> vector dict, counting calls and texts."""

    def __init__(self, table):
        self.table = table
        self.calls = []

    def __call__(self, texts):
        self.calls.append(list(texts))
        return np.stack([self.table[t] for t in texts])


def planted_clusters(n_ctx=240, n_tgt=120, d=16, rates=(0.15, 0.8), seed=0, sep=3.0):
    """Prompts in two embedding clusters with different success rates."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(2, d)) * sep

    def make(n, tag):
        c = rng.integers(0, 2, n)
        X = centers[c] + rng.normal(size=(n, d))
        return [f"{tag}{i}" for i in range(n)], X, c

    P, X, c = make(n_ctx, "ctx")
    T, XT, cT = make(n_tgt, "tgt")
    y = (rng.random(n_ctx) < np.asarray(rates)[c]).astype(float)
    emb = DictEmbedder({**dict(zip(P, X)), **dict(zip(T, XT))})
    return emb, P, y, T, cT


def logistic_world(n, w, seed):
    """Embeddings with true success probability sigmoid(x.w); returns prompts, X, p_true, outcomes."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, w.size))
    p = 1.0 / (1.0 + np.exp(-(X @ w)))
    y = (rng.random(n) < p).astype(float)
    return [f"w{seed}-{i}" for i in range(n)], X, p, y


# ----------------------------------------------------------------------------------------------- interface


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_to_value_round_trip(ps):
    v = to_value(ps)
    assert np.all((v >= -1) & (v <= 1))
    np.testing.assert_allclose(to_probability(v), ps, atol=1e-12)
    np.testing.assert_allclose(v, 2 * np.asarray(ps) - 1)


@pytest.mark.parametrize("bad", [[0.5, float("nan")], [1.2], [-0.1], [float("inf")]])
def test_to_value_rejects_non_probabilities(bad):
    with pytest.raises(ValueError):
        to_value(bad)


def test_validate_probabilities():
    np.testing.assert_array_equal(validate_probabilities([[0.2], [0.4]], 2), [0.2, 0.4])  # (n, 1) flattened
    np.testing.assert_array_equal(validate_probabilities([1 + 1e-12, -1e-12], 2), [1.0, 0.0])  # round-off clipped
    with pytest.raises(PriorOutputError, match="MyPrior returned shape"):
        validate_probabilities([0.1, 0.2], 3, who="MyPrior")
    with pytest.raises(PriorOutputError, match="NaN/inf probabilities at target positions \\[1\\]"):
        validate_probabilities([0.1, np.nan], 2, who="MyPrior")
    with pytest.raises(PriorOutputError, match="not values in \\[-1, 1\\] or logits"):
        validate_probabilities([-0.5, 0.5], 2)
    with pytest.raises(PriorOutputError, match="not a numeric array"):
        validate_probabilities(["a", "b"], 2)


@pytest.mark.parametrize(
    "out, match",
    [([0.5, float("nan")], "CallablePrior\\(bad\\) returned NaN"), ([0.5, 1.5], "outside \\[0, 1\\]"),
     ([0.5], "shape")],
)
def test_callable_prior_output_errors_name_the_prior(out, match):
    def bad(t, c, y):
        return out

    with pytest.raises(PriorOutputError, match=match):
        CallablePrior(bad).predict(["a", "b"])


def test_callable_prior_passes_arguments_and_accepts_tensors():
    import torch

    seen = {}

    def fn(targets, ctx, outcomes):
        seen.update(targets=targets, ctx=ctx, outcomes=outcomes)
        return torch.tensor([0.25] * len(targets))

    prior = CallablePrior(fn, name="mine")
    p = prior.predict(["t1", "t2"], ["c1"], [1.0])
    np.testing.assert_array_equal(p, [0.25, 0.25])
    assert seen["targets"] == ["t1", "t2"] and seen["ctx"] == ["c1"] and seen["outcomes"].tolist() == [1.0]
    np.testing.assert_array_equal(prior.predict_values(["t1"], ["c1"], [1.0]), [-0.5])
    assert prior.predict([]).shape == (0,)


def test_callable_prior_empty_context_fallback():
    calls = []
    prior = CallablePrior(lambda t, c, y: calls.append(1) or [0.9] * len(t), empty_context_probability=0.3)
    np.testing.assert_array_equal(prior.predict(["a", "b"]), [0.3, 0.3])
    assert calls == []
    np.testing.assert_array_equal(prior.predict(["a"], ["c"], [0.0]), [0.9])


def test_from_v0_uses_v0_argument_order_and_binary_labels():
    class FakeV0:
        def predict(self, context_prompts, context_labels, target_prompts):
            self.args = (context_prompts, context_labels, target_prompts)
            return [0.1 * (i + 1) for i in range(len(target_prompts))]

    v0 = FakeV0()
    prior = CallablePrior.from_v0(v0)
    conv = [{"role": "user", "content": "2+2="}]
    p = prior.predict(["t", conv], ["c1", "c2", "c3"], [0.49, 0.5, 1.0])
    np.testing.assert_allclose(p, [0.1, 0.2])
    assert v0.args == (["c1", "c2", "c3"], [0, 1, 1], ["t", "user: 2+2="])
    np.testing.assert_array_equal(prior.predict(["t"]), [0.5])  # V0 cannot run on an empty context


@pytest.mark.parametrize(
    "ctx, y, match",
    [(["a", "b"], [1.0], "2 context prompts but 1"), (["a"], [np.nan], "NaN"), (["a"], [2.0], "map rewards first")],
)
def test_context_validation(ctx, y, match):
    with pytest.raises(ValueError, match=match):
        ConstantPrior().predict(["t"], ctx, y)
    with pytest.raises(TypeError, match="single string"):
        ConstantPrior().predict("t")


def test_constant_prior():
    np.testing.assert_array_equal(ConstantPrior(0.25).predict(["a", "b"]), [0.25, 0.25])
    p = ConstantPrior(0.5, use_context_mean=True)
    np.testing.assert_array_equal(p.predict(["a"], ["x", "y"], [1.0, 0.0]), [0.5])
    np.testing.assert_array_equal(p.predict(["a"], ["x", "y"], [1.0, 1.0]), [1.0])
    with pytest.raises(ValueError, match="probability"):
        ConstantPrior(1.5)
    # numpy scalars are probabilities too (np.float32 used to be rejected as "not in [0, 1]"); bools are not
    np.testing.assert_array_equal(ConstantPrior(np.float32(0.25)).predict(["a"]), [0.25])
    with pytest.raises(ValueError, match="probability"):
        ConstantPrior(True)


# ----------------------------------------------------------------------------------------------- in-context heads


@pytest.mark.parametrize("head", ["kernel", "logistic"])
def test_head_recovers_planted_clusters(head):
    emb, P, y, T, cT = planted_clusters()
    prior = EmbeddingInContextPrior(emb, head=head)
    p = prior.predict(T, P, y)
    lo, hi = p[cT == 0].mean(), p[cT == 1].mean()
    assert abs(lo - 0.15) < 0.12 and abs(hi - 0.8) < 0.12, (lo, hi)
    assert p[cT == 1].min() > p[cT == 0].max() - 0.2  # the clusters separate
    assert prior.last_info["mode"] == "head" and prior.last_info["n_context"] == len(P)


@pytest.mark.parametrize("kernel", ["cosine", "rbf"])
def test_kernel_variants_separate_clusters(kernel):
    emb, P, y, T, cT = planted_clusters(seed=1)
    p = EmbeddingInContextPrior(emb, head="kernel", head_kwargs={"kernel": kernel}).predict(T, P, y)
    assert p[cT == 1].mean() - p[cT == 0].mean() > 0.45


@pytest.mark.parametrize("head", ["kernel", "logistic"])
def test_calibration_on_held_out_data(head):
    """Predicted vs empirical success on held-out prompts: reliability bins agree, Brier beats the base rate."""
    w = np.random.default_rng(0).normal(size=8)
    w *= 2.25 / np.linalg.norm(w)
    Pc, Xc, _, yc = logistic_world(256, w, seed=3)
    Pt, Xt, pt, yt = logistic_world(2000, w, seed=4)
    emb = DictEmbedder({**dict(zip(Pc, Xc)), **dict(zip(Pt, Xt))})
    p = EmbeddingInContextPrior(emb, head=head).predict(Pt, Pc, yc)
    brier, base = np.mean((p - yt) ** 2), np.mean((yc.mean() - yt) ** 2)
    assert brier < base - 0.02, (brier, base)
    assert np.corrcoef(p, pt)[0, 1] > 0.7
    edges = np.quantile(p, [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (p >= lo) & (p <= hi)
        assert abs(p[sel].mean() - yt[sel].mean()) < 0.12, (lo, hi, p[sel].mean(), yt[sel].mean())


@pytest.mark.parametrize("head", ["kernel", "logistic"])
def test_no_signal_context_shrinks_to_context_mean(head):
    rng = np.random.default_rng(0)
    P = [f"c{i}" for i in range(200)]
    T = [f"t{i}" for i in range(50)]
    emb = DictEmbedder({p: rng.normal(size=12) for p in P + T})
    y = (rng.random(200) < 0.3).astype(float)  # outcomes independent of embeddings
    p = EmbeddingInContextPrior(emb, head=head).predict(T, P, y)
    assert abs(p.mean() - y.mean()) < 0.06 and p.std() < 0.08, (p.mean(), y.mean(), p.std())


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(4, 40),
    m=st.integers(1, 10),
    d=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    head=st.sampled_from(["kernel", "logistic"]),
    soft=st.booleans(),
)
def test_heads_return_probabilities_for_any_context(n, m, d, seed, head, soft):
    rng = np.random.default_rng(seed)
    Xc, Xt = rng.normal(size=(n, d)), rng.normal(size=(m, d))
    y = rng.random(n) if soft else rng.integers(0, 2, n).astype(float)
    y[0], y[1] = 0.0, 1.0  # non-degenerate
    h = KernelHead() if head == "kernel" else LogisticHead(n_folds=3)
    p = h.fit_predict(Xc, y, Xt)
    assert p.shape == (m,) and np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))


def test_duplicate_embeddings_and_extreme_bandwidth_are_finite():
    Xc = np.ones((6, 3))  # all context points identical
    y = np.array([0, 1, 0, 1, 1, 0], float)
    for kernel in ("cosine", "rbf"):
        p = KernelHead(kernel=kernel, bandwidths=(1e-3,)).fit_predict(Xc, y, np.array([[1.0, 1, 1], [-5.0, 2, 0]]))
        assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))


def test_kernel_head_shrinkage_formula():
    """With fixed bandwidth and strength the prediction is the Beta-shrunk kernel average, exactly."""
    Xc = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [-1.0, 0.0]])
    y = np.array([1.0, 0.0, 1.0, 0.0])
    Xt = np.array([[0.9, 0.05]])
    h = KernelHead(kernel="cosine", bandwidths=(0.5,), strengths=(2.0,), center=False)
    p = h.fit_predict(Xc, y, Xt)
    cos = (Xc / np.linalg.norm(Xc, axis=1, keepdims=True)) @ (Xt[0] / np.linalg.norm(Xt[0]))
    w = np.exp((cos - 1) / 0.5)
    m = (y.sum() + 0.5) / (4 + 1)
    np.testing.assert_allclose(p, [(w @ y + 2.0 * m) / (w.sum() + 2.0)])
    inf = KernelHead(bandwidths=(0.5,), strengths=(float("inf"),)).fit_predict(Xc, y, Xt)
    np.testing.assert_allclose(inf, [m])


def test_head_config_errors():
    with pytest.raises(ValueError, match="kernel must be"):
        KernelHead(kernel="poly")
    with pytest.raises(ValueError, match="bandwidths must be > 0"):
        KernelHead(bandwidths=(0.0,))
    with pytest.raises(ValueError, match="grid is empty"):
        KernelHead(strengths=())
    with pytest.raises(ValueError, match="l2 values"):
        LogisticHead(l2_grid=(0.0,))
    with pytest.raises(ValueError, match="n_folds"):
        LogisticHead(n_folds=1)
    # numpy grids (np.float32 values were rejected as "not finite, >= 0"); bools are not grid values
    assert KernelHead(bandwidths=np.array([0.1, 0.5], dtype=np.float32)).bandwidths == pytest.approx((0.1, 0.5))
    with pytest.raises(ValueError, match="grid values"):
        LogisticHead(l2_grid=(True,))


# ----------------------------------------------------------------------------------------------- embedding prior


def test_empty_context_fallback_is_configurable_and_skips_embedding():
    emb = DictEmbedder({})
    np.testing.assert_array_equal(EmbeddingInContextPrior(emb).predict(["a", "b"]), [0.5, 0.5])
    prior = EmbeddingInContextPrior(emb, empty_context_probability=0.2)
    np.testing.assert_array_equal(prior.predict(["a"], [], []), [0.2])
    assert emb.calls == [] and prior.last_info["mode"] == "empty"


@pytest.mark.parametrize("y", [[1.0] * 10, [0.0] * 10, [0.4] * 10, [1.0, 0.0, 1.0]])
def test_degenerate_or_tiny_context_gives_jeffreys_mean(y):
    emb = DictEmbedder({})
    prior = EmbeddingInContextPrior(emb, min_context=4)
    ctx = [f"c{i}" for i in range(len(y))]
    p = prior.predict(["t1", "t2"], ctx, y)
    expect = (sum(y) + 0.5) / (len(y) + 1)
    np.testing.assert_allclose(p, [expect, expect])
    assert 0 < expect < 1 and emb.calls == [] and prior.last_info["mode"] == "degenerate"
    assert jeffreys_mean(np.asarray(y)) == pytest.approx(expect)


def test_embedding_cache_is_lru_bounded_and_dedupes():
    rng = np.random.default_rng(0)
    vecs = {f"p{i}": rng.normal(size=4) for i in range(10)}
    emb = DictEmbedder(vecs)
    prior = EmbeddingInContextPrior(emb, cache_size=3)
    E = prior.embed(["p0", "p1", "p0"])
    assert emb.calls == [["p0", "p1"]] and np.array_equal(E[0], E[2])
    prior.embed(["p0", "p2"])  # p0 hit; p2 miss -> cache {p1, p0, p2}
    assert emb.calls[-1] == ["p2"] and prior.cache_hits == 1
    prior.embed(["p3"])  # evicts p1 (least recently used)
    prior.embed(["p1", "p0"])
    assert emb.calls[-1] == ["p1"]
    np.testing.assert_array_equal(prior.embed(["p5"])[0], vecs["p5"])
    uncached = EmbeddingInContextPrior(emb, cache_size=0)
    uncached.embed(["p0"])
    uncached.embed(["p0"])
    assert emb.calls[-2:] == [["p0"], ["p0"]]


def test_conversation_prompts_are_rendered_for_the_embedder():
    conv = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}]
    emb = DictEmbedder({"system: be brief\nuser: 1+1=": np.ones(3)})
    E = EmbeddingInContextPrior(emb).embed([conv])
    assert E.shape == (1, 3)


@pytest.mark.parametrize(
    "out, match", [(np.full((2, 3), np.nan), "NaN/inf embeddings"), (np.ones(3), "returned shape")]
)
def test_bad_embeddings_raise(out, match):
    prior = EmbeddingInContextPrior(lambda texts: out)
    with pytest.raises(ValueError, match=match):
        prior.embed(["a", "b"])


def test_embedding_dimension_change_raises():
    dims = iter([3, 4])
    prior = EmbeddingInContextPrior(lambda texts: np.ones((len(texts), next(dims))))
    prior.embed(["a"])
    with pytest.raises(ValueError, match="dimension 4"):
        prior.embed(["b"])


def test_embedding_prior_config_errors():
    with pytest.raises(ValueError, match="head must be one of"):
        EmbeddingInContextPrior(lambda t: None, head="svm")
    with pytest.raises(TypeError, match="embed_fn must be callable"):
        EmbeddingInContextPrior("not callable")
    with pytest.raises(ValueError, match="min_context"):
        EmbeddingInContextPrior(lambda t: None, min_context=1)
    with pytest.raises(ValueError, match="empty_context_probability"):
        EmbeddingInContextPrior(lambda t: None, empty_context_probability=2.0)


def test_tabpfn_head_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "tabpfn", None)  # makes find_spec raise/return None -> not importable
    with pytest.raises((ImportError, ValueError), match="tabpfn"):
        EmbeddingInContextPrior(lambda t: None, head="tabpfn", tabpfn_model_path="/nonexistent")


def _fake_tabpfn(monkeypatch):
    created = []

    class FakeClassifier:
        def __init__(self, model_path, device, **kw):
            created.append((model_path, device, kw))

        def fit(self, X, y):
            self.classes_ = np.unique(y)
            self.y = y
            assert set(np.unique(y)) <= {0, 1}
            return self

        def predict_proba(self, X):
            p1 = np.full(len(X), self.y.mean())
            return np.stack([1 - p1, p1], axis=1)

    mod = types.ModuleType("tabpfn")
    mod.__spec__ = importlib.machinery.ModuleSpec("tabpfn", None)
    mod.TabPFNClassifier = FakeClassifier
    monkeypatch.setitem(sys.modules, "tabpfn", mod)
    return created


def test_tabpfn_head_never_downloads(monkeypatch, tmp_path):
    _fake_tabpfn(monkeypatch)
    monkeypatch.delenv("TRL_EXT_TABPFN_MODEL_PATH", raising=False)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        EmbeddingInContextPrior(lambda t: None, head="tabpfn")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        EmbeddingInContextPrior(lambda t: None, head="tabpfn", tabpfn_model_path=str(tmp_path / "missing.ckpt"))


def test_tabpfn_head_wiring_with_local_checkpoint(monkeypatch, tmp_path):
    created = _fake_tabpfn(monkeypatch)
    ckpt = tmp_path / "tabpfn.ckpt"
    ckpt.write_bytes(b"weights")
    emb, P, y, T, _ = planted_clusters(n_ctx=40, n_tgt=5, d=64)
    soft = np.clip(y * 0.8 + 0.1, 0, 1)  # soft outcomes binarized at 0.5 -> y
    prior = EmbeddingInContextPrior(emb, head="tabpfn", tabpfn_model_path=str(ckpt), head_kwargs={"n_components": 8})
    p = prior.predict(T, P, soft)
    np.testing.assert_allclose(p, np.full(5, y.mean()))
    assert created[0][0] == str(ckpt) and prior.last_info["n_features"] == 8
    monkeypatch.setenv("TRL_EXT_TABPFN_MODEL_PATH", str(ckpt))
    p2 = EmbeddingInContextPrior(emb, head="tabpfn").predict(T, P, np.where(soft > 0.5, 0.4, 0.1))  # one class
    np.testing.assert_allclose(p2, jeffreys_mean(np.where(soft > 0.5, 0.4, 0.1)))


# ----------------------------------------------------------------------------------------------- HF embedder


def _tiny_lm():
    import torch

    torch.manual_seed(0)
    try:
        from trl_ext.testbed import build_tiny_model, build_tokenizer

        tok = build_tokenizer()
        return build_tiny_model(tok, seed=0), tok
    except Exception:  # the testbed is written concurrently: fall back to a throwaway tiny Llama
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

        vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", "<unk>", *"0123456789+="])}
        tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
        tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
        cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
        return LlamaForCausalLM(cfg), tok


def test_hf_mean_pool_embedder_on_tiny_model():
    import torch

    torch.set_num_threads(1)
    model, tok = _tiny_lm()
    embed = hf_mean_pool_embedder(model, tok, batch_size=2, max_length=8)
    assert all(p.requires_grad for p in model.parameters())  # the original is untouched (a frozen copy is used)
    assert embed.backbone["copied"] and embed.backbone["bytes"] == model_footprint(model)["bytes"]
    texts = ["1+2=", "12+34=", "5=", "99+1="]
    E = embed(texts)
    hidden = model.config.hidden_size
    assert E.shape == (4, hidden) and E.dtype == np.float32 and np.all(np.isfinite(E))
    # padding does not leak: each text alone gives the same vector as in a padded batch
    for i, t in enumerate(texts):
        np.testing.assert_allclose(embed([t])[0], E[i], atol=1e-5)
    # it is the masked mean of the last hidden states
    ids = tok(["12+34="], add_special_tokens=True)["input_ids"]
    with torch.no_grad():
        hs = model(input_ids=torch.tensor(ids), output_hidden_states=True).hidden_states[-1]
    np.testing.assert_allclose(E[1], hs[0].mean(0).numpy(), atol=1e-5)
    # truncation to max_length: the first 8 tokens only
    long = "1234567890+1234567890="
    np.testing.assert_allclose(embed([long])[0], embed([long[:8]])[0], atol=1e-5)
    assert not np.allclose(E[0], E[1])
    with pytest.raises(ValueError, match="zero tokens"):
        embed([""])
    # end to end through the prior
    ctx = ["1+1=", "2+2=", "3+3=", "44+55=", "66+77=", "88+99="]
    p = EmbeddingInContextPrior(embed).predict(["5+5=", "77+88="], ctx, [1, 1, 1, 0, 0, 0])
    assert p.shape == (2,) and np.all((p >= 0) & (p <= 1))


def _wider_lm(tok, hidden=128):
    """A random Llama wide enough for BLAS blocking to matter (the batch-invariance checks)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("batch_size", [1, 3, 32])
@pytest.mark.parametrize("wide", [False, True])
def test_embeddings_are_bitwise_batch_invariant(batch_size, wide):
    """A prompt's embedding does not depend on the batch it is computed in: the same bits whatever the other prompts
    (lengths, count, order, duplicates) and its position, as when it is embedded alone. This is what makes V0.5
    bit-identical after a resume (empty cache, other batches) and across process counts."""
    import torch

    torch.set_num_threads(2)
    model, tok = _tiny_lm()
    if wide:
        model = _wider_lm(tok)
    texts = ["1+2=", "12+34=", "5=", "99+1=", "123+456=", "7+8=", "31+4159=", "2+71828=", "0=", "66+6="]
    embed = hf_mean_pool_embedder(model, tok, batch_size=batch_size, max_length=16, pad_to_multiple_of=8)
    alone = np.stack([embed([t])[0] for t in texts])
    rng = np.random.default_rng(0)
    for _ in range(8):
        idx = rng.choice(len(texts), size=int(rng.integers(2, 25)), replace=True)
        np.testing.assert_array_equal(embed([texts[i] for i in idx]), alone[idx])
    np.testing.assert_array_equal(embed(texts[::-1]), alone[::-1])
    # through the prior's cache: a cleared cache re-embeds in other batches and gets the same bits
    prior = EmbeddingInContextPrior(embed)
    first = prior.embed(texts[:4])
    prior.clear_cache()
    np.testing.assert_array_equal(prior.embed(texts[2:] + texts[:2])[-2:], first[:2])


def test_frozen_copy_ignores_forward_patches_that_call_the_original():
    """A deep copy of a model whose ``forward`` was patched on the instance with a closure over the original's bound
    forward (TRL 1.16's fused LM head does exactly this) would run the *original* model. The embedder drops such
    patches from its copy, so the copy stays the frozen starting model while the original trains."""
    import torch

    torch.set_num_threads(1)
    model, tok = _tiny_lm()
    original_forward = model.forward

    def patched(self, *args, fused=False, **kwargs):  # the shape of trl's add_fused_lm_head patch
        return original_forward(*args, **kwargs)

    model.forward = types.MethodType(patched, model)
    embed = hf_mean_pool_embedder(model, tok, batch_size=2)
    copy_ = embed.backbone["model"]
    assert embed.backbone["copied"] and copy_ is not model and "forward" not in copy_.__dict__
    assert "forward" in model.__dict__  # the original keeps its patch
    texts = ["1+2=", "12+34="]
    before = embed(texts)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    np.testing.assert_array_equal(embed(texts), before)
    assert embed.backbone["parameters"] == model_footprint(model)["parameters"] > 0


def test_embedder_without_copy_leaves_the_model_as_it_was():
    """``copy=False``: no new weights, parameters keep ``requires_grad``, every module's training flag is restored
    after each call, and ``context`` is entered around every forward (e.g. a PEFT model's ``disable_adapter``)."""
    import contextlib

    import torch

    torch.set_num_threads(1)
    model, tok = _tiny_lm()
    model.train()
    model.model.layers[0].eval()  # a submodule in another mode than its parent
    flags = {n: m.training for n, m in model.named_modules()}
    entered = []

    @contextlib.contextmanager
    def ctx():
        entered.append(model.training)
        yield

    embed = hf_mean_pool_embedder(model, tok, batch_size=2, copy=False, context=ctx)
    assert embed.backbone == {"model": model, "copied": False, "parameters": 0, "bytes": 0}
    E = embed(["1+2=", "12+34=", "5="])  # two widths x chunks of 2 -> 2 forwards
    assert entered == [False, False]  # eval mode inside the forwards
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert all(p.requires_grad for p in model.parameters())
    copy_embed = hf_mean_pool_embedder(model, tok, batch_size=2)
    np.testing.assert_array_equal(copy_embed(["1+2=", "12+34=", "5="]), E)


def test_model_footprint_counts_shared_storage_once():
    import torch

    lin = torch.nn.Linear(4, 3)
    assert model_footprint(lin) == {"parameters": 15, "bytes": 60}
    shared = torch.nn.ModuleList([lin, torch.nn.Linear(4, 3)])
    shared[1].weight = lin.weight  # tied: one storage
    assert model_footprint(shared) == {"parameters": 15 + 3, "bytes": (15 + 3) * 4}
    bn = torch.nn.BatchNorm1d(2)  # 4 parameters + running stats (2 + 2 floats) + num_batches_tracked (1 int64)
    assert model_footprint(bn) == {"parameters": 4, "bytes": 4 * 4 + 4 * 4 + 8}


# ----------------------------------------------------------------------------------------------- table format


def test_prompt_key_properties():
    assert prompt_key("1+1=") == prompt_key("1+1=") and len(prompt_key("1+1=")) == 16
    assert prompt_key("1+1=") != prompt_key("1+2=")
    conv_a = [{"role": "user", "content": "1+1="}]
    conv_b = [{"content": "1+1=", "role": "user"}]
    assert prompt_key(conv_a) == prompt_key(conv_b)  # key order inside a message is irrelevant
    assert prompt_key(conv_a) != prompt_key("1+1=")
    assert prompt_key(conv_a) != prompt_key([*conv_a, {"role": "assistant", "content": ""}])
    assert len(prompt_key("x", 32)) == 32 and prompt_key("x", 32).startswith(prompt_key("x"))
    with pytest.raises(TypeError):
        prompt_key(123)
    with pytest.raises(ValueError):
        prompt_key("x", 4)


def _table():
    rows = [
        ValueTableRow.from_rewards("1+1=", [1, 1, 0, 1], (0.0, 1.0), question_id=7),
        ValueTableRow.from_rewards([{"role": "user", "content": "2+2="}], [-1, 1], (-1.0, 1.0)),
        ValueTableRow.from_rewards("partial", [0.25, 0.5], (0.0, 1.0), extra={"source": "test"}),
        ValueTableRow(prompt_key="0123456789abcdef", n=16, mean_reward=0.5, reward_range=(0.0, 1.0)),  # no rewards
    ]
    return ValueTable(rows, metadata={"model": "tiny", "seed": 3, "reward_funcs": ["exact_match"]})


def test_value_table_round_trip(tmp_path):
    t = _table()
    path = tmp_path / "values.jsonl"
    save_value_table(path, t)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "trl_ext.value_table" and header["version"] == 1
    assert header["metadata"]["model"] == "tiny" and "created" in header["metadata"]
    assert len(lines) == 5
    loaded = load_value_table(path)
    assert loaded.keys() == t.keys()
    for a in t:
        b = loaded.get(a.prompt_key)
        assert b.to_json() == a.to_json()
    assert loaded.get(prompt_key("1+1=")).question_id == 7
    assert loaded.is_binary is False  # the "partial" row is not binary


@settings(max_examples=30, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.text(min_size=1, max_size=20), st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=8)),
        min_size=1, max_size=10, unique_by=lambda r: r[0],
    )
)
def test_value_table_round_trip_property(tmp_path_factory, rows):
    t = ValueTable([ValueTableRow.from_rewards(p, r, (0.0, 1.0)) for p, r in rows], metadata={"seed": 0})
    path = tmp_path_factory.mktemp("vt") / "t.jsonl"
    save_value_table(path, t)
    loaded = load_value_table(path)
    prior = TablePrior(loaded)
    np.testing.assert_allclose(prior.predict([p for p, _ in rows]), [np.mean(r) for _, r in rows])
    assert loaded.is_binary is True


def test_success_probability_mapping():
    assert ValueTableRow.from_rewards("a", [-1, 1, 1, 1], (-1.0, 1.0)).success_probability == pytest.approx(0.75)
    assert ValueTableRow.from_rewards("a", [0.2, 0.4], (0.0, 2.0)).success_probability == pytest.approx(0.15)
    assert ValueTableRow.from_rewards("a", [1, 1], (0.0, 1.0)).is_binary is True


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"n": 0}, "n must be an int >= 1"),
        ({"rewards": [1.0, 0.0]}, "n=4 but 2 rewards"),
        ({"mean_reward": 0.1}, "!= mean\\(rewards\\)"),
        ({"rewards": [1.0, 0.0, 2.0, 1.0], "mean_reward": 1.0}, "outside reward_range"),
        ({"rewards": [1.0, None, 0.0, 1.0]}, "finite numbers"),
        ({"reward_range": (1.0, 0.0)}, "low < high"),
        ({"mean_reward": float("nan"), "rewards": None}, "finite number"),
        ({"prompt_key": ""}, "non-empty"),
    ],
)
def test_invalid_rows(fields, match):
    base = {"prompt_key": "k", "n": 4, "mean_reward": 0.75, "reward_range": (0.0, 1.0), "rewards": [1.0, 1.0, 0.0, 1.0]}
    base.update(fields)
    with pytest.raises(ValueError, match=match):
        ValueTableRow(**base)


def test_corrupt_and_truncated_files(tmp_path):
    path = tmp_path / "t.jsonl"
    save_value_table(path, _table())
    text = path.read_text()
    trunc = tmp_path / "trunc.jsonl"
    trunc.write_text(text + '{"prompt_key": "abc", "n": 3, "mea')
    with pytest.raises(ValueError, match="line 6 is not valid JSON \\(an interrupted write"):
        load_value_table(trunc)
    with pytest.warns(UserWarning, match="truncated"):
        t = load_value_table(trunc, allow_truncated_tail=True)
    assert len(t) == 4 and t.metadata["n_truncated_lines"] == 1
    lines = text.splitlines()
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="line 2 is not valid JSON"):
        load_value_table(corrupt, allow_truncated_tail=True)  # only a *last* line may be skipped
    dup = tmp_path / "dup.jsonl"
    dup.write_text("\n".join([*lines, lines[1]]) + "\n")
    with pytest.raises(ValueError, match="line 6: value table: duplicate prompt_key"):
        load_value_table(dup)
    bad_row = tmp_path / "badrow.jsonl"
    bad_row.write_text(lines[0] + '\n{"prompt_key": "k", "n": 2, "mean_reward": 0.5, "reward_range": [0, 1], '
                       '"rewards": [1.0, 1.0]}\n')
    with pytest.raises(ValueError, match="line 2: value table row k: mean_reward"):
        load_value_table(bad_row)
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(lines[0] + '\n{"prompt_key": "k", "n": 1, "mean_reward": 1, "reward_range": [0, 1], "x": 1}\n')
    with pytest.raises(ValueError, match="unknown fields \\['x'\\]"):
        load_value_table(unknown)
    for content, match in [("", "empty file"), ('{"a": 1}\n', "not a value-table header"),
                           ('{"format": "trl_ext.value_table", "version": 9}\n', "version 9")]:
        f = tmp_path / "h.jsonl"
        f.write_text(content)
        with pytest.raises(ValueError, match=match):
            load_value_table(f)
    with pytest.raises(FileNotFoundError):
        load_value_table(tmp_path / "nope.jsonl")


def test_writer_resumes_and_repairs_tail(tmp_path):
    path = tmp_path / "w.jsonl"
    md = {"model": "tiny", "seed": 0, "reward_funcs": ["exact_match"]}
    with ValueTableWriter(path, md) as w:
        w.write(ValueTableRow.from_rewards("a", [1, 0], (0.0, 1.0)))
        with pytest.raises(ValueError, match="already in the table"):
            w.write(ValueTableRow.from_rewards("a", [1, 0], (0.0, 1.0)))
    with open(path, "a") as f:
        f.write('{"prompt_key": "half')  # interrupted write
    with pytest.warns(UserWarning, match="truncated"):
        w = ValueTableWriter(path, md)
    assert w.done_keys == {prompt_key("a")}
    w.write(ValueTableRow.from_rewards("b", [1, 1], (0.0, 1.0)))
    w.close()
    t = load_value_table(path)
    assert set(t.keys()) == {prompt_key("a"), prompt_key("b")} and t.metadata["model"] == "tiny"
    with pytest.raises(ValueError, match="cannot resume.*seed"):
        ValueTableWriter(path, {**md, "seed": 1})
    with pytest.raises(FileExistsError):
        ValueTableWriter(path, md, resume=False)


def test_check_compatible():
    t = _table()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert t.check_compatible(model="tiny", reward_funcs=["exact_match"], seed=3) == []
    with pytest.warns(UserWarning, match="model='tiny', training uses model='other'"):
        problems = t.check_compatible(model="other", reward_funcs=["exact_match"])
    assert len(problems) == 1
    with pytest.raises(ValueError, match="reward_funcs"):
        t.check_compatible(reward_funcs=["format"], strict=True)


def test_check_compatible_placeholder_model_root():
    """A committed table names the model under a placeholder root (no machine paths in the repository): it matches
    the same model directory under any root, and only that one."""
    t = _table()
    t.metadata["model"] = "<TRL_EXT_CACHE>/smollm2-135m-instruct-v1"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert t.check_compatible(model="/home/u/.cache/trl_ext/smollm2-135m-instruct-v1/") == []
        assert t.check_compatible(model="<TRL_EXT_CACHE>/smollm2-135m-instruct-v1") == []
    for other in ("/home/u/.cache/trl_ext/smollm2-135m-instruct-v2", "/x/not-smollm2-135m-instruct-v1", "tiny"):
        with pytest.warns(UserWarning, match="value table was built with model="):
            assert len(t.check_compatible(model=other)) == 1


# ----------------------------------------------------------------------------------------------- table prior


def test_table_prior_lookup_and_missing_modes(tmp_path):
    path = tmp_path / "t.jsonl"
    save_value_table(path, _table())
    prior = TablePrior(str(path))
    conv = [{"role": "user", "content": "2+2="}]
    np.testing.assert_allclose(prior.predict(["1+1=", conv, "partial"], ["ctx"], [1.0]), [0.75, 0.5, 0.375])
    with pytest.raises(KeyError, match="1 of 2 prompts are not in the table"):
        prior.predict(["1+1=", "unknown"])
    assert prior.n_missing == 1 and prior.last_n_missing == 1
    lenient = TablePrior(load_value_table(path), missing="default", default_probability=0.2)
    np.testing.assert_allclose(lenient.predict(["x", "1+1=", "y"]), [0.2, 0.75, 0.2])
    assert lenient.last_n_missing == 2
    lenient.predict(["z"])
    assert lenient.n_missing == 3 and lenient.last_n_missing == 1


def test_table_prior_detects_key_collisions():
    row = ValueTableRow(prompt_key=prompt_key("real"), prompt="other text", n=1, mean_reward=1.0,
                        reward_range=(0.0, 1.0))
    with pytest.raises(ValueError, match="stores a different prompt"):
        TablePrior(ValueTable([row])).predict(["real"])


def test_table_prior_from_mapping_and_errors():
    prior = TablePrior({"1+1=": 0.9, prompt_key("2+2="): 0.1})
    np.testing.assert_allclose(prior.predict(["1+1=", "2+2="]), [0.9, 0.1])
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        TablePrior({"a": 1.5})
    np.testing.assert_allclose(TablePrior({"a": np.float32(0.5)}).predict(["a"]), [0.5])  # was rejected
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        TablePrior({"a": True})  # a bool is not a probability (was silently read as 1.0)
    with pytest.raises(ValueError, match="missing must be one of"):
        TablePrior({}, missing="ignore")
    with pytest.raises(TypeError, match="ValueTable, a path or a mapping"):
        TablePrior(3)


# ----------------------------------------------------------------------------------------------- factory


def test_build_prior():
    assert set(PRIOR_KINDS) == {"embedding", "table", "callable", "constant"}
    assert isinstance(build_prior("table", table={"a": 0.5}), TablePrior)
    assert isinstance(build_prior("callable", fn=lambda t, c, y: [0.5] * len(t)), CallablePrior)
    assert isinstance(build_prior("EMBEDDING", embed_fn=lambda t: None, head="logistic"), EmbeddingInContextPrior)
    np.testing.assert_array_equal(build_prior("constant", p=0.3).predict(["a"]), [0.3])
    with pytest.raises(ValueError, match="unknown prior kind 'v0'; choose one of"):
        build_prior("v0")
    with pytest.raises(TypeError, match="unknown arguments \\['tabel'\\]"):
        build_prior("table", tabel={})
    with pytest.raises(TypeError, match="missing required arguments \\['fn'\\]"):
        build_prior("callable")


def test_value_table_row_accepts_numpy_scalars_and_rejects_bools():
    # numpy integers are not Python ints: n=np.int64(2), reward_range=np.array([0, 1]) and rewards from an integer
    # array used to be refused with "must be ... finite numbers"; a bool n was refused but a bool reward accepted.
    row = ValueTableRow("0123456789abcdef", np.int64(2), np.float32(0.5), tuple(np.array([0, 1])),
                        rewards=list(np.array([0, 1])))
    assert row.n == 2 and type(row.n) is int and row.reward_range == (0.0, 1.0) and row.rewards == [0.0, 1.0]
    json.dumps(row.to_json())  # stays JSON-serializable
    assert ValueTableRow.from_rewards("p", np.array([1, 1, 0, 1]), np.array([0, 1])).success_probability == 0.75
    with pytest.raises(ValueError, match="n must be an int"):
        ValueTableRow("0123456789abcdef", True, 0.5, (0.0, 1.0))
    with pytest.raises(ValueError, match="finite numbers"):
        ValueTableRow("0123456789abcdef", 2, 0.5, (0.0, 1.0), rewards=[True, False])
