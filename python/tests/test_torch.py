"""qkv.torch: the nn.Module of a qkv model against qkv's own forward, loss and gradients; checkpoints both ways."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import qkv  # noqa: E402
import qkv.torch as qt  # noqa: E402
from qkv import torch_model  # noqa: E402

BASE = dict(vocab=13, n_ctx=9, d_model=16, n_layer=2, n_head=4, d_mlp=24)
CONFIGS = {
    "layer_learned_gelu": dict(),
    "rms_rope_swiglu_gqa_bias_qkrms": dict(norm="rms", positions="rope", activation="swiglu", n_kv_head=2,
                                           attn_bias=True, qk_norm="rms"),
    "tied_sinusoidal_geglu_softcap": dict(tied_embeddings=True, positions="sinusoidal", activation="geglu",
                                          attn_softcap=2.5),
    "nonorm_attn_only_scale": dict(norm="none", d_mlp=0, attn_scale=0.3, positions="none"),
    "mqa_relu_qklayer_rope": dict(n_kv_head=1, activation="relu", qk_norm="layer", positions="rope",
                                  norm_eps=1e-3, rope_base=500.0),
    "gelu_tanh_one_layer_bias": dict(n_layer=1, activation="gelu_tanh", attn_bias=True),
}


def make_model(ctx, dtype="f64", seed=0, **config):
    """A qkv model whose every parameter is drawn with a large spread (gains around 1), so that the logits are
    of order 1 and every parameter matters."""
    m = qkv.Model(ctx, dtype=dtype, **dict(BASE, **config))
    rng = np.random.default_rng(seed)
    for name, t in m.params.items():
        a = t.numpy()
        gain = name.endswith(".w") and (".ln" in name or name.startswith("ln_final") or "_ln." in name)
        a[...] = (1.0 if gain else 0.0) + 0.4 * rng.standard_normal(a.shape)
    return m


def ids_for(config, batch=3, seed=1):
    c = dict(BASE, **config)
    return np.random.default_rng(seed).integers(0, c["vocab"], (batch, c["n_ctx"]))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_qkv_f64(name):
    ctx = qkv.Context()
    m = make_model(ctx, **CONFIGS[name])
    module = qt.to_module(m)
    assert list(module.state_dict()) == list(m.params)  # TransformerLens's names, qkv's order
    ids = ids_for(CONFIGS[name])
    for causal in (True, False):
        ref = m.forward(ids, causal=causal).numpy()
        got = module(torch.from_numpy(ids), causal=causal)
        assert got.dtype == torch.float64 and tuple(got.shape) == ref.shape
        assert np.abs(ref).max() > 0.5  # logits of order 1, not a comparison of zeros
        np.testing.assert_allclose(got.detach().numpy(), ref, rtol=0, atol=1e-10)
    # an unbatched sequence, shorter than n_ctx
    np.testing.assert_allclose(module(ids[0, :5]).detach().numpy(), m.forward(ids[0, :5]).numpy(), rtol=0,
                               atol=1e-10)


# gated output and differential attention, alone and together
GATED_DIFF = {"gate_head": dict(attn_gate="head"), "gate_element_bias": dict(attn_gate="element", attn_bias=True),
         "diff_rope": dict(attn_diff=True, positions="rope"), "diff_gate_head": dict(attn_diff=True, attn_gate="head")}


@pytest.mark.parametrize("name", list(GATED_DIFF))
def test_gated_and_differential_attention_match_qkv(name, tmp_path):
    ctx = qkv.Context()
    m = make_model(ctx, **GATED_DIFF[name])
    module = qt.to_module(m)
    ids = ids_for({})
    np.testing.assert_allclose(module(ids).detach().numpy(), m.forward(ids).numpy(), rtol=0, atol=1e-10)
    qt.save_checkpoint(module, tmp_path / "back.safetensors")
    back = qkv.Model.load(ctx, tmp_path / "back.safetensors")
    assert back.config == m.config
    for n, t in m.params.items():
        assert t.numpy().tobytes() == back.params[n].numpy().tobytes(), n


def test_the_pytorch_forward_computes_every_variant_of_qkv():
    """A variant added to qkv without its PyTorch weights fails here (qkv.torch would refuse such models)."""
    assert tuple(qkv._ENUMS["attn_variant"]()) == tuple(torch_model.ATTN_VARIANTS)


@pytest.mark.parametrize("variant", qkv._ENUMS["attn_variant"]())
def test_every_attention_variant_matches_qkv(variant):
    ctx = qkv.Context()
    m = make_model(ctx, attn_variant=variant, positions="rope")
    module = qt.to_module(m)
    ids = ids_for({})
    np.testing.assert_allclose(module(ids).detach().numpy(), m.forward(ids).numpy(), rtol=0, atol=1e-10)


def test_a_variant_without_a_pytorch_forward_is_refused():
    ctx = qkv.Context()
    m = make_model(ctx)
    module = qt.to_module(m)
    config = dict(module.config, attn_variant="softmax2")
    with pytest.raises(ValueError, match="no PyTorch forward"):
        type(module)(config, {name: p.detach() for name, p in module.state_dict().items()})


@pytest.mark.parametrize("name", ["layer_learned_gelu", "rms_rope_swiglu_gqa_bias_qkrms", "tied_sinusoidal_geglu_softcap"])
def test_logits_match_qkv_f32(name):
    ctx = qkv.Context()
    m = make_model(ctx, dtype="f32", **CONFIGS[name])
    module = qt.to_module(m)
    ids = ids_for(CONFIGS[name])
    got = module(ids)
    assert got.dtype == torch.float32 and module.embed.W_E.dtype == torch.float32
    np.testing.assert_allclose(got.detach().numpy(), m.forward(ids).numpy(), rtol=0, atol=1e-4)


def test_loss_and_gradients_match_qkv():
    config = CONFIGS["rms_rope_swiglu_gqa_bias_qkrms"]
    ctx = qkv.Context()
    m = make_model(ctx, **config)
    module = qt.to_module(m)
    ids = ids_for(config)
    targets = qt.next_token_targets(torch.from_numpy(ids))
    assert targets[0, -1] == -1 and torch.equal(targets[:, :-1], torch.from_numpy(ids[:, 1:]))
    logits, loss = module(ids, targets)
    loss.backward()
    ref = m.loss(m.forward(ids), qkv.next_token_targets(ctx.tensor(ids)))
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-12)
    grads = {n: p.grad for n, p in module.named_parameters()}
    for name, t in m.params.items():
        np.testing.assert_allclose(grads[name].numpy(), t.grad.numpy(), rtol=0, atol=1e-10, err_msg=name)


def test_run_with_cache_pattern_is_qkvs():
    ctx = qkv.Context()
    m = make_model(ctx)
    module = qt.to_module(m)
    ids = ids_for({}, batch=2)
    m.set_inspect(True)
    m.forward(ids)
    _, cache = module.run_with_cache(ids)
    for layer in range(2):
        np.testing.assert_allclose(cache[f"blocks.{layer}.attn.hook_pattern"].detach().numpy(),
                                   m.inspect("pattern", layer).numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(cache[f"blocks.{layer}.hook_resid_post"].detach().numpy(),
                                   m.inspect("resid_post", layer).numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_round_trip_is_bit_exact(tmp_path, dtype):
    ctx = qkv.Context()
    config = CONFIGS["tied_sinusoidal_geglu_softcap"]
    m = make_model(ctx, dtype=dtype, **config)
    src = tmp_path / "src.safetensors"
    m.save(src)
    module = qt.to_module(src)  # from a path
    out = tmp_path / "out.safetensors"
    qt.save_checkpoint(module, out, metadata={"origin": "torch"})
    back = qkv.Model.load(ctx, out)
    assert back.config == m.config
    for name, t in m.params.items():
        a, b = t.numpy(), back.params[name].numpy()
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    assert qkv.checkpoint_metadata(out, ctx)[1]["origin"] == "torch"


def test_train_in_torch_then_load_in_qkv(tmp_path):
    config = CONFIGS["layer_learned_gelu"]
    ctx = qkv.Context()
    m = make_model(ctx, **config)
    module = qt.to_module(m)
    assert all(p.requires_grad for p in module.parameters())
    ids = torch.from_numpy(ids_for(config, batch=4, seed=5))
    targets = qt.next_token_targets(ids)
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        _, loss = module(ids, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3
    path = tmp_path / "trained.safetensors"
    qt.save_checkpoint(module, path)
    trained = qkv.Model.load(ctx, path)
    with torch.no_grad():
        expected = module(ids).numpy()
    np.testing.assert_allclose(trained.forward(ids.numpy()).numpy(), expected, rtol=0, atol=1e-10)
    assert np.abs(trained.forward(ids.numpy()).numpy() - m.forward(ids.numpy()).numpy()).max() > 1e-3
    ref = trained.loss(trained.forward(ids.numpy()), qkv.next_token_targets(ctx.tensor(ids.numpy())))
    with torch.no_grad():
        assert ref.item() == pytest.approx(module(ids, targets)[1].item(), abs=1e-10)


def test_dtype_conversion_and_parameters_are_copies():
    ctx = qkv.Context()
    m = make_model(ctx)
    module = qt.to_module(m, dtype=torch.float32)
    assert module.config["dtype"] == "f32" and module.embed.W_E.dtype == torch.float32
    before = m.params["embed.W_E"].numpy().copy()
    with torch.no_grad():
        module.embed.W_E.add_(1.0)
    assert np.array_equal(m.params["embed.W_E"].numpy(), before)


def test_errors_are_python_exceptions(tmp_path):
    ctx = qkv.Context()
    m = make_model(ctx)
    module = qt.to_module(m)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        qt.to_module(tmp_path / "missing.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(qkv.QkvError):
        qt.to_module(junk)
    with pytest.raises(TypeError, match="checkpoint path or a qkv.Model"):
        qt.to_module(3)
    with pytest.raises(TypeError, match="float16"):
        qt.to_module(m, dtype=torch.float16)
    with pytest.raises(TypeError, match="float16"):
        qt.save_checkpoint(qt.to_module(m).half(), tmp_path / "half.safetensors")
    with pytest.raises(TypeError, match="QkvTransformer"):
        qt.save_checkpoint(torch.nn.Linear(2, 2), tmp_path / "linear.safetensors")
    with pytest.raises(ValueError, match="ids must be in"):
        module(np.full((1, 4), 13))
    with pytest.raises(ValueError, match="n_ctx"):
        module(np.zeros((1, 10), np.int64))
    with pytest.raises(TypeError, match="integers"):
        module(np.zeros((1, 4)))
    with pytest.raises(qkv.QkvError) as info:
        qt.save_checkpoint(module, tmp_path / "no" / "such" / "dir.safetensors")
    assert info.value.name == "QKV_ERR_IO"
    with torch.no_grad():
        module.blocks[0].attn.W_Q.data = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"blocks.0.attn.W_Q is \[3, 3\]"):
        qt.save_checkpoint(module, tmp_path / "shape.safetensors")
    assert not os.path.exists(tmp_path / "shape.safetensors")
