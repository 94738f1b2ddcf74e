"""Scaling-law fits: predict the loss of a run from smaller runs, before paying for it.

The parametric law of Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models",
section 3.3, approach 3; equation 2):

    L(N, D) = E + A / N^alpha + B / D^beta

N: parameters, D: training tokens, L: validation loss in nats per token. E is the irreducible
loss of the data (with this tokenizer), A / N^alpha the shortfall of a finite model, B / D^beta
that of finite training. Fitted as the paper does (appendix D.2): minimise the Huber loss
(delta 1e-3) between log L_hat and the observed log L, with L_hat written as
LSE(a - alpha log N, b - beta log D, e) (A = exp a, B = exp b, E = exp e), by L-BFGS from a grid
of starting points, keeping the best. The uncertainty band comes from a bootstrap over runs
(resample the runs with replacement, refit, read each prediction's 5th-95th percentile).

Conventions (stated, because they change the numbers):
- N counts the non-embedding parameters (token and position embedding tables excluded, as
  Kaplan et al. 2020, section 2.1): with the tiny vocabularies and models of a CPU sweep, the
  embedding table is most of the parameters and does not scale the way the blocks do.
- Compute C = 6 N D FLOPs (Kaplan et al. 2020, section 2.1; Hoffmann et al. 2022, section 3).
- The compute-optimal split of a budget C is Hoffmann et al.'s equation 4:
  N_opt = G (C/6)^(beta/(alpha+beta)), D_opt = (C/6) / N_opt, G = (alpha A / (beta B))^(1/(alpha+beta)).

Honest limits: a fit needs at least as many runs as it has parameters (5) and at least two
distinct N and two distinct D; every answer names the range of N, D and C it saw, and carries a
warning when it extrapolates more than EXTRAPOLATION_FACTOR beyond the largest (or below the
smallest) N, D or C that the fit saw.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import yaml

from gptforge.config import ModelConfig
from gptforge.errors import InputError, MissingInputError

N_FIT_PARAMS = 5
"""E, A, alpha, B, beta."""

EXTRAPOLATION_FACTOR = 4.0
"""A question whose N, D or compute lies more than this factor beyond the largest (or below the
smallest) value the fit saw gets a warning. 4x compute (2x N and 2x D) is within the limit."""

HUBER_DELTA = 1e-3
"""Huber loss threshold on log-loss residuals (Hoffmann et al. 2022, appendix D.2)."""

RESULT_FILE = "final_eval.json"
"""Per-run file that `gptforge sweep` writes: the final val loss over every val token."""


@dataclass
class RunPoint:
    """One finished run as the fit sees it."""

    name: str
    """The run directory (or a label)."""
    n_params: float
    """Non-embedding parameters N."""
    tokens: float
    """Training tokens D."""
    loss: float
    """Final validation loss, nats per token."""
    tokenizer: str | None = None
    """sha256 of the tokenizer (runs with different tokenizers are not comparable)."""
    data: str | None = None
    """sha256 of the data's meta.json (runs on different data are not comparable)."""
    status: str = "finished"
    """'finished', or why it is excluded: 'diverged', 'stopped early (REASON)'."""
    model: dict | None = None
    """The run's resolved model config, when read from a run directory."""

    @property
    def flops(self) -> float:
        return 6.0 * self.n_params * self.tokens


def non_embedding_params(cfg: ModelConfig) -> int:
    """N for the fit: `GPT(cfg)`'s parameters less the token and position embedding tables."""
    from gptforge.plan.params import param_count, param_shapes

    cfg = cfg.resolved()
    emb = sum(p.numel for p in param_shapes(cfg) if p.role == "embedding")
    return param_count(cfg) - emb


def predict_loss(params: dict, n, d):
    """L(N, D) for fitted `params` (keys E, A, alpha, B, beta); n, d scalars or arrays."""
    n = np.asarray(n, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    return params["E"] + params["A"] / n ** params["alpha"] + params["B"] / d ** params["beta"]


def _huber(r: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    a = np.abs(r)
    quad = a <= delta
    value = np.where(quad, 0.5 * r * r, delta * (a - 0.5 * delta))
    grad = np.where(quad, r, delta * np.sign(r))
    return value, grad


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray, delta: float):
    """Huber loss of LSE(a - alpha log N, b - beta log D, e) - log L, and its gradient."""
    a, b, e, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])  # (3, R)
    m = terms.max(axis=0)
    w = np.exp(terms - m)
    s = w.sum(axis=0)
    lse = m + np.log(s)
    p = w / s  # softmax weights, d lse / d term
    value, g = _huber(lse - log_l, delta)
    grad = np.array([
        (g * p[0]).sum(),
        (g * p[1]).sum(),
        (g * p[2]).sum(),
        (g * p[0] * -log_n).sum(),
        (g * p[1] * -log_d).sum(),
    ])
    return float(value.sum()), grad


