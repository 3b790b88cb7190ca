"""Hook points from Python: Python callables as hooks, run_with_cache as numpy, patching and ablation."""
import gc

import numpy as np
import pytest

import qkv

CONFIG = dict(vocab=11, n_ctx=8, d_model=16, n_layer=2, n_head=4, d_mlp=32, dtype="f64", init_std=0.3,
              init_embed_std=1.0)


def model(ctx, **extra):
    return qkv.Model(ctx, **dict(CONFIG, **extra))


def ids(seed=0, batch=2):
    return np.random.default_rng(seed).integers(0, 11, (batch, 8))


def test_hook_names_are_the_models_points():
    ctx = qkv.Context()
    names = model(ctx).hook_names()
    assert names[:3] == ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre"]
    assert "blocks.1.attn.hook_z" in names and names[-1] == "ln_final.hook_normalized"
    assert "blocks.0.attn.hook_rot_q" not in names  # rope only
    assert "blocks.0.attn.hook_rot_q" in model(ctx, positions="rope").hook_names()


def test_reading_hook_sees_the_cached_values():
    ctx = qkv.Context()
    m = model(ctx)
    seen = {}

    def record(name, v):
        seen[name] = np.array(v.numpy())

    m.add_hook("blocks.1.hook_resid_mid", record)
    m.add_hook("blocks.0.attn.hook_pattern", record)
    plain = m.forward(ids()).numpy().copy()
    assert sorted(seen) == ["blocks.0.attn.hook_pattern", "blocks.1.hook_resid_mid"]
    m.clear_hooks()
    logits, cache = m.run_with_cache(ids(), "*")
    np.testing.assert_array_equal(logits.numpy(), plain)  # a reading hook changes nothing
    for name, value in seen.items():
        np.testing.assert_array_equal(value, cache[name])
    assert cache["blocks.0.attn.hook_pattern"].shape == (8, 8, 8)  # [B*H, n, n]
    np.testing.assert_allclose(cache["blocks.0.attn.hook_pattern"].sum(-1), 1.0, rtol=1e-12)
    assert set(cache) == set(m.hook_names())


def test_run_with_cache_selects_and_outlives_the_step():
    ctx = qkv.Context()
    m = model(ctx)
    _, cache = m.run_with_cache(ids(), "blocks.*.hook_resid_post")
    assert sorted(cache) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    ctx.step_end()
    assert cache["blocks.1.hook_resid_post"].shape == (2, 8, 16) and np.isfinite(cache["blocks.1.hook_resid_post"]).all()
    with pytest.raises(qkv.QkvError) as info:
        m.run_with_cache(ids(), "blocks.*.hook_nothing")
    assert info.value.name == "QKV_ERR_ARG"


def test_replacing_hook_changes_the_forward_and_the_gradient():
    ctx = qkv.Context()
    m = model(ctx)
    clean = m.forward(ids()).numpy().copy()
    m.add_hook("blocks.0.attn.hook_z", lambda name, v: qkv.mul_scalar(v, 0.0))
    zeroed = m.forward(ids())
    assert np.abs(zeroed.numpy() - clean).max() > 1e-3
    m.loss(zeroed, qkv.next_token_targets(ctx.tensor(ids()))).backward()
    params = m.params
    # z of layer 0 is zero through the hook: no gradient reaches W_V of layer 0, one reaches layer 1's
    assert np.all(params["blocks.0.attn.W_V"].grad.numpy() == 0)
    assert np.abs(params["blocks.1.attn.W_V"].grad.numpy()).max() > 0
    ctx.step_end()
    m.clear_hooks()
    m.ablate("blocks.0.attn.hook_z", "zero")
    np.testing.assert_allclose(m.forward(ids()).numpy(), zeroed_values(m, ctx), rtol=0, atol=0)


