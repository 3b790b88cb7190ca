"""Operators, optimizers and the model from Python, and a checkpoint's typed config metadata."""
import numpy as np
import pytest

import qkv

SMALL = dict(vocab=11, n_ctx=8, d_model=16, n_layer=1, n_head=2, d_mlp=32)


def test_every_tensor_operator_is_bound():
    for name in ("softmax", "layer_norm", "gelu", "cross_entropy", "transpose", "gather", "where", "div"):
        assert name in qkv.OPERATORS and callable(getattr(qkv, name))
    assert len(qkv.OPERATORS) > 45


def test_generic_operators_match_numpy():
    ctx = qkv.Context()
    x_np = np.random.default_rng(0).standard_normal((3, 5))
    x = ctx.tensor(x_np)
    s = qkv.softmax(x, None, 0).numpy()
    ref = np.exp(x_np - x_np.max(1, keepdims=True))
    np.testing.assert_allclose(s, ref / ref.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(qkv.tanh(x).numpy(), np.tanh(x_np), rtol=1e-12)
    np.testing.assert_allclose(qkv.mul_scalar(x, 2.5).numpy(), 2.5 * x_np)
    np.testing.assert_allclose(qkv.transpose(x, 0, 1).numpy(), x_np.T)
    with pytest.raises(qkv.QkvError) as info:
        qkv.sub(x, None)
    assert info.value.name == "QKV_ERR_NULL"
    with pytest.raises(TypeError, match="arguments"):
        qkv.mul_scalar(x)
    with pytest.raises(qkv.QkvError) as info:
        qkv.transpose(x, 0, 7)
    assert "qkv_transpose" in str(info.value)


def test_sgd_steps_like_the_formula():
    ctx = qkv.Context()
    w = ctx.tensor(np.array([3.0, -2.0]), param=True)
    opt = qkv.Optimizer([w], "sgd", lr=0.1)
    for _ in range(3):
        qkv.sum(qkv.square(w)).backward()
        opt.step()
        opt.zero_grad()
        ctx.step_end()
    np.testing.assert_allclose(w.numpy(), np.array([3.0, -2.0]) * 0.8 ** 3, rtol=1e-14)
    assert opt.step_count == 3 and opt.lr == pytest.approx(0.1)
    with pytest.raises(TypeError, match="unknown option"):
        qkv.Optimizer([w], "sgd", learning_rate=1)
    with pytest.raises(ValueError):
        qkv.Optimizer([w], "lbfgs")


def test_model_trains_saves_and_loads(tmp_path):
    ctx = qkv.Context()
    m = qkv.Model(ctx, dtype="f64", norm="rms", **SMALL)
    assert m.config["norm"] == "rms" and m.config["vocab"] == 11
    ids = np.random.default_rng(1).integers(0, 11, (2, 8))
    opt = qkv.Optimizer(m.params.values(), "adam", lr=1e-2)
    losses = []
    for _ in range(20):
        logits = m.forward(ids)
        assert logits.shape == (2, 8, 11)
        loss = m.loss(logits, qkv.next_token_targets(ctx.tensor(ids)))
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.step_end()
    assert losses[-1] < losses[0] - 0.5
    path = tmp_path / "m.safetensors"
    m.save(path, optimizer=opt, metadata={"note": "hello"})
    m2 = qkv.Model.load(ctx, path)
    assert m2.config == m.config
    np.testing.assert_array_equal(m2.forward(ids).numpy(), m.forward(ids).numpy())
    with pytest.raises(ValueError, match="norm"):
        qkv.Model(ctx, norm="batch")
    with pytest.raises(TypeError, match="unknown config field"):
        qkv.Model(ctx, width=3)
    with pytest.raises(TypeError, match="integers"):
        m.forward(np.zeros((2, 8)))
    with pytest.raises(qkv.QkvError):
        m.forward(np.full((2, 8), 99))
    with pytest.raises(qkv.QkvError) as info:
        qkv.Model.load(ctx, tmp_path / "missing.safetensors")
    assert info.value.name == "QKV_ERR_IO"


def test_default_config_is_the_c_default():
    d = qkv.default_config()
    assert (d["vocab"], d["n_ctx"], d["d_model"], d["n_layer"], d["n_head"], d["d_mlp"]) == (256, 128, 128, 2, 4, 512)
    assert d["norm"] == "layer" and d["positions"] == "learned" and d["activation"] == "gelu"
    assert d["tied_embeddings"] is False and d["dtype"] == "f32"


# one non-default value for every config field (bools true: the bug read "false" as true, so both ways)
NON_DEFAULT = dict(vocab=13, n_ctx=6, d_model=24, n_layer=2, n_head=4, n_kv_head=2, d_mlp=40, norm="rms",
                   positions="rope", qk_norm="layer", attn_scale=0.25, attn_softcap=30.0, tied_embeddings=True,
                   dropout=0.125, activation="swiglu", attn_bias=True, norm_eps=1e-6, rope_base=500.0,
                   dtype="f64", seed=12345, init_std=0.05, init_embed_std=1.0, init_resid_std=0.01)
# a variant other than the softmax excludes a soft-cap: its non-default value in a configuration of its own (with
# the attention output's gate)
NON_DEFAULT_VARIANT = dict(SMALL, attn_variant="sink", attn_gate="element")
# differential attention excludes the variants and a soft-cap too
NON_DEFAULT_DIFF = dict(SMALL, attn_diff=True)


def test_config_fields_all_covered():
    assert sorted(set(NON_DEFAULT) | set(NON_DEFAULT_VARIANT) | set(NON_DEFAULT_DIFF)) == sorted(qkv.default_config())


@pytest.mark.parametrize("config", [NON_DEFAULT, NON_DEFAULT_VARIANT, NON_DEFAULT_DIFF, dict(SMALL)],
                         ids=["non_default", "variant", "diff", "defaults"])
def test_checkpoint_metadata_is_typed(tmp_path, config):
    ctx = qkv.Context()
    m = qkv.Model(ctx, **config)
    path = tmp_path / "c.safetensors"
    m.save(path, metadata={"mine": "false"})
    typed, other = qkv.checkpoint_metadata(path, ctx)
    expected = dict(qkv.default_config(), **config)
    assert sorted(typed) == sorted(expected)
    for field, value in expected.items():
        assert typed[field] == value and type(typed[field]) is type(value), field
    assert other["mine"] == "false"


def test_sample_greedy_is_the_argmax_of_forward():
    ctx = qkv.Context()
    m = qkv.Model(ctx, dtype="f64", **SMALL)
    prompt = np.array([1, 2, 3])
    out = m.sample(prompt, 4, temperature=0)
    assert out.dtype == np.int32 and out.shape == (4,)
    seq = list(prompt)
    for _ in range(4):
        seq.append(int(np.argmax(m.forward(np.array(seq)).numpy()[-1])))
    assert out.tolist() == seq[3:]
    with pytest.raises(ValueError):
        m.sample([], 3)
    with pytest.raises(qkv.QkvError):
        m.sample([1], 2, temperature=-1)


def test_inspect_pattern_rows_sum_to_one():
    ctx = qkv.Context()
    m = qkv.Model(ctx, dtype="f64", **SMALL)
    with pytest.raises(qkv.QkvError) as info:
        m.inspect("pattern", 0)
    assert info.value.name == "QKV_ERR_STATE"
    m.set_inspect(True)
    m.forward(np.arange(8).reshape(1, 8))
    p = m.inspect("pattern", 0).numpy()
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.triu(p.reshape(-1, 8, 8), 1) == 0)  # causal
    with pytest.raises(ValueError):
        m.inspect("nothing", 0)
    with pytest.raises(qkv.QkvError):
        m.inspect("pattern", 5)