def _start_grid() -> list[np.ndarray]:
    """Starting points (a, b, e, alpha, beta), like Hoffmann et al.'s grid (appendix D.2); the fit
    ranks them by the objective and runs L-BFGS from the best few."""
    return [np.array(t, dtype=np.float64) for t in itertools.product(
        (0.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0), (0.0, 2.5, 5.0, 7.5, 10.0, 15.0, 20.0), (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5),
        (0.1, 0.25, 0.4, 0.6, 0.8), (0.1, 0.25, 0.4, 0.6, 0.8))]


def _fit_theta(log_n, log_d, log_l, starts: list[np.ndarray], delta: float) -> tuple[np.ndarray, float]:
    try:
        from scipy.optimize import minimize
    except ImportError as e:  # pragma: no cover - scipy is in the `fit` extra
        raise MissingInputError("scaling-law fits need scipy: pip install 'gptforge[fit]'") from e
    if len(starts) > 8:  # rank the grid by the objective (cheap), optimise from the 8 best
        starts = sorted(starts, key=lambda x0: _objective(x0, log_n, log_d, log_l, delta)[0])[:8]
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - only a speed matter
        import contextlib

        def threadpool_limits(limits):
            return contextlib.nullcontext()

    bounds = [(None, None), (None, None), (None, None), (0.0, 3.0), (0.0, 3.0)]
    # BLAS threads spinning over 5-element vectors make L-BFGS-B 10x slower on a loaded machine.
    with threadpool_limits(1):
        best, best_v = _minimize_from(minimize, starts, bounds, log_n, log_d, log_l, delta)
    return best, best_v


def _minimize_from(minimize, starts, bounds, log_n, log_d, log_l, delta):
    best, best_v = None, math.inf
    for x0 in starts:
        r = minimize(_objective, x0, args=(log_n, log_d, log_l, delta), jac=True, method="L-BFGS-B",
                     bounds=bounds, options={"maxiter": 1000, "ftol": 1e-15, "gtol": 1e-12})
        if np.all(np.isfinite(r.x)) and r.fun < best_v:
            best, best_v = r.x, float(r.fun)
    return best, best_v


def _theta_to_params(theta: np.ndarray) -> dict:
    a, b, e, alpha, beta = (float(v) for v in theta)
    return {"E": math.exp(e), "A": math.exp(a), "alpha": alpha, "B": math.exp(b), "beta": beta}