def zeroed_values(m, ctx):
    m.clear_hooks()
    for h in range(4):
        m.ablate_head(0, h, "zero")
    out = m.forward(ids()).numpy().copy()
    m.clear_ablations()
    return out


def test_ablate_head_is_a_hook_zeroing_that_head():
    ctx = qkv.Context()
    m = model(ctx)
    x = ids(batch=1)
    clean = m.forward(x).numpy().copy()
    m.ablate_head(1, 2, "zero")
    ablated = m.forward(x).numpy().copy()
    assert np.abs(ablated - clean).max() > 1e-4
    m.clear_ablations()
    np.testing.assert_array_equal(m.forward(x).numpy(), clean)

    def zero_head_2(name, v):
        a = np.array(v.numpy())
        a[2] = 0.0  # batch 0, head 2 of [B*H, n, dh]
        return ctx.tensor(a)

    m.add_hook("blocks.1.attn.hook_z", zero_head_2)
    np.testing.assert_allclose(m.forward(x).numpy(), ablated, rtol=0, atol=1e-13)
    m.clear_hooks()
    m.ablate_head(0, 0, "mean")
    assert np.abs(m.forward(x).numpy() - clean).max() > 1e-6
    with pytest.raises(ValueError):
        m.ablate_head(0, 0, "resample")
    with pytest.raises(qkv.QkvError) as info:
        m.ablate_head(5, 0)
    assert "qkv_model_ablate_head" in str(info.value)


def test_patch_and_resample():
    ctx = qkv.Context()
    m = model(ctx)
    clean_ids, corrupt_ids = ids(1), ids(2)
    clean_logits, clean = m.run_with_cache(clean_ids, "blocks.0.hook_resid_pre")
    clean_logits = clean_logits.numpy().copy()
    corrupt = m.forward(corrupt_ids).numpy().copy()
    source = clean["blocks.0.hook_resid_pre"]
    m.patch("blocks.0.hook_resid_pre", source)  # every position: the clean run
    source[...] = 0.0  # patch copied it
    np.testing.assert_array_equal(m.forward(corrupt_ids).numpy(), clean_logits)
    m.clear_hooks()
    _, clean = m.run_with_cache(clean_ids, "blocks.0.hook_resid_pre")
    m.patch("blocks.0.hook_resid_pre", clean["blocks.0.hook_resid_pre"], pos=3)
    one = m.forward(corrupt_ids).numpy()
    assert np.abs(one - corrupt).max() > 1e-6 and np.abs(one - clean_logits).max() > 1e-6
    np.testing.assert_array_equal(one[:, :3], corrupt[:, :3])  # causal: positions before 3 see no change
    m.clear_hooks()
    _, cache = m.run_with_cache(clean_ids, "blocks.0.hook_resid_pre")
    m.ablate("blocks.0.hook_resid_pre", "resample", source=cache["blocks.0.hook_resid_pre"])
    np.testing.assert_array_equal(m.forward(corrupt_ids).numpy(), clean_logits)
    m.clear_hooks()
    with pytest.raises(ValueError, match="needs a source"):
        m.ablate("blocks.0.hook_resid_pre", "resample")
    with pytest.raises(ValueError, match="kind"):
        m.ablate("blocks.0.hook_resid_pre", "half")
    with pytest.raises(qkv.QkvError) as info:
        m.patch("blocks.0.hook_resid_pre", np.zeros((2, 8, 3)))
        m.forward(corrupt_ids)
    assert info.value.name in ("QKV_ERR_SHAPE", "QKV_ERR_ARG")


