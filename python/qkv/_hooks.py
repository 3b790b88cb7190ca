"""Looking inside a model from Python (include/qkv/hooks.h and model.h's head ablation): hook points, Python
callables as hooks, the cache as numpy arrays, patching and ablation at any point. Attached to qkv.Model by
qkv/__init__.py."""
import ctypes
import os

import numpy as np

from . import Model, Tensor, _args, _t_p, lib

ABLATIONS = ["none", "zero", "mean", "resample"]  # qkv_ablation_kind, in order

# qkv_hook_fn: qkv_tensor *(*)(qkv_ctx *ctx, const char *name, qkv_tensor *value, void *user)
_HOOK_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, _t_p, ctypes.c_void_p)


def _hook_state(model):
    """What C holds pointers to while hooks are set: the ctypes callbacks and the kept patch sources."""
    state = model.__dict__.get("_hook_state")
    if state is None:
        state = model.__dict__["_hook_state"] = {"fns": [], "sources": []}
    return state


def hook_names(self):
    """The model's hook points in forward order (qkv_model_hook_name), TransformerLens's names."""
    return [lib.qkv_model_hook_name(self._p(), i).decode() for i in range(lib.qkv_model_hook_count(self._p()))]


def add_hook(self, name, fn):
    """Call fn(name, value) at the named point in every later forward until clear_hooks(). value is the
    activation, a step Tensor (its .numpy() a view valid in the call); fn returns None to leave it, or a Tensor of
    the same shape and dtype to replace it (built with qkv operators, so the gradient flows through it). An
    exception raised by fn stops the forward: the forward raises QkvError naming the point, with fn's exception
    as its __cause__."""
    if not callable(fn):
        raise TypeError(f"qkv.Model.add_hook: fn must be callable, got {type(fn).__name__}")
    ctx = self.ctx

    def call(_ctx, c_name, value, _user):
        try:
            out = fn(c_name.decode(), Tensor(ctx, value))
            if out is None:
                return None
            if not isinstance(out, Tensor):
                raise TypeError(f"the hook returned {type(out).__name__}, not None or a qkv.Tensor")
            return ctypes.cast(out._p(), ctypes.c_void_p).value
        except BaseException as e:  # never through C
            ctx._callback_failed(e)
            return None

    c_fn = _HOOK_FN(call)
    lib.qkv_model_add_hook(ctx._ptr, self._p(), os.fsencode(name), ctypes.cast(c_fn, ctypes.c_void_p), None)
    ctx._check()
    _hook_state(self)["fns"].append(c_fn)  # alive while C may call it (until clear_hooks or close)


def clear_hooks(self):
    """Remove every hook, patch and ablation set at a hook point (qkv_model_clear_hooks); the cache selection,
    inspection and ablate_head's switches stay."""
    lib.qkv_model_clear_hooks(self._p())
    state = _hook_state(self)
    for t in state["sources"]:
        lib.qkv_free(self.ctx._ptr, t)
    state["fns"], state["sources"] = [], []
    self.ctx._check()


def run_with_cache(self, ids, names="*", causal=True):
    """(logits, cache): run ids caching every point whose name matches the glob names ('*' any run of
    characters, '?' one; an exact name one point), cache a {name: numpy array} of copies (in qkv's layout,
    include/qkv/hooks.h) that outlive the step. The logits are a step Tensor."""
    t = self._ids(ids, "run_with_cache")
    logits = self.ctx._wrap(lib.qkv_model_run_with_cache(self.ctx._ptr, self._p(), t._p(), 1 if causal else 0,
                                                         os.fsencode(names)))
    cache = {}
    for name in self.hook_names():
        ptr = lib.qkv_model_cached(self.ctx._ptr, self._p(), name.encode())
        if not ptr:  # a point the glob did not select (QKV_ERR_STATE)
            lib.qkv_clear_error(self.ctx._ptr)
            continue
        cache[name] = np.array(Tensor(self.ctx, ptr).numpy())
    self.ctx._check()
    return logits, cache


def _source(self, source, fname):
    """source as a tensor that lives until clear_hooks: a copy (qkv_keep) of a Tensor or numpy array."""
    if isinstance(source, Tensor):
        _args(fname, source)
        if source.ctx is not self.ctx:
            raise ValueError(f"qkv.Model.{fname}: source is a tensor of another context")
        t = source
    else:
        dtype = self.config["dtype"]
        t = self.ctx.tensor(np.asarray(source), dtype=0 if dtype == "f32" else 1)
    kept = lib.qkv_keep(self.ctx._ptr, t._p())
    self.ctx._check()
    _hook_state(self)["sources"].append(kept)
    return kept


def patch(self, name, source, pos=-1, head=-1):
    """Replace the value at the named point by source's (a Tensor or numpy array of the point's shape, usually a
    cached value of another run) at position pos and head (-1: all), in every later forward until
    clear_hooks() (qkv_model_patch). source is copied: changing it afterwards changes nothing."""
    kept = _source(self, source, "patch")
    lib.qkv_model_patch(self.ctx._ptr, self._p(), os.fsencode(name), int(pos), int(head), kept)
    self.ctx._check()