@dataclass
class Fit:
    """A fitted L(N, D) with its bootstrap replicates and the range of runs it saw."""

    params: dict
    """E, A, alpha, B, beta of the best fit on all runs."""
    bootstrap: list[dict]
    """Fitted params of each bootstrap resample of the runs."""
    runs: list[RunPoint]
    """The runs used."""
    excluded: list[RunPoint] = field(default_factory=list)
    """Runs left out (diverged, stopped early), with their status."""
    huber_loss: float = 0.0

    # -- the range the fit saw ------------------------------------------------------------------

    def seen(self) -> dict:
        """Number of runs and min/max of N, D and C (= 6ND) over the runs used."""
        n = [r.n_params for r in self.runs]
        d = [r.tokens for r in self.runs]
        c = [r.flops for r in self.runs]
        return {"runs": len(self.runs), "n_min": min(n), "n_max": max(n), "d_min": min(d), "d_max": max(d),
                "c_min": min(c), "c_max": max(c)}

    def extrapolation_warnings(self, n: float | None = None, d: float | None = None,
                               c: float | None = None) -> list[str]:
        """One line per quantity of the question that lies beyond EXTRAPOLATION_FACTOR x the range seen."""
        s, out, f = self.seen(), [], EXTRAPOLATION_FACTOR * (1 + 1e-9)
        for label, value, lo, hi in (("N (non-embedding parameters)", n, s["n_min"], s["n_max"]),
                                     ("D (tokens)", d, s["d_min"], s["d_max"]),
                                     ("compute (6ND FLOPs)", c, s["c_min"], s["c_max"])):
            if value is None:
                continue
            if value > hi * f:
                out.append(f"{label} {value:.3g} is {value / hi:.1f}x the largest the fit saw ({hi:.3g}); "
                           f"beyond {EXTRAPOLATION_FACTOR:g}x the prediction is an extrapolation: run larger sweep runs")
            elif value < lo / f:
                out.append(f"{label} {value:.3g} is {lo / value:.1f}x below the smallest the fit saw ({lo:.3g})")
        return out

    # -- questions -------------------------------------------------------------------------------

    def _band(self, fn) -> tuple[float, float, float]:
        """(value on the main fit, 5th percentile, 95th percentile over the bootstrap)."""
        v = float(fn(self.params))
        reps = np.array([float(fn(p)) for p in self.bootstrap], dtype=np.float64)
        reps = reps[np.isfinite(reps)]
        if len(reps) == 0:
            return v, math.nan, math.nan
        return v, float(np.percentile(reps, 5)), float(np.percentile(reps, 95))

    def loss(self, n: float, d: float) -> dict:
        """Predicted loss (nats/token) of a model of N non-embedding parameters trained on D tokens,
        with its 90% bootstrap interval and the extrapolation warnings."""
        v, lo, hi = self._band(lambda p: predict_loss(p, n, d))
        return {"n_params": n, "tokens": d, "flops": 6 * n * d, "loss": v, "loss_low": lo, "loss_high": hi,
                "warnings": self.extrapolation_warnings(n, d, 6 * n * d)}

    def compute_optimal(self, flops: float) -> dict:
        """Compute-optimal N and D for a budget of `flops` (C = 6ND; Hoffmann et al. 2022, eq. 4),
        with 90% bootstrap intervals and the loss the law predicts there."""
        def n_opt(p):
            a, b = p["alpha"], p["beta"]
            if a <= 0 or b <= 0:
                return math.nan
            g = (a * p["A"] / (b * p["B"])) ** (1.0 / (a + b))
            return g * (flops / 6.0) ** (b / (a + b))

        n, n_lo, n_hi = self._band(n_opt)
        d = flops / 6.0 / n
        loss, l_lo, l_hi = self._band(lambda p: predict_loss(p, n_opt(p), flops / 6.0 / n_opt(p)))
        return {"flops": flops, "n_params": n, "n_params_low": n_lo, "n_params_high": n_hi, "tokens": d,
                "tokens_low": flops / 6.0 / n_hi if n_hi else math.nan,
                "tokens_high": flops / 6.0 / n_lo if n_lo else math.nan,
                "loss": loss, "loss_low": l_lo, "loss_high": l_hi,
                "warnings": self.extrapolation_warnings(n, d, flops)}

    def tokens_for_loss(self, target: float, n: float) -> dict:
        """Tokens D a model of N non-embedding parameters needs to reach loss `target`:
        D = (B / (target - E - A / N^alpha))^(1/beta). `reachable` False (and tokens None) when the
        target is at or below the model's floor E + A / N^alpha, or below E itself (then no model
        reaches it with this data and recipe)."""
        p = self.params
        floor = p["E"] + p["A"] / n ** p["alpha"]
        out = {"target_loss": target, "n_params": n, "E": p["E"], "floor": floor, "reachable": target > floor}
        if target <= p["E"]:
            out.update(tokens=None, reason=(f"target loss {target:.4f} is below the fitted irreducible loss "
                                            f"E = {p['E']:.4f}: unreachable with this data and recipe, at any "
                                            "model size and token count"))
            out["warnings"] = []
            return out
        if target <= floor:
            out.update(tokens=None, reason=(f"target loss {target:.4f} is below this model's floor "
                                            f"E + A/N^alpha = {floor:.4f}: unreachable at N = {n:.3g} with any "
                                            "token count; use a larger model"))
            out["warnings"] = []
            return out

        def d_of(q):
            gap = target - q["E"] - q["A"] / n ** q["alpha"]
            return (q["B"] / gap) ** (1.0 / q["beta"]) if gap > 0 and q["beta"] > 0 else math.inf

        d, d_lo, d_hi = self._band(d_of)
        out.update(tokens=d, tokens_low=d_lo, tokens_high=d_hi, flops=6 * n * d,
                   warnings=self.extrapolation_warnings(n, d, 6 * n * d))
        return out

    def min_compute_for_loss(self, target: float) -> dict:
        """The least compute that reaches `target` on the compute-optimal frontier, with its N and D
        (bisection on log C of the frontier's loss, which falls monotonically with C)."""
        p = self.params
        if target <= p["E"]:
            return {"target_loss": target, "reachable": False, "flops": None,
                    "reason": (f"target loss {target:.4f} is below the fitted irreducible loss E = {p['E']:.4f}: "
                               "unreachable with this data and recipe")}
        lo, hi = math.log(1e3), math.log(1e40)
        if self.compute_optimal(math.exp(hi))["loss"] > target:
            return {"target_loss": target, "reachable": False, "flops": None,
                    "reason": "not reached below 1e40 FLOPs on the fitted frontier"}
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if self.compute_optimal(math.exp(mid))["loss"] > target:
                lo = mid
            else:
                hi = mid
        out = self.compute_optimal(math.exp(hi))
        out.update(target_loss=target, reachable=True)
        return out

    def to_dict(self) -> dict:
        return {"law": "L(N, D) = E + A / N^alpha + B / D^beta (Hoffmann et al. 2022, approach 3)",
                "n_convention": "non-embedding parameters", "params": self.params,
                "params_low": self._param_band(5), "params_high": self._param_band(95),
                "huber_loss": self.huber_loss, "seen": self.seen(),
                "bootstrap_resamples": len(self.bootstrap), "extrapolation_factor": EXTRAPOLATION_FACTOR,
                "runs": [asdict(r) | {"flops": r.flops} for r in self.runs],
                "excluded": [asdict(r) for r in self.excluded]}

    def _param_band(self, q: float) -> dict:
        if not self.bootstrap:
            return {}
        return {k: float(np.percentile([b[k] for b in self.bootstrap], q)) for k in self.params}


