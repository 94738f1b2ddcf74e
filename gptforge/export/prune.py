"""Structured pruning of a trained GPT by activation importance (Minitron).

Follows Muralidharan et al. 2024, "Compact Language Models via Pruning and Knowledge
Distillation" (arXiv 2407.14679), section 2, as applied in Sreenivas et al. 2024, "LLM Pruning and
Distillation in Practice: The Minitron Approach" (arXiv 2408.11796), section 2: one forward pass
over a small calibration set scores every prunable structure by the activations it produces,
then the lowest-scoring ones are removed and the weights of the rest are kept unchanged.

Importance, each aggregated over the calibration tokens as mean over the sequence, then L2 norm
over the batch (the (batch=L2, seq=mean) aggregation of 2407.14679, section 2.2):
- attention head i of a layer: the L2 norm of its attention output (B, T, head_dim), the input
  of o_proj for that head;
- MLP channel i: |h_i|, h (B, T, d_ff) the input of down_proj (after the activation / SwiGLU product);
- embedding channel i: |x_i| of every norm layer's output (norm_1, norm_2 of every block and
  norm_f), summed over those layers;
- layer l (depth): Block Importance 1 - mean cos(x_in, x_out) of the block's input and output
  residual streams (Men et al. 2024, ShortGPT, section 3.1; 2408.11796 section 2 prunes depth
  with a layer score too): the layers that change the residual stream least go first.

Grouped-query attention stays consistent: either every KV head is kept and each group keeps the
same number of its best query heads (`heads_per_layer` a multiple of n_kv_head), or whole groups
(a KV head and its query heads) go, ranked by the summed scores of their heads
(`heads_per_layer` a multiple of the group size n_head / n_kv_head). The head width is kept, so
after pruning heads and embedding channels separately a Llama-family config records `head_size`
(exported as Hugging Face `head_dim` and GGUF `attention.key_length`). GPT-2 blocks have no
separate head width in any export format (n_head x head width = d_model there): pruning their
d_model sets the head count to d_model / head width, and a d_model that is not a multiple of it,
or a head count that disagrees, is refused. QK-norm gains (one per head dimension) are kept
whole; a value embedding keeps the columns of the kept KV heads.

Kept structures stay in their original order, so pruning to the model's own shape is the
identity: the same weights and bit-for-bit the same outputs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F

from gptforge.config import ModelConfig, to_dict
from gptforge.errors import InputError
from gptforge.export.calibration import calibration_batches, read_split
from gptforge.export.run_dir import write_run
from gptforge.model.gpt import GPT, Block
from gptforge.progress import progress as show_progress


@dataclass
class PruneShape:
    """Target shape; None keeps the model's value."""

    n_layer: int | None = None
    heads_per_layer: int | None = None
    d_ff: int | None = None
    d_model: int | None = None


@dataclass
class Importance:
    """Activation scores from `activation_importance` (higher = more important)."""

    heads: torch.Tensor
    """(n_layer, n_head)."""
    channels: torch.Tensor
    """MLP channels (n_layer, d_ff)."""
    embedding: torch.Tensor
    """Embedding channels (d_model,)."""
    layers: torch.Tensor
    """Block importance (n_layer,)."""
    tokens: int
    """Calibration tokens seen."""


def _agg(a: torch.Tensor) -> torch.Tensor:
    """(B, T, K) non-negative scores -> (K,) sum over the batch of (mean over T)^2 (squared L2 over
    the batch, rooted once all batches are in)."""
    return a.float().mean(dim=1).pow(2).sum(dim=0)


