"""Tests of the Python package against the C library (QKV_LIBRARY or the installed one)."""
import gc

import numpy as np
import pytest

import qkv


def test_version_matches_header():
    import pathlib
    header = pathlib.Path(__file__).resolve().parents[2] / "include" / "qkv.h"
    if header.exists():
        assert f'#define QKV_VERSION "{qkv.version()}"' in header.read_text()
    assert qkv.version().count(".") == 2


def test_tensor_copies_in_and_numpy_is_a_view():
    ctx = qkv.Context()
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    t = ctx.tensor(a)
    assert t.shape == (2, 3) and t.ndim == 2 and t.dtype == "f64" and t.numel == 6
    a[0, 0] = 99.0  # copied in: the tensor does not see it
    v = t.numpy()
    assert v[0, 0] == 0.0 and v.dtype == np.float64 and v.shape == (2, 3)
    v[1, 2] = -7.0  # zero-copy: a second view sees the write
    assert t.numpy()[1, 2] == -7.0


def test_view_keeps_tensor_alive():
    ctx = qkv.Context()
    v = ctx.tensor(np.array([1.5, 2.5], dtype=np.float32), param=True).numpy()
    gc.collect()
    assert v.tolist() == [1.5, 2.5]


def test_dtypes():
    ctx = qkv.Context()
    assert ctx.tensor(np.zeros(3, np.float32)).dtype == "f32"
    assert ctx.tensor(np.zeros(3, np.int32)).dtype == "i32"
    assert ctx.tensor(np.zeros(3, np.int64)).dtype == "i32"
    assert ctx.tensor(np.zeros(3, bool)).dtype == "u8"
    with pytest.raises(TypeError, match="complex"):
        ctx.tensor(np.zeros(3, np.complex128))
    with pytest.raises(ValueError, match="at most 4"):
        ctx.tensor(np.zeros((1, 1, 1, 1, 1)))


def test_matmul_and_backward_match_numpy():
    rng = np.random.default_rng(1)
    a_np, b_np = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    ctx = qkv.Context()
    a = ctx.tensor(a_np, param=True)
    b = ctx.tensor(b_np, param=True)
    c = a @ b
    np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-12, atol=1e-12)
    loss = qkv.sum(qkv.mul(c, c))
    np.testing.assert_allclose(loss.item(), np.sum((a_np @ b_np) ** 2), rtol=1e-12)
    loss.backward()
    # d sum(C^2) / dA = 2 C B^T, / dB = 2 A^T C
    np.testing.assert_allclose(a.grad.numpy(), 2 * (a_np @ b_np) @ b_np.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), 2 * a_np.T @ (a_np @ b_np), rtol=1e-10, atol=1e-12)
    assert qkv.mean(a).item() == pytest.approx(a_np.mean(), rel=1e-12)
    np.testing.assert_allclose((a + a).numpy(), 2 * a_np)


def test_shape_error_is_qkverror_with_qkv_message_and_clears():
    ctx = qkv.Context()
    a = ctx.tensor(np.zeros((2, 3)))
    b = ctx.tensor(np.zeros((4, 5)))
    with pytest.raises(qkv.QkvError, match="qkv_matmul") as info:
        qkv.matmul(a, b)
    assert info.value.code == 4 and info.value.name == "QKV_ERR_SHAPE"
    # the error was cleared: the context works again
    assert qkv.add(a, a).shape == (2, 3)


def test_dtype_mismatch_and_bad_arguments_raise():
    ctx = qkv.Context()
    a = ctx.tensor(np.zeros(3, np.float32))
    b = ctx.tensor(np.zeros(3, np.float64))
    with pytest.raises(qkv.QkvError) as info:
        qkv.add(a, b)
    assert info.value.name == "QKV_ERR_DTYPE"
    with pytest.raises(TypeError):
        qkv.add(a, None)
    with pytest.raises(TypeError):
        qkv.sum(np.zeros(3))
    other = qkv.Context().tensor(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="different contexts"):
        qkv.add(a, other)


def test_step_tensor_after_step_end_raises_parameters_stay():
    ctx = qkv.Context()
    p = ctx.tensor(np.ones(2), param=True)
    s = ctx.tensor(np.ones(2))
    ctx.step_end()
    with pytest.raises(qkv.QkvError) as info:
        s.numpy()
    assert info.value.name == "QKV_ERR_STALE"
    assert p.numpy().tolist() == [1.0, 1.0]


def test_closed_context_raises():
    ctx = qkv.Context()
    p = ctx.tensor(np.ones(2), param=True)
    ctx.close()
    with pytest.raises(qkv.QkvError):
        p.shape


def test_view_outlives_closed_context_without_crashing():
    ctx = qkv.Context()
    t = ctx.tensor(np.array([4.0, 5.0]), param=True)
    v = t.numpy()
    ctx.close()  # a view is alive: the memory stays until it goes
    assert v.tolist() == [4.0, 5.0]
    with pytest.raises(qkv.QkvError, match="closed"):
        t.numpy()
    with pytest.raises(qkv.QkvError, match="closed"):
        ctx.tensor([1.0])
    del v, t
    gc.collect()


def test_parameter_of_closed_model_raises():
    ctx = qkv.Context()
    m = qkv.Model(ctx, vocab=5, n_ctx=4, d_model=8, n_layer=1, n_head=2, d_mlp=0)
    p = next(iter(m.params.values()))
    assert p.ndim >= 1
    m.close()
    with pytest.raises(qkv.QkvError, match="model"):
        p.shape
