"""The PyTorch bridge: a qkv model as a torch.nn.Module, and back.

    module = qkv.torch.to_module("model.safetensors")   # or a qkv.Model
    logits = module(ids)                                 # [B, n, vocab], as qkv_model_forward's
    qkv.torch.save_checkpoint(module, "trained.safetensors")

The module's parameters carry qkv's names, which are TransformerLens's (embed.W_E, blocks.0.attn.W_Q,
blocks.0.ln1.w, ...: module.state_dict()'s keys are qkv_model_param_names' list), and qkv's layout: every
weight is [d_in, d_out] and applied as y = x @ W, as TransformerLens's W_in, W_out and W_U are (the model
uses no nn.Linear, whose weight would be the transpose). W_Q, W_K, W_V are [d_model, n_head * d_head] and W_O
[n_head * d_head, d_model], not TransformerLens's per-head [n_head, d_model, d_head]. The computation is
python/qkv/torch_model.py's forward, the one PyTorch definition of the architecture.

save_checkpoint writes through the C library (a qkv model of the module's configuration gets the module's
parameters, then qkv_model_save), so qkv has one checkpoint writer. Dropout is not applied by the module
(its forward is the evaluation forward of qkv); the configuration's dropout is kept and written back.
"""
import math
import os

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover - the tests skip without torch
    raise ImportError("qkv.torch needs PyTorch (import torch failed: %s)" % e) from e

import numpy as np

import qkv as _qkv
from . import torch_model

__all__ = ["QkvTransformer", "to_module", "save_checkpoint", "next_token_targets"]

_TORCH_DTYPES = {"f32": torch.float32, "f64": torch.float64}
_QKV_DTYPES = {torch.float32: "f32", torch.float64: "f64"}


class _Holder(nn.Module):
    """A level of the parameter names (embed, blocks.0.attn, ...); printed with its parameters' shapes."""

    def extra_repr(self):
        return ", ".join(f"{name}: {list(p.shape)}" for name, p in self._parameters.items())


class QkvTransformer(nn.Module):
    """qkv's decoder (include/qkv/model.h) as an nn.Module. Made by to_module; .config is the qkv configuration
    (qkv.Model's keyword arguments: enums by name, attn_scale -inf for the default 1/sqrt(d_head)).

    forward(ids, targets=None, causal=True): the logits [B, n, vocab] (or [n, vocab] for ids [n]); with targets,
    (logits, loss), the loss being qkv_model_loss's (mean cross-entropy, negative targets ignored)."""

    def __init__(self, config, params):
        super().__init__()
        variant = config.get("attn_variant", "softmax")
        if variant not in torch_model.ATTN_VARIANTS:
            raise ValueError(f"qkv.torch: attn_variant {variant!r} has no PyTorch forward in qkv/torch_model.py "
                             f"(it computes {list(torch_model.ATTN_VARIANTS)})")
        self.config = dict(config)
        self._names = []
        for name, value in params.items():
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                child = getattr(owner, part, None) if part in owner._modules else None
                if child is None:  # made in the order of the names, so state_dict() keeps qkv's order
                    child = nn.ModuleList(_Holder() for _ in range(int(config["n_layer"]))) \
                        if owner is self and part == "blocks" else _Holder()
                    owner.add_module(part, child)
                owner = child
            owner.register_parameter(leaf, nn.Parameter(torch.as_tensor(value).clone()))
            self._names.append(name)

    def _twin_config(self):
        c = dict(self.config)
        if c["attn_scale"] == -math.inf:
            c["attn_scale"] = "default"
        return c

    def _ids(self, ids, what):
        t = torch.as_tensor(ids)
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"qkv.torch.QkvTransformer.{what}: ids must be integers, got {t.dtype}")
        t = t.long()
        if t.dim() not in (1, 2):
            raise ValueError(f"qkv.torch.QkvTransformer.{what}: ids must be [n] or [B, n], got {list(t.shape)}")
        n = t.shape[-1]
        if n < 1 or n > self.config["n_ctx"]:
            raise ValueError(f"qkv.torch.QkvTransformer.{what}: sequence length {n}, must be 1..n_ctx "
                             f"({self.config['n_ctx']})")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.config["vocab"]):
            raise ValueError(f"qkv.torch.QkvTransformer.{what}: ids must be in [0, {self.config['vocab']}), "
                             f"got {int(t.min())}..{int(t.max())}")
        return t

    def parameter_dict(self):
        """{qkv name: Parameter}, in qkv's order."""
        named = dict(self.named_parameters())
        return {name: named[name] for name in self._names}

    def forward(self, ids, targets=None, causal=True, hooks=None):
        t = self._ids(ids, "forward")
        batched = t.dim() == 2
        P = self.parameter_dict()
        dtype = P["embed.W_E"].dtype
        logits = torch_model.forward(self._twin_config(), P, t if batched else t[None], causal, hooks)
        logits = logits.to(dtype)
        if not batched:
            logits = logits[0]
        if targets is None:
            return logits
        return logits, self.loss(logits, targets)

    @staticmethod
    def loss(logits, targets):
        """qkv_model_loss: the mean cross-entropy over the positions whose target is >= 0."""
        tg = torch.as_tensor(targets).long().reshape(-1)
        flat = logits.reshape(-1, logits.shape[-1])
        if tg.shape[0] != flat.shape[0]:
            raise ValueError(f"qkv.torch.loss: {tg.shape[0]} targets for {flat.shape[0]} positions")
        return F.cross_entropy(flat, tg.masked_fill(tg < 0, -100), ignore_index=-100)

    def run_with_cache(self, ids, causal=True):
        """(logits, cache): every hook point of include/qkv/hooks.h of this forward, by its name, in qkv's
        layout (heads as [B*n_head, n, d_head]), as torch_model.forward records them."""
        cache = {}
        logits = self.forward(ids, causal=causal, hooks=cache)
        return logits, cache