@torch.no_grad()
def activation_importance(model: GPT, batches: list[torch.Tensor], progress: bool = False) -> Importance:
    """Score heads, MLP channels, embedding channels and layers of `model` on `batches`
    (each (B, T) int64) with forward hooks; see the module docstring. progress: show the
    calibration pass (`gptforge.progress`)."""
    cfg = model.config
    L, H, hd = cfg.n_layer, cfg.n_head, cfg.head_dim
    heads = torch.zeros(L, H)
    channels = torch.zeros(L, cfg.d_ff)
    emb = torch.zeros(cfg.d_model)
    cos_sum = torch.zeros(L)
    n_tok = 0
    hooks = []

    def on_o_proj(l):
        def hook(_m, args):
            y = args[0]
            heads[l] += _agg(y.view(*y.shape[:2], H, hd).float().norm(dim=-1))
        return hook

    def on_down(l):
        def hook(_m, args):
            channels[l] += _agg(args[0].abs())
        return hook

    def on_norm(_m, _args, out):
        emb.add_(_agg(out.abs()))

    def on_block(l):
        def hook(_m, args, out):
            cos_sum[l] += F.cosine_similarity(args[0].float(), out.float(), dim=-1).sum()
        return hook

    for l, blk in enumerate(model.blocks):
        block = cast(Block, blk)
        hooks.append(block.attn.o_proj.register_forward_pre_hook(on_o_proj(l)))
        hooks.append(block.mlp.down_proj.register_forward_pre_hook(on_down(l)))
        hooks.append(block.norm_1.register_forward_hook(on_norm))
        hooks.append(block.norm_2.register_forward_hook(on_norm))
        hooks.append(block.register_forward_hook(on_block(l)))
    hooks.append(model.norm_f.register_forward_hook(on_norm))
    was_training = model.training
    model.eval()
    try:
        with show_progress("calibration pass", len(batches), "batches", enabled=progress) as bar:
            for x in batches:
                model(x)
                n_tok += x.numel()
                bar.advance()
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return Importance(heads=heads.sqrt(), channels=channels.sqrt(), embedding=emb.sqrt(),
                      layers=1.0 - cos_sum / max(n_tok, 1), tokens=n_tok)


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores, in increasing index order (ties: lower index first)."""
    order = torch.sort(scores, descending=True, stable=True).indices[:k]
    return order.sort().values


def head_plan(cfg: ModelConfig, heads: int) -> tuple[int, str]:
    """(n_kv_head after pruning to `heads` query heads per layer, mode) with mode "queries" (every
    KV head kept, each group keeps heads / n_kv_head query heads) or "groups" (whole groups go).

    Raises:
        InputError: `heads` out of range or dividing neither way (names --heads-per-layer).
    """
    H, K = cfg.n_head, cfg.n_kv_head
    g = H // K
    if not 1 <= heads <= H:
        raise InputError(f"--heads-per-layer {heads}: must be between 1 and the model's n_head {H}")
    if heads % K == 0:
        return K, "queries"
    if heads % g == 0:
        return heads // g, "groups"
    raise InputError(
        f"--heads-per-layer {heads} does not keep the GQA groups intact: the model has {H} query heads in {K} "
        f"KV groups of {g}; choose a multiple of {K} (fewer query heads per group) or of {g} (fewer groups)")


def kept_heads(cfg: ModelConfig, scores: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(query head indices (heads,), KV head indices) kept in one layer, from head scores (n_head,)."""
    H, K = cfg.n_head, cfg.n_kv_head
    g = H // K
    new_k, mode = head_plan(cfg, heads)
    by_group = scores.view(K, g)
    if mode == "queries":
        per = heads // K
        q = torch.cat([kv * g + _top(by_group[kv], per) for kv in range(K)])
        return q, torch.arange(K)
    kv = _top(by_group.sum(dim=1), new_k)
    q = (kv[:, None] * g + torch.arange(g)[None, :]).reshape(-1)
    return q, kv


def _rows(idx: torch.Tensor, width: int) -> torch.Tensor:
    """Row indices of whole heads `idx` of `width` rows each."""
    return (idx[:, None] * width + torch.arange(width)[None, :]).reshape(-1)


