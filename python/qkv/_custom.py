"""User-defined operators from Python (include/qkv/custom.h): a Python forward and backward that qkv's tape treats
like a built-in operator's, as torch.autograd.Function does in PyTorch."""
import ctypes
import weakref

import numpy as np

from . import QkvError, Tensor, _args, _t_p, lib

MAX_INPUTS, MAX_OUTPUTS, MAX_SAVED = 8, 4, 8  # QKV_CUSTOM_MAX_INPUTS, _OUTPUTS, _SAVED


class _Call(ctypes.Structure):  # qkv_custom_call (include/qkv/custom.h)
    _fields_ = [("name", ctypes.c_char_p), ("user", ctypes.c_void_p), ("n_inputs", ctypes.c_int),
                ("n_outputs", ctypes.c_int), ("inputs", _t_p * MAX_INPUTS), ("outputs", _t_p * MAX_OUTPUTS),
                ("grad_outputs", _t_p * MAX_OUTPUTS), ("grad_inputs", _t_p * MAX_INPUTS), ("n_saved", ctypes.c_int),
                ("saved", _t_p * MAX_SAVED)]


_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Call))  # qkv_custom_fn


class _Op(ctypes.Structure):  # qkv_custom_op
    _fields_ = [("name", ctypes.c_char_p), ("n_inputs", ctypes.c_int), ("n_outputs", ctypes.c_int),
                ("forward", ctypes.c_void_p), ("backward", ctypes.c_void_p), ("user", ctypes.c_void_p)]


class CustomCall:
    """What a Python callback of one call sees: .inputs and .outputs (Tensors), .saved (the Tensors the forward
    saved with .save(...)), .name."""

    def __init__(self, ctx, raw):
        c = raw.contents
        self.name = c.name.decode()
        self.inputs = [Tensor(ctx, c.inputs[i]) for i in range(c.n_inputs)]
        self.outputs = [Tensor(ctx, c.outputs[i]) if c.outputs[i] else None for i in range(c.n_outputs)]
        self.saved = [Tensor(ctx, c.saved[i]) for i in range(c.n_saved)]
        self._raw = raw

    def save(self, *tensors):
        """Keep tensors (made by the forward, or kept tensors) for the backward, as call.saved."""
        if len(tensors) > MAX_SAVED:
            raise ValueError(f"qkv.CustomOp {self.name}: {len(tensors)} saved tensors, at most {MAX_SAVED}")
        c = self._raw.contents
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(f"qkv.CustomOp {self.name}: save() takes qkv.Tensors, got {type(t).__name__}")
            c.saved[i] = t._p()
        c.n_saved = len(tensors)
        self.saved = list(tensors)


class CustomOp:
    """A user-defined operator: CustomOp(name, forward, backward=None, n_inputs=1, n_outputs=1).

    forward(call, *inputs) returns the output Tensor (a tuple of n_outputs Tensors when n_outputs > 1), new
    tensors computed with qkv operators (recording is off inside); call.save(*tensors) keeps what the backward
    needs. backward(call, *grad_outputs) returns one gradient per input (a Tensor or numpy array of the input's
    shape, or None), which qkv adds into the inputs' gradients; call.inputs, call.outputs and call.saved are
    there. Tensors made in the backward live only during it. An exception in either becomes the context's error:
    the call (op(...) or backward()) raises QkvError naming the operator, with the exception as its cause.
    op(*inputs) runs it."""

    def __init__(self, name, forward, backward=None, n_inputs=1, n_outputs=1):
        if not callable(forward) or (backward is not None and not callable(backward)):
            raise TypeError(f"qkv.CustomOp {name}: forward (and backward, when given) must be callable")
        if not 1 <= n_inputs <= MAX_INPUTS or not 1 <= n_outputs <= MAX_OUTPUTS:
            raise ValueError(f"qkv.CustomOp {name}: {n_inputs} inputs and {n_outputs} outputs, at most "
                             f"{MAX_INPUTS} and {MAX_OUTPUTS}, at least 1")
        self.name, self.n_inputs, self.n_outputs = name, n_inputs, n_outputs
        self._forward, self._backward = forward, backward
        self._ctx = None  # the context of the call being run (C callbacks see only its pointer)
        self._c_forward = _FN(self._run_forward)
        self._c_backward = _FN(self._run_backward) if backward is not None else None
        self._op = _Op(name.encode(), n_inputs, n_outputs, ctypes.cast(self._c_forward, ctypes.c_void_p),
                       ctypes.cast(self._c_backward, ctypes.c_void_p) if self._c_backward else None, None)

    def _contexts(self):
        return self.__dict__.setdefault("_ctxs", {})

    def _run_forward(self, ctx_ptr, raw):
        ctx = self._contexts()[ctx_ptr]()
        try:
            call = CustomCall(ctx, raw)
            out = self._forward(call, *call.inputs)
            outs = (out,) if self.n_outputs == 1 else tuple(out)
            if len(outs) != self.n_outputs or not all(isinstance(t, Tensor) for t in outs):
                raise TypeError(f"forward returned {type(out).__name__}, not {self.n_outputs} qkv.Tensor(s)")
            for i, t in enumerate(outs):
                raw.contents.outputs[i] = t._p()
            return 0
        except BaseException as e:
            ctx._callback_failed(e)
            return lib.qkv_error(ctx._ptr)

    def _run_backward(self, ctx_ptr, raw):
        ctx = self._contexts()[ctx_ptr]()
        try:
            call = CustomCall(ctx, raw)
            c = raw.contents
            grads_out = [Tensor(ctx, c.grad_outputs[i]) if c.grad_outputs[i] else None for i in range(c.n_outputs)]
            grads = self._backward(call, *grads_out)
            grads = (grads,) if self.n_inputs == 1 and not isinstance(grads, (tuple, list)) else tuple(grads)
            if len(grads) != self.n_inputs:
                raise TypeError(f"backward returned {len(grads)} gradients for {self.n_inputs} inputs")
            for i, g in enumerate(grads):
                if g is None or not c.grad_inputs[i]:
                    continue  # no gradient given, or input i needs none
                dst = Tensor(ctx, c.grad_inputs[i]).numpy()
                src = g.numpy() if isinstance(g, Tensor) else np.asarray(g)
                if src.shape != dst.shape:
                    raise ValueError(f"backward's gradient {i} is {list(src.shape)}, input {i} is "
                                     f"{list(dst.shape)}")
                dst += src  # dL/d input i += the returned gradient
            return 0
        except BaseException as e:
            ctx._callback_failed(e)
            return lib.qkv_error(ctx._ptr)

    def __call__(self, *inputs):
        if len(inputs) != self.n_inputs:
            raise TypeError(f"qkv.CustomOp {self.name}: {self.n_inputs} inputs, got {len(inputs)}")
        ctx, ptrs = _args(self.name, *inputs)
        # C may call the backward until the tape is walked or the step ends: the context keeps this operator
        # (and so its ctypes callbacks) alive as long as it lives
        ctx._callbacks.add(self)
        self._contexts()[ctx._ptr] = weakref.ref(ctx)  # (the context holds this operator: no cycle)
        arr = (_t_p * self.n_inputs)(*ptrs)
        outs = (_t_p * self.n_outputs)()
        lib.qkv_custom(ctx._ptr, ctypes.addressof(self._op), arr, outs)
        ctx._check()
        if any(not o for o in outs):
            raise QkvError(1, f"qkv_custom: {self.name}: an output is NULL")
        result = tuple(ctx._wrap(o) for o in outs)
        return result[0] if self.n_outputs == 1 else result


__all__ = ["CustomOp", "CustomCall"]
