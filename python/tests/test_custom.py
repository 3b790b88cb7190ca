"""User-defined operators written in Python (qkv.CustomOp over include/qkv/custom.h), and .npy / safetensors
files from Python."""
import gc

import numpy as np
import pytest

import qkv


def square_forward(call, x):
    call.save(x)
    return qkv.mul(x, x)


def square_backward(call, g):
    (x,) = call.saved
    return qkv.mul_scalar(qkv.mul(g, x), 2.0)  # dx = 2 x dy


SQUARE = qkv.CustomOp("py_square", square_forward, square_backward)


def test_custom_op_forward_and_backward():
    ctx = qkv.Context()
    a = np.random.default_rng(0).standard_normal((3, 4))
    x = ctx.tensor(a, param=True)
    y = SQUARE(x)
    np.testing.assert_array_equal(y.numpy(), a * a)
    assert y.requires_grad
    qkv.sum(qkv.mul(y, ctx.tensor(np.arange(12.0).reshape(3, 4)))).backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * a * np.arange(12.0).reshape(3, 4), rtol=1e-15)
    ctx.step_end()
    # used twice: the gradients add up
    x2 = ctx.tensor(a, param=True)
    qkv.sum(qkv.add(SQUARE(x2), SQUARE(x2))).backward()
    np.testing.assert_allclose(x2.grad.numpy(), 4 * a, rtol=1e-15)


def test_custom_op_passes_gradcheck_and_a_wrong_backward_fails_it():
    ctx = qkv.Context()
    x = ctx.tensor(np.random.default_rng(1).standard_normal((2, 3)), param=True)
    assert qkv.gradcheck(lambda t: SQUARE(t[0]), [x])["passed"]
    wrong = qkv.CustomOp("py_square_wrong", square_forward, lambda call, g: qkv.mul(g, call.saved[0]))  # x dy
    r = qkv.gradcheck(lambda t: wrong(t[0]), [x])
    assert not r["passed"] and r["failed"] == 6


def test_two_inputs_two_outputs_numpy_gradients():
    def forward(call, a, b):
        return qkv.mul(a, b), qkv.add(a, b)

    def backward(call, g_prod, g_sum):
        a, b = (t.numpy() for t in call.inputs)
        gp, gs = g_prod.numpy(), g_sum.numpy()
        return gp * b + gs, gp * a + gs  # numpy arrays: qkv adds them in

    op = qkv.CustomOp("py_prod_sum", forward, backward, n_inputs=2, n_outputs=2)
    ctx = qkv.Context()
    av, bv = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 4.0])
    a, b = ctx.tensor(av, param=True), ctx.tensor(bv, param=True)
    p, s = op(a, b)
    np.testing.assert_array_equal(p.numpy(), av * bv)
    qkv.sum(qkv.add(p, qkv.mul_scalar(s, 3.0))).backward()
    np.testing.assert_allclose(a.grad.numpy(), bv + 3, rtol=1e-15)
    np.testing.assert_allclose(b.grad.numpy(), av + 3, rtol=1e-15)


def test_callbacks_outlive_the_operator_object():
    ctx = qkv.Context()
    x = ctx.tensor(np.array([1.5, -2.0]), param=True)
    y = qkv.CustomOp("py_square_local", square_forward, square_backward)(x)  # the op object is dropped here
    gc.collect()
    qkv.sum(y).backward()  # C calls the Python backward: still alive
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, -4.0])