def pruned_config(cfg: ModelConfig, shape: PruneShape) -> ModelConfig:
    """The config after pruning to `shape` (head width kept; head_size set when it no longer
    equals d_model / n_head).

    Raises:
        InputError: a target larger than the model's, below 1, or heads breaking GQA groups.
    """
    for name, have in (("n_layer", cfg.n_layer), ("heads_per_layer", cfg.n_head), ("d_ff", cfg.d_ff),
                       ("d_model", cfg.d_model)):
        want = getattr(shape, name)
        if want is not None and not 1 <= want <= have:
            raise InputError(f"--{name.replace('_', '-')} {want}: must be between 1 and the model's {have}")
    d_model = shape.d_model or cfg.d_model
    heads = shape.heads_per_layer or (gpt2_heads(cfg, d_model) if cfg.arch == "gpt2" else cfg.n_head)
    if cfg.arch == "gpt2" and heads * cfg.head_dim != d_model:
        raise InputError(f"--heads-per-layer {heads} with --d-model {d_model}: GPT-2 blocks need n_head x head width "
                         f"({cfg.head_dim}) = d_model; use --heads-per-layer {d_model // cfg.head_dim or 1} and "
                         f"--d-model {(d_model // cfg.head_dim or 1) * cfg.head_dim}")
    n_kv, _ = head_plan(cfg, heads)
    head_size = None if heads * cfg.head_dim == d_model else cfg.head_dim
    return dataclasses.replace(cfg, preset=None, n_layer=shape.n_layer or cfg.n_layer, n_head=heads,
                               n_kv_head=n_kv, d_ff=shape.d_ff or cfg.d_ff, d_model=d_model,
                               head_size=head_size).resolved()