def test_gradcheck_passes_an_operator_and_refuses_an_untaped_output():
    ctx = qkv.Context()
    x = ctx.tensor(np.random.default_rng(2).standard_normal((3, 4)), param=True)
    r = qkv.gradcheck(lambda t: qkv.softmax(qkv.tanh(t[0]), None, 0), [x])
    assert r["passed"] and r["checked"] == 12 and r["failed"] == 0
    # tolerances no finite difference meets: the check reports failing elements
    r = qkv.gradcheck(lambda t: qkv.softmax(qkv.tanh(t[0]), None, 0), [x], atol=1e-300, rtol=1e-300)
    assert not r["passed"] and r["failed"] > 0 and r["worst_input"] == 0 and r["message"]
    # an output computed outside the tape (numpy, copied in): refused, not a silent pass
    with pytest.raises(qkv.QkvError) as info:
        qkv.gradcheck(lambda t: ctx.tensor(t[0].numpy() ** 2), [x])
    assert "qkv_gradcheck" in str(info.value)
    with pytest.raises(ZeroDivisionError):
        qkv.gradcheck(lambda t: 1 / 0, [x])
    with pytest.raises(TypeError, match="not a qkv.Tensor"):
        qkv.gradcheck(lambda t: 3.0, [x])
    assert qkv.add(x, x).shape == (3, 4)  # the context still works