def test_a_hooks_exception_becomes_a_qkv_error():
    ctx = qkv.Context()
    m = model(ctx)
    m.add_hook("blocks.0.hook_resid_pre", lambda name, v: 1 / 0)
    with pytest.raises(qkv.QkvError) as info:
        m.forward(ids())
    assert "blocks.0.hook_resid_pre" in str(info.value) and "ZeroDivisionError" in str(info.value)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    m.clear_hooks()
    m.add_hook("hook_embed", lambda name, v: "not a tensor")
    with pytest.raises(qkv.QkvError) as info:
        m.forward(ids())
    assert isinstance(info.value.__cause__, TypeError)
    m.clear_hooks()
    m.add_hook("hook_embed", lambda name, v: ctx.tensor(np.zeros((2, 8, 3))))
    with pytest.raises(qkv.QkvError) as info:
        m.forward(ids())
    assert info.value.name == "QKV_ERR_SHAPE" and "hook_embed" in str(info.value)
    m.clear_hooks()

    def interrupt(name, v):
        raise KeyboardInterrupt

    m.add_hook("hook_embed", interrupt)
    with pytest.raises(KeyboardInterrupt):  # C unwinds as for any error, then the interrupt goes on
        m.forward(ids())
    m.clear_hooks()
    with pytest.raises(qkv.QkvError) as info:
        m.add_hook("blocks.0.hook_nothing", lambda name, v: None)
    assert info.value.name == "QKV_ERR_ARG"
    with pytest.raises(TypeError):
        m.add_hook("hook_embed", 3)
    assert m.forward(ids()).shape == (2, 8, 11)  # the context goes on working


def test_hook_callbacks_live_as_long_as_the_hook():
    ctx = qkv.Context()
    m = model(ctx)
    calls = []

    def install():
        def local_hook(name, v):  # no reference outside this function
            calls.append(name)
        m.add_hook("blocks.1.hook_resid_pre", local_hook)

    install()
    gc.collect()
    m.forward(ids())
    m.forward(ids())
    assert calls == ["blocks.1.hook_resid_pre"] * 2


def test_logit_lens_and_attribution():
    ctx = qkv.Context()
    m = model(ctx)
    x = ids(batch=2)
    lens = m.logit_lens(x)
    assert lens.shape == (3, 2, 8, 11)
    np.testing.assert_array_equal(lens[-1], m.forward(x).numpy())  # the last row is the logits, bit for bit
    assert np.abs(lens[0] - lens[-1]).max() > 1e-3
    labels, values = m.logit_attribution(x, pos=5, token_a=3, token_b=7)
    assert labels[:2] == ["embed", "pos_embed"] and "L1H3" in labels and "blocks.1.mlp" in labels
    assert values.shape == (2, len(labels) + 1)
    logits = m.forward(x).numpy()
    np.testing.assert_allclose(values[:, -1], logits[:, 5, 3] - logits[:, 5, 7], rtol=0, atol=1e-12)
    np.testing.assert_allclose(values[:, :-1].sum(1), values[:, -1], rtol=0, atol=1e-10)  # the parts add up


def test_patch_sweep_with_a_python_metric():
    ctx = qkv.Context()
    m = model(ctx)
    clean, corrupt = ids(1, batch=1), ids(2, batch=1)

    def metric(logits):
        return float(logits.numpy()[..., -1, 4].sum())

    clean_value = metric(m.forward(clean))
    same = m.patch_sweep("hook_resid_pre", clean, clean, metric)
    np.testing.assert_array_equal(same, np.full(2, clean_value))  # patching clean with itself: metric(clean)
    table = m.patch_sweep("hook_resid_pre", clean, corrupt, metric, by="pos")
    assert table.shape == (2, 8)
    assert table[0].max() > table[0].min()  # the positions differ in effect
    heads = m.patch_sweep("attn.hook_z", clean, corrupt, metric, by="head")
    assert heads.shape == (2, 4) and np.isfinite(heads).all()
    with pytest.raises(qkv.QkvError) as info:
        m.patch_sweep("hook_resid_pre", clean, corrupt, lambda logits: {}["missing"])
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(ValueError):
        m.patch_sweep("hook_resid_pre", clean, corrupt, metric, by="layer")
    np.testing.assert_array_equal(m.patch_sweep("hook_resid_pre", clean, clean, metric), same)  # still works