def gpt2_heads(cfg: ModelConfig, d_model: int) -> int:
    """The head count a GPT-2 of width `d_model` keeps: d_model / head width.

    Raises:
        InputError: d_model is not a multiple of the head width (names --d-model).
    """
    if d_model % cfg.head_dim:
        lo = max(cfg.head_dim, d_model // cfg.head_dim * cfg.head_dim)
        raise InputError(f"--d-model {d_model}: GPT-2 blocks need n_head x head width = d_model, and the head width "
                         f"is {cfg.head_dim}; choose a multiple of {cfg.head_dim} (e.g. {lo})")
    return d_model // cfg.head_dim


def count_params(cfg: ModelConfig) -> int:
    """Parameters of a GPT of config `cfg` (built on the meta device)."""
    with torch.device("meta"):
        return GPT(cfg).num_params()


def shape_for_params(cfg: ModelConfig, target: int) -> PruneShape:
    """Width-only shape (layers kept; heads, MLP and embedding channels shrunk by one common
    factor r) with the most parameters <= target, found by bisection on r. Minitron (2408.11796,
    section 4) found width pruning better than depth pruning at the same size after distillation.

    Raises:
        InputError: target above the model's parameter count, or too small for any shape.
    """
    have = count_params(cfg)
    if target > have:
        raise InputError(f"--target-params {target:,} is more than the model's {have:,} parameters")
    if target == have:
        return PruneShape()
    K, g = cfg.n_kv_head, cfg.n_head // cfg.n_kv_head
    allowed = sorted({h for h in range(1, cfg.n_head + 1) if h % K == 0 or h % g == 0})

    def shape(r: float) -> PruneShape:
        heads = min(allowed, key=lambda h: (abs(h - r * cfg.n_head), -h))
        if cfg.arch == "gpt2":  # the width follows the heads (n_head x head width = d_model)
            return PruneShape(heads_per_layer=heads, d_ff=max(1, round(r * cfg.d_ff)), d_model=heads * cfg.head_dim)
        return PruneShape(heads_per_layer=heads, d_ff=max(1, round(r * cfg.d_ff)),
                          d_model=max(2, round(r * cfg.d_model / 2) * 2))

    lo, hi, best = 0.0, 1.0, None
    for _ in range(40):
        mid = (lo + hi) / 2
        s = shape(mid)
        if count_params(pruned_config(cfg, s)) <= target:
            best, lo = s, mid
        else:
            hi = mid
    if best is None:
        raise InputError(f"--target-params {target:,}: no pruned shape of this model is that small; "
                         "give a larger target or prune layers with --n-layer")
    return best


@torch.no_grad()
def prune_model(model: GPT, imp: Importance, shape: PruneShape) -> tuple[GPT, dict]:
    """A new GPT of `pruned_config(model.config, shape)` holding the kept weights of `model`.

    Returns: (pruned model, {"layers": kept layer indices, "embedding": kept channel count, ...}).
    """
    cfg = model.config
    new = pruned_config(cfg, shape)
    layers = _top(imp.layers, new.n_layer)
    emb = _top(imp.embedding, new.d_model)
    hd = cfg.head_dim
    sd = model.state_dict()
    out: dict[str, torch.Tensor] = {}

    def take(name, rows=None, cols=None):
        t = sd[name]
        if rows is not None:
            t = t.index_select(0, rows)
        if cols is not None:
            t = t.index_select(1, cols)
        return t.clone()

    out["wte.weight"] = take("wte.weight", cols=emb)
    if "wpe.weight" in sd:
        out["wpe.weight"] = take("wpe.weight", cols=emb)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = take("lm_head.weight", cols=emb)
    for name in ("norm_f.weight", "norm_f.bias"):
        if name in sd:
            out[name] = take(name, rows=emb)
    for i, l in enumerate(layers.tolist()):
        src, dst = f"blocks.{l}.", f"blocks.{i}."
        q, kv = kept_heads(cfg, imp.heads[l], new.n_head)
        q_rows, kv_rows = _rows(q, hd), _rows(kv, hd)
        ch = _top(imp.channels[l], new.d_ff)
        plan = {"attn.q_proj": (q_rows, emb), "attn.k_proj": (kv_rows, emb), "attn.v_proj": (kv_rows, emb),
                "attn.o_proj": (emb, q_rows), "mlp.up_proj": (ch, emb), "mlp.gate_proj": (ch, emb),
                "mlp.down_proj": (emb, ch)}
        for mod, (rows, cols) in plan.items():
            if src + mod + ".weight" not in sd:
                continue
            out[dst + mod + ".weight"] = take(src + mod + ".weight", rows, cols)
            if src + mod + ".bias" in sd:
                out[dst + mod + ".bias"] = take(src + mod + ".bias", rows)
        for name in ("attn.q_norm.weight", "attn.k_norm.weight"):  # per head dimension: kept whole
            if src + name in sd:
                out[dst + name] = take(src + name)
        if src + "attn.v_embed.weight" in sd:
            out[dst + "attn.v_embed.weight"] = take(src + "attn.v_embed.weight", cols=kv_rows)
        for norm in ("norm_1", "norm_2"):
            for p in ("weight", "bias"):
                if f"{src}{norm}.{p}" in sd:
                    out[f"{dst}{norm}.{p}"] = take(f"{src}{norm}.{p}", rows=emb)
    with torch.device("meta"):
        pruned = GPT(new)
    dtype = model.norm_f.weight.dtype
    pruned = pruned.to(dtype).to_empty(device=model.norm_f.weight.device)
    if new.tie_embeddings:
        pruned.lm_head.weight = pruned.wte.weight
    missing, unexpected = pruned.load_state_dict(out, strict=False)
    missing = [k for k in missing if not (new.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"pruned state dict mismatch: missing {missing}, unexpected {unexpected}")
    pruned.reset_rope()
    info = {"layers_kept": layers.tolist(), "n_layer": new.n_layer, "n_head": new.n_head,
            "n_kv_head": new.n_kv_head, "d_ff": new.d_ff, "d_model": new.d_model, "head_size": new.head_dim}
    return pruned, info


@torch.no_grad()
def magnitude_prune(model: GPT, sparsity: float) -> dict:
    """Unstructured magnitude pruning, in place: the `sparsity` fraction of the blocks' linear
    weights with the smallest |w|, over all of them together, set to zero
    (`torch.nn.utils.prune.global_unstructured` with L1Unstructured, made permanent). The tensors
    stay dense: without sparse kernels the model is no smaller and no faster.

    Returns: {"sparsity_target", "zeros_in_block_linears" (fraction), "zeros_in_model" (fraction)}.

    Raises:
        InputError: sparsity outside [0, 1).
    """
    import torch.nn as nn
    from torch.nn.utils import prune as tprune

    if not 0.0 <= sparsity < 1.0:
        raise InputError(f"--sparsity {sparsity}: must be in [0, 1)")
    targets = [(m, "weight") for n, m in model.named_modules() if n.startswith("blocks.") and isinstance(m, nn.Linear)]
    if sparsity > 0:
        tprune.global_unstructured(targets, pruning_method=tprune.L1Unstructured, amount=sparsity)
        for m, name in targets:
            tprune.remove(m, name)
    zeros = sum(int((m.weight == 0).sum()) for m, _ in targets)
    total = sum(m.weight.numel() for m, _ in targets)
    all_zeros = sum(int((p == 0).sum()) for p in model.parameters())
    return {"sparsity_target": sparsity, "zeros_in_block_linears": zeros / total,
            "zeros_in_model": all_zeros / model.num_params()}


def sparsify_run(run: str | Path, out: str | Path, sparsity: float, overwrite: bool = False) -> dict:
    """`magnitude_prune` the run `run` and write it to `out` (an ordinary run; `pruning` in
    config.yaml and prune.json record the sparsity). Returns the report.

    Raises:
        InputError: a quantized run, or a bad sparsity. FileExistsError: `out` exists.
    """
    from gptforge.runtime.loading import load_for_inference

    model, ckpt, doc, tok = load_for_inference(run, "cpu")
    if doc.get("quantization"):
        raise InputError(f"{run}: a quantized run cannot be pruned; prune the original run, then quantize")
    if Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another --out or pass --overwrite")
    with show_progress("prune (magnitude)", 2, "steps", info="zeroing the smallest weights") as bar:
        report = {"source": str(ckpt), **magnitude_prune(model, sparsity)}
        bar.advance(info="writing the run")
        new_doc = {k: v for k, v in doc.items() if k != "finetune"}
        new_doc["pruning"] = {"source": str(ckpt), "method": "unstructured magnitude (dense storage)",
                              "sparsity": sparsity}
        write_run(model, new_doc, Path(out), tok, {"step": 0, "tokens_seen": 0, "pruned_from": str(ckpt)},
                  extra_json={"prune.json": report}, overwrite=overwrite)
        bar.advance()
    return report


def prune_run(run: str | Path, out: str | Path, calibration: str | Path, shape: PruneShape | None = None,
              target_params: int | None = None, batch_size: int = 4, num_batches: int = 16,
              split: str = "train", overwrite: bool = False) -> dict:
    """Prune run `run` to `shape` (or to at most `target_params` parameters) by the activation
    importance measured on `split` of shard folder `calibration`; write the smaller model as an
    ordinary run at `out` (config.yaml's model section is the new shape; `pruning` records what
    was done). It loads, evaluates, generates and fine-tunes like any run.

    Returns: the report (also written to `out`/prune.json): params before/after, the kept shape,
    kept layers, calibration tokens.

    Raises:
        InputError: both or neither of shape and target_params, a target larger than the model,
            heads breaking GQA groups, calibration data smaller than one batch of
            batch_size x block_size tokens, a quantized run. FileNotFoundError: no run / data.
        FileExistsError: `out` exists and not overwrite.
    """
    from gptforge.runtime.loading import load_for_inference

    if (shape is None) == (target_params is None):
        raise InputError("give either --target-params or a shape (--heads-per-layer/--d-ff/--n-layer/--d-model)")
    model, ckpt, doc, tok = load_for_inference(run, "cpu")
    if doc.get("quantization"):
        raise InputError(f"{run}: a quantized run cannot be pruned; prune the original run, then quantize")
    if Path(out).exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another --out or pass --overwrite")
    cfg = model.config
    if target_params is not None:
        shape = shape_for_params(cfg, target_params)
    pruned_config(cfg, shape)  # bad shapes fail before the calibration pass
    tokens = read_split(calibration, split, batch_size * cfg.block_size * num_batches + 1,
                        (doc.get("data") or {}).get("tokenizer_sha256"))
    batches = calibration_batches(tokens, cfg.block_size, batch_size, num_batches)
    imp = activation_importance(model, batches, progress=True)
    pruned, info = prune_model(model, imp, shape)
    report = {"source": str(ckpt), "params_before": model.num_params(), "params_after": pruned.num_params(),
              "target_params": target_params, "calibration": str(calibration), "calibration_tokens": imp.tokens,
              **info}
    new_doc = {k: v for k, v in doc.items() if k != "finetune"}  # adapters, if any, are merged
    new_doc["model"] = to_dict(pruned.config)
    new_doc["pruning"] = {"source": str(ckpt), "method": "activation importance (Minitron)",
                          "calibration": str(calibration), "layers_kept": info["layers_kept"]}
    with show_progress("writing the pruned run", 1, "runs") as bar:
        write_run(pruned, new_doc, Path(out), tok, {"step": 0, "tokens_seen": 0, "pruned_from": str(ckpt)},
                  extra_json={"prune.json": report}, overwrite=overwrite)
        bar.advance()
    return report