def fit_scaling_law(runs: Iterable[RunPoint], bootstrap: int = 100, seed: int = 0,
                    delta: float = HUBER_DELTA) -> Fit:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta to finished runs (see the module docstring).

    Runs whose `status` is not 'finished' are excluded (listed in Fit.excluded). `bootstrap`
    resamples of the runs (with replacement) are refitted from the main fit's optimum, for the
    intervals.

    Raises:
        InputError: fewer usable runs than the law's 5 parameters, fewer than 2 distinct N or D,
            non-positive N, D or loss, or runs with different tokenizers or data (their losses are
            not comparable).
    """
    runs = list(runs)
    used = [r for r in runs if r.status == "finished"]
    excluded = [r for r in runs if r.status != "finished"]
    check_comparable(used)
    for r in used:
        if not (r.n_params > 0 and r.tokens > 0 and r.loss > 0 and math.isfinite(r.loss)):
            raise InputError(f"{r.name}: N, D and loss must be positive and finite "
                             f"(N={r.n_params}, D={r.tokens}, loss={r.loss})")
    note = ("; excluded: " + ", ".join(f"{r.name} ({r.status})" for r in excluded)) if excluded else ""
    if len(used) < N_FIT_PARAMS:
        raise InputError(f"a fit of L(N, D) needs at least {N_FIT_PARAMS} finished runs (it has {N_FIT_PARAMS} "
                         f"parameters), got {len(used)}{note}; run a larger sweep (gptforge sweep)")
    if len({r.n_params for r in used}) < 2 or len({r.tokens for r in used}) < 2:
        raise InputError("a fit of L(N, D) needs runs of at least 2 model sizes and 2 token counts; got "
                         f"N in {sorted({r.n_params for r in used})}, D in {sorted({r.tokens for r in used})}")
    log_n = np.log([r.n_params for r in used])
    log_d = np.log([r.tokens for r in used])
    log_l = np.log([r.loss for r in used])
    theta, value = _fit_theta(log_n, log_d, log_l, _start_grid(), delta)
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(bootstrap):
        idx = rng.integers(0, len(used), len(used))
        if len(set(log_n[idx])) < 2 or len(set(log_d[idx])) < 2:
            continue  # an unidentifiable resample (one size or one token count): skip it
        t, _ = _fit_theta(log_n[idx], log_d[idx], log_l[idx], [theta], delta)
        if t is not None:
            reps.append(_theta_to_params(t))
    return Fit(params=_theta_to_params(theta), bootstrap=reps, runs=used, excluded=excluded, huber_loss=value)


def check_comparable(runs: list[RunPoint]) -> None:
    """Raise InputError when runs used different tokenizers or data (losses not comparable)."""
    for key, what in (("tokenizer", "tokenizers"), ("data", "data")):
        groups: dict = {}
        for r in runs:
            groups.setdefault(getattr(r, key), []).append(r.name)
        known = {k: v for k, v in groups.items() if k is not None}
        if len(known) > 1:
            detail = "; ".join(f"{str(k)[:12]}: {', '.join(v[:3])}{' ...' if len(v) > 3 else ''}"
                               for k, v in known.items())
            raise InputError(f"runs from different {what} cannot be fitted together (their losses are not "
                             f"comparable): {detail}; fit each group separately")


# -- reading runs from disk -----------------------------------------------------------------------


def read_run(run_dir: Path) -> RunPoint:
    """A RunPoint from a run directory (config.yaml + final_eval.json, or metrics.jsonl).

    The loss is final_eval.json's `val_loss` (every val token, written by `gptforge sweep`), else
    the last `val_loss` in metrics.jsonl (the trainer's eval windows). Status: 'diverged' when a
    loss is non-finite or the final val loss is 10% above the run's best; 'stopped early (...)'
    when the run ended before train.max_steps.

    Raises:
        MissingInputError: no config.yaml, or no val loss at all.
        DamagedFileError: unreadable config.yaml or metrics.jsonl.
    """
    from gptforge.errors import DamagedFileError

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise MissingInputError(f"{run_dir}: no config.yaml; give a run directory (gptforge pretrain --out) or a "
                                "sweep directory (gptforge sweep --out)")
    try:
        cfg = yaml.safe_load(cfg_path.read_text())
    except yaml.YAMLError as e:
        raise DamagedFileError(f"{cfg_path}: not valid YAML ({e})") from e
    model = ModelConfig(**{k: v for k, v in (cfg.get("model") or {}).items() if v is not None})
    data = cfg.get("data") or {}
    max_steps = int((cfg.get("train") or {}).get("max_steps", 0))
    rows = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.is_file():
        for i, line in enumerate(metrics.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DamagedFileError(f"{metrics}:{i}: not JSON ({e})") from e
    steps = [r for r in rows if "step" in r and "loss" in r]
    vals = [float(r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    result_path = run_dir / RESULT_FILE
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    if result is not None:
        loss, tokens = float(result["val_loss"]), float(result["tokens"])
        step = result.get("step")  # None when the run failed before reporting one
        last_step = int(step) if step is not None else (int(steps[-1]["step"]) if steps else 0)
    else:
        if not vals:
            raise MissingInputError(f"{run_dir}: no validation loss (no {RESULT_FILE}, no val_loss in metrics.jsonl)")
        loss = vals[-1]
        tokens = float(steps[-1]["tokens_seen"]) if steps else 0.0
        last_step = int(steps[-1]["step"]) if steps else 0
    losses = [float(r["loss"]) for r in steps] + vals + [loss]
    stopped = result.get("stopped") if result is not None else None
    if (stopped == "non_finite" or any(not math.isfinite(v) for v in losses)
            or (vals and loss > 1.1 * min(vals))):
        status = "diverged"
    elif max_steps and last_step < max_steps:
        status = f"stopped early (step {last_step} of {max_steps})"
    elif stopped not in (None, "max_steps"):
        status = f"stopped early ({stopped})"
    else:
        status = "finished"
    return RunPoint(name=str(run_dir), n_params=float(non_embedding_params(model)), tokens=tokens, loss=loss,
                    tokenizer=data.get("tokenizer_sha256"), data=data.get("meta_sha256"), status=status,
                    model=cfg.get("model"))


def find_runs(paths: Iterable[str | Path]) -> list[RunPoint]:
    """Every run under `paths`: a run directory itself, or a folder (a sweep) whose subfolders
    are run directories (those without a val loss yet, e.g. not started, are skipped).

    Raises:
        MissingInputError: a path that does not exist or holds no run.
    """
    out: list[RunPoint] = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise MissingInputError(f"{p}: no such run or sweep directory")
        if (p / "config.yaml").is_file():
            out.append(read_run(p))
            continue
        found = False
        for sub in sorted(q for q in p.iterdir() if (q / "config.yaml").is_file()):
            try:
                out.append(read_run(sub))
                found = True
            except MissingInputError:
                continue  # a sweep run that has not produced a val loss yet
        if not found:
            raise MissingInputError(f"{p}: no run directories with a validation loss inside")
    return out


def model_shape(spec: str) -> tuple[int, int] | None:
    """(n_layer, d_model) of a `--model` shape LAYERSxD_MODEL (`8x256`), or None for anything else."""
    import re

    m = re.fullmatch(r"(\d+)x(\d+)", spec.strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


def question_model(spec: str, runs: list[RunPoint]) -> ModelConfig:
    """The model a question is about: a preset name, or a shape `LAYERSxD_MODEL` (e.g. `8x256`)
    in the recipe family of the fitted runs (their arch, block_size, vocabulary and head width).

    Raises:
        InputError: neither a preset nor a shape, or a shape without runs to take the rest from.
    """
    shape = model_shape(spec)
    if shape is None:
        try:
            return ModelConfig(preset=spec).resolved()
        except ValueError as e:
            raise InputError(f"--model: {e}; or give a shape LAYERSxD_MODEL such as 8x256") from e
    ref = next((r.model for r in runs if r.model), None)
    if ref is None:
        raise InputError(f"--model {spec}: a shape needs run directories to take arch, block_size and vocabulary "
                         "from; give a preset instead")
    base = ModelConfig(**{k: v for k, v in ref.items() if v is not None}).resolved()
    n_layer, d_model = shape
    head_dim = base.d_model // base.n_head
    if d_model % head_dim:
        raise InputError(f"--model {spec}: d_model {d_model} is not a multiple of the runs' head width {head_dim}")
    n_head = d_model // head_dim
    kv = max(1, n_head * base.n_kv_head // base.n_head)
    return ModelConfig(**{**{k: v for k, v in ref.items() if v is not None}, "preset": None, "n_layer": n_layer,
                          "d_model": d_model, "n_head": n_head, "n_kv_head": kv, "d_ff": None}).resolved()


def plot_fit(fit: Fit, path: Path, question: dict | None = None) -> Path:
    """Loss vs compute (6ND) of every run, the fitted curve of each model size, and the
    compute-optimal frontier; written as a PNG with matplotlib, else as a plotly HTML file
    (the suffix is changed to .html then). Returns the path written.
    """
    path = Path(path)
    s = fit.seen()
    c_grid = np.logspace(math.log10(s["c_min"] / 2), math.log10(s["c_max"] * EXTRAPOLATION_FACTOR * 2), 80)
    sizes = sorted({r.n_params for r in fit.runs})
    frontier = [fit.compute_optimal(float(c))["loss"] for c in c_grid]
    series = []
    for n in sizes:
        pts = sorted((r.flops, r.loss) for r in fit.runs if r.n_params == n)
        series.append((f"N={n:.3g}", pts, [float(predict_loss(fit.params, n, c / 6 / n)) for c in c_grid]))
    title = (f"L = {fit.params['E']:.3f} + {fit.params['A']:.3g}/N^{fit.params['alpha']:.3f} + "
             f"{fit.params['B']:.3g}/D^{fit.params['beta']:.3f}  ({s['runs']} runs)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        import plotly.graph_objects as go

        from gptforge.atomic import atomic_write_text

        fig = go.Figure()
        for label, pts, curve in series:
            fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name=label)
            fig.add_scatter(x=c_grid, y=curve, mode="lines", name=f"fit {label}")
        fig.add_scatter(x=c_grid, y=frontier, mode="lines", name="compute-optimal frontier", line={"dash": "dash"})
        if question:
            fig.add_scatter(x=[question["flops"]], y=[question["loss"]], mode="markers", name="question")
        fig.update_layout(title=title, xaxis_type="log", xaxis_title="compute 6ND (FLOPs)", yaxis_title="val loss")
        path = path.with_suffix(".html")
        atomic_write_text(path, fig.to_html(include_plotlyjs=True))
        return path
    import io

    from gptforge.atomic import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, pts, curve) in enumerate(series):
        color = f"C{i % 10}"
        ax.plot(c_grid, curve, color=color, lw=1, alpha=0.7)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=color, label=label, s=18)
    ax.plot(c_grid, frontier, "k--", lw=1.2, label="compute-optimal frontier")
    if question and question.get("loss") is not None:
        ax.errorbar([question["flops"]], [question["loss"]],
                    yerr=[[max(0.0, question["loss"] - question["loss_low"])],
                          [max(0.0, question["loss_high"] - question["loss"])]],
                    fmt="r*", ms=10, label="question")
    ax.axvline(s["c_max"] * EXTRAPOLATION_FACTOR, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("compute 6ND (FLOPs)")
    ax.set_ylabel("val loss (nats/token)")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