def test_exceptions_in_callbacks_become_qkv_errors():
    ctx = qkv.Context()
    x = ctx.tensor(np.ones(3), param=True)
    bad_forward = qkv.CustomOp("py_bad_forward", lambda call, t: 1 / 0)
    with pytest.raises(qkv.QkvError) as info:
        bad_forward(x)
    assert "py_bad_forward" in str(info.value) and isinstance(info.value.__cause__, ZeroDivisionError)
    bad_backward = qkv.CustomOp("py_bad_backward", square_forward, lambda call, g: [][1])
    y = bad_backward(x)
    with pytest.raises(qkv.QkvError) as info:
        qkv.sum(y).backward()
    assert "py_bad_backward" in str(info.value) and "backward" in str(info.value)
    assert isinstance(info.value.__cause__, IndexError)
    ctx.step_end()
    wrong_shape = qkv.CustomOp("py_wrong_shape", square_forward, lambda call, g: np.zeros(2))
    with pytest.raises(qkv.QkvError) as info:
        qkv.sum(wrong_shape(x)).backward()
    assert isinstance(info.value.__cause__, ValueError) and "[2]" in str(info.value)
    ctx.step_end()
    returns_input = qkv.CustomOp("py_identity", lambda call, t: t)
    with pytest.raises(qkv.QkvError) as info:
        returns_input(x)
    assert info.value.name == "QKV_ERR_ARG"
    no_backward = qkv.CustomOp("py_no_backward", square_forward)
    with pytest.raises(qkv.QkvError) as info:
        qkv.sum(no_backward(x)).backward()
    assert info.value.name == "QKV_ERR_STATE"
    ctx.step_end()
    with pytest.raises(TypeError, match="2 inputs"):
        qkv.CustomOp("py_two", square_forward, n_inputs=2)(x)
    with pytest.raises(ValueError):
        qkv.CustomOp("py_many", square_forward, n_inputs=9)
    np.testing.assert_array_equal(SQUARE(x).numpy(), np.ones(3))  # the context goes on working


def test_npy_round_trips_with_numpy(tmp_path):
    ctx = qkv.Context()
    for a in (np.arange(12, dtype=np.float32).reshape(3, 4), np.random.default_rng(2).standard_normal((2, 3, 2)),
              np.array([3, -1, 7], np.int32)):
        path = tmp_path / "t.npy"
        ctx.tensor(a).save_npy(path)
        back = np.load(path)
        assert back.dtype == a.dtype and np.array_equal(back, a)
        np.save(tmp_path / "n.npy", a)
        t = qkv.load_npy(tmp_path / "n.npy", ctx)
        assert np.array_equal(t.numpy(), a) and t.numpy().dtype == a.dtype
    kept = qkv.load_npy(tmp_path / "n.npy", ctx, keep=True)
    ctx.step_end()
    assert np.array_equal(kept.numpy(), [3, -1, 7])
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(qkv.QkvError) as info:
        qkv.load_npy(tmp_path / "bad.npy", ctx)
    assert info.value.name == "QKV_ERR_FORMAT"


def test_safetensors_round_trip(tmp_path):
    ctx = qkv.Context()
    w = np.random.default_rng(3).standard_normal((4, 5))
    path = tmp_path / "s.safetensors"
    qkv.save_safetensors(path, {"w": ctx.tensor(w), "ids": np.array([1, 2, 3], np.int32)}, {"note": "x"}, ctx=ctx)
    tensors, metadata = qkv.load_safetensors(path, ctx)
    assert list(tensors) == ["ids", "w"] and metadata == {"note": "x"}
    assert np.array_equal(tensors["w"], w) and tensors["ids"].dtype == np.int32
    with pytest.raises(qkv.QkvError) as info:
        qkv.load_safetensors(tmp_path / "missing.safetensors", ctx)
    assert info.value.name == "QKV_ERR_IO"
    with pytest.raises(TypeError):
        qkv.save_safetensors(path, [w])


def test_no_grad_records_nothing_and_restores():
    ctx = qkv.Context()
    x = ctx.tensor(np.ones(2), param=True)
    with ctx.no_grad():
        assert not qkv.mul(x, x).requires_grad
        assert not SQUARE(x).requires_grad
    assert qkv.mul(x, x).requires_grad
    with pytest.raises(KeyError):
        with ctx.no_grad():
            raise KeyError("x")
    assert SQUARE(x).requires_grad