def next_token_targets(ids):
    """qkv_next_token_targets: t[..., i] = ids[..., i+1], -1 (ignored) at the last position."""
    ids = torch.as_tensor(ids).long()
    out = torch.full_like(ids, -1)
    out[..., :-1] = ids[..., 1:]
    return out


def _attn_weights_name(model):
    cfg = _qkv.lib.qkv_model_get_config(model._p()).contents
    return cfg.attn_weights_name


def to_module(source, dtype=None):
    """An nn.Module (QkvTransformer) of the model in source: a checkpoint path or a qkv.Model. Its parameters
    are copies (training the module does not change a qkv.Model given). dtype: None for the model's own
    (f32 -> torch.float32, f64 -> torch.float64), or torch.float32 / torch.float64."""
    if dtype is not None and dtype not in _QKV_DTYPES:
        raise TypeError(f"qkv.torch.to_module: dtype {dtype} is not supported (torch.float32 or torch.float64)")
    if isinstance(source, _qkv.Model):
        model, ctx = source, None
    elif isinstance(source, (str, bytes, os.PathLike)):
        if not os.path.exists(source):
            raise FileNotFoundError(f"qkv.torch.to_module: no checkpoint at {os.fsdecode(source)}")
        ctx = _qkv.Context()
        model = _qkv.Model.load(ctx, source)
    else:
        raise TypeError(f"qkv.torch.to_module: expected a checkpoint path or a qkv.Model, got "
                        f"{type(source).__name__}")
    try:
        if _attn_weights_name(model):
            raise ValueError("qkv.torch.to_module: the model uses a user's attention weights "
                             f"({_attn_weights_name(model).decode()!r}), which have no PyTorch forward")
        config = model.config
        target = dtype or _TORCH_DTYPES[config["dtype"]]
        config["dtype"] = _QKV_DTYPES[target]
        params = {name: torch.from_numpy(np.array(t.numpy())).to(target) for name, t in model.params.items()}
        return QkvTransformer(config, params)
    finally:
        if ctx is not None:
            ctx.close()


def save_checkpoint(module, path, metadata=None):
    """Writes module (a QkvTransformer, or DistributedDataParallel / DataParallel around one) as a qkv
    checkpoint at path, through qkv_model_save (atomic). The checkpoint's dtype is the parameters' (all
    torch.float32 or all torch.float64); metadata: {key: value} strings of your own (keys not "qkv.*")."""
    inner = module.module if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)) else module
    if not isinstance(inner, QkvTransformer):
        raise TypeError(f"qkv.torch.save_checkpoint: expected a qkv.torch.QkvTransformer (from to_module), got "
                        f"{type(inner).__name__}")
    params = inner.parameter_dict()
    dtypes = {p.dtype for p in params.values()}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _QKV_DTYPES:
        bad = [f"{n} {p.dtype}" for n, p in params.items() if p.dtype not in _QKV_DTYPES] or sorted(map(str, dtypes))
        raise TypeError("qkv.torch.save_checkpoint: qkv checkpoints hold torch.float32 or torch.float64 "
                        f"parameters, all of one dtype; got {', '.join(bad[:3])}")
    config = dict(inner.config, dtype=_QKV_DTYPES[next(iter(dtypes))])
    ctx = _qkv.Context()
    try:
        model = _qkv.Model(ctx, **config)
        target = model.params
        if list(target) != list(params):
            missing = sorted(set(target) - set(params))
            extra = sorted(set(params) - set(target))
            raise ValueError(f"qkv.torch.save_checkpoint: the module's parameters are not the model's "
                             f"(missing {missing}, extra {extra})")
        for name, t in target.items():
            p = params[name].detach().cpu()
            if tuple(p.shape) != t.shape:
                raise ValueError(f"qkv.torch.save_checkpoint: {name} is {list(p.shape)}, the model's is "
                                 f"{list(t.shape)}")
            t.numpy()[...] = p.numpy()
        model.save(path, metadata=metadata)
    finally:
        ctx.close()