def ablate(self, name, kind="zero", pos=-1, head=-1, source=None):
    """Ablate the named point at pos and head (-1: all) in every later forward until clear_hooks()
    (qkv_model_ablate): kind "zero", "mean" (over the batch) or "resample" (source's values, as patch)."""
    if kind not in ABLATIONS[1:]:
        raise ValueError(f"qkv.Model.ablate: kind {kind!r}, not one of {ABLATIONS[1:]}")
    if (source is None) != (kind != "resample"):
        raise ValueError(f"qkv.Model.ablate: kind {kind!r} " + ("needs a source" if kind == "resample" else
                                                                  "takes no source"))
    kept = _source(self, source, "ablate") if source is not None else None
    lib.qkv_model_ablate(self.ctx._ptr, self._p(), os.fsencode(name), int(pos), int(head), ABLATIONS.index(kind),
                         kept)
    self.ctx._check()


def ablate_head(self, layer, head, kind="zero"):
    """Ablate one head's output z in every later forward until clear_ablations() (qkv_model_ablate_head): kind
    "zero", "mean" (its mean over the batch and positions) or "none" (run as trained)."""
    if kind not in ("none", "zero", "mean"):
        raise ValueError(f"qkv.Model.ablate_head: kind {kind!r}, not one of ['none', 'zero', 'mean']")
    lib.qkv_model_ablate_head(self.ctx._ptr, self._p(), int(layer), int(head), ABLATIONS.index(kind))
    self.ctx._check()


def clear_ablations(self):
    """Undo every ablate_head (qkv_model_clear_ablations)."""
    lib.qkv_model_clear_ablations(self._p())


# qkv_metric_fn: double (*)(qkv_ctx *ctx, const qkv_tensor *logits, void *user)
_METRIC_FN = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p, _t_p, ctypes.c_void_p)
_BY = {None: 0, "pos": 1, "head": 2, "pos_head": 3}


def patch_sweep(self, hook, clean_ids, corrupted_ids, metric, by=None, causal=True):
    """Activation patching (qkv_model_patch_sweep): for each layer L (and position, head, by "pos", "head" or
    "pos_head"), run corrupted_ids with blocks.L.<hook> patched from clean_ids's run and evaluate metric(logits)
    (a Python callable returning a float) on it. A numpy f64 array [n_layer] ([n_layer, n], [n_layer, heads],
    [n_layer, n, heads]). An exception in metric stops the sweep: QkvError with it as the cause."""
    if by not in _BY:
        raise ValueError(f"qkv.Model.patch_sweep: by {by!r}, not one of {list(_BY)}")
    ctx = self.ctx
    clean, corrupted = self._ids(clean_ids, "patch_sweep"), self._ids(corrupted_ids, "patch_sweep")

    def call(_ctx, logits, _user):
        try:
            return float(metric(Tensor(ctx, logits)))
        except BaseException as e:  # never through C
            ctx._callback_failed(e)
            return float("nan")

    c_fn = _METRIC_FN(call)  # alive for the call: the sweep calls it only within
    table = ctx._wrap(lib.qkv_model_patch_sweep(ctx._ptr, self._p(), os.fsencode(hook), clean._p(), corrupted._p(),
                                                1 if causal else 0, _BY[by], ctypes.cast(c_fn, ctypes.c_void_p),
                                                None))
    return np.array(table.numpy())


def logit_lens(self, ids, causal=True):
    """The logit lens (qkv_model_logit_lens): a numpy array [n_layer + 1, B, n, vocab], row 0 from the embedding,
    row L + 1 from block L's output, each through ln_final and the unembedding; the last row is the logits."""
    t = self._ids(ids, "logit_lens")
    return np.array(self.ctx._wrap(lib.qkv_model_logit_lens(self.ctx._ptr, self._p(), t._p(),
                                                            1 if causal else 0)).numpy())


def logit_attribution(self, ids, pos, token_a, token_b, causal=True):
    """Direct logit attribution of logit[token_a] - logit[token_b] at position pos
    (qkv_model_logit_attribution): (labels, values), values a numpy f64 array [B, parts + 1] whose last column
    is the model's own difference, the parts (labels: "embed", "L0H1", "blocks.0.mlp", ...) adding up to it."""
    t = self._ids(ids, "logit_attribution")
    values = np.array(self.ctx._wrap(lib.qkv_model_logit_attribution(self.ctx._ptr, self._p(), t._p(),
                                                                     1 if causal else 0, int(pos), int(token_a),
                                                                     int(token_b))).numpy())
    labels = []
    buf = ctypes.create_string_buffer(128)
    for i in range(lib.qkv_model_attribution_count(self._p())):
        lib.qkv_model_attribution_label(self._p(), i, buf, len(buf))
        labels.append(buf.value.decode())
    return labels, values


for _f in (hook_names, add_hook, clear_hooks, run_with_cache, patch, ablate, ablate_head, clear_ablations,
           patch_sweep, logit_lens, logit_attribution):
    setattr(Model, _f.__name__, _f)

__all__ = ["ABLATIONS"]
