"""docs/extending.md's examples, run.

The trainer's doors: a new objective and a new batch source, defined here, trained through the
real entry point (`gptforge.train.run.train`) with nothing else changed.

The data follows two rules: after a token at an even position comes (x + 1) mod V, after one at
an odd position (5 x + 3) mod V. The objective counts the loss at even positions only, so the
model learns the first rule and not the second: the even-position loss falls towards 0 while the
odd-position loss, which no gradient reaches, stays far above it.

The data doors (the second half): a curation step and a reader in a module of their own
(`TOY_PLUGIN`, written to a folder on sys.path as a user's package would be) run by
`gptforge prepare` with a recipe naming the step `toy_plugin:Shout`, in spawned workers; an
export format registered in `gptforge.export.formats.FORMATS`; a server endpoint on the app of
`gptforge.serve.app.create_app`.
"""


# No `from __future__ import annotations`: FastAPI reads the toy route's annotations at run time.
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime.loss import IGNORE_INDEX, token_loss_sum
from gptforge.train.objectives import Forward, ObjectiveBase, ObjectiveLoss
from gptforge.train.run import train
from gptforge.train.sources import BatchesBase, SourceBase
from tests.infer.conftest import trained, trained_run  # noqa: F401  (shared fixtures)

V, T = 16, 16


def rule_rows(n: int, seed: int) -> torch.Tensor:
    """n rows of T + 1 tokens following the even/odd rules from a random first token: (n, T + 1) int64."""
    rng = np.random.Generator(np.random.Philox(key=seed))
    rows = np.zeros((n, T + 1), dtype=np.int64)
    rows[:, 0] = rng.integers(0, V, size=n)
    for t in range(T):
        rows[:, t + 1] = (rows[:, t] + 1) % V if t % 2 == 0 else (5 * rows[:, t] + 3) % V
    return torch.from_numpy(rows)


def even_only(targets: torch.Tensor) -> torch.Tensor:
    """targets (b, T) with those at odd positions set to -100."""
    out = targets.clone()
    out[:, 1::2] = IGNORE_INDEX
    return out


class EvenPositions(ObjectiveBase):
    """Next-token loss at even positions only; unit: even-position targets. Metric: the share of
    even positions whose argmax prediction is right."""

    name = "even-position loss"
    unit = "tokens"
    metric_names = ("even/accuracy",)

    def __init__(self):
        self.micro_batches_seen = 0

    def count(self, micro_batch) -> int:
        return int((even_only(micro_batch[1]) != IGNORE_INDEX).sum())

    def loss(self, forward: Forward, micro_batch) -> ObjectiveLoss:
        x, y = micro_batch
        logits = forward(x)
        y = even_only(y)
        keep = y != IGNORE_INDEX
        right = (logits.argmax(-1) == y) & keep
        self.micro_batches_seen += 1
        return ObjectiveLoss(token_loss_sum(logits, y), {"even/accuracy": (float(right.sum()), float(keep.sum()))})

    def state_dict(self) -> dict:
        return {"micro_batches_seen": self.micro_batches_seen}

    def load_state_dict(self, state: dict) -> None:
        self.micro_batches_seen = state["micro_batches_seen"]


class RuleBatches(BatchesBase):
    def __init__(self, tc, dp_rank: int):
        self.mbs, self.accumulation, self.seed, self.dp_rank = (tc.micro_batch_size, tc.gradient_accumulation_steps,
                                                                tc.seed, dp_rank)
        self.seq_len = T
        self.global_batch_size = tc.micro_batch_size * tc.gradient_accumulation_steps
        self.tokens_per_step = self.global_batch_size * T

    def micro_batches(self, step: int) -> list:
        rows = rule_rows(self.mbs * self.accumulation, seed=self.seed * 100_003 + step)
        return [(r[:, :-1].contiguous(), r[:, 1:].contiguous()) for r in rows.split(self.mbs)]


class RuleSource(SourceBase):
    """Generated rows of the two rules; validation reports the even and the odd loss."""

    def __init__(self):
        self.vocab_size, self.tokenizer_file, self.has_val = V, None, True
        self.description = f"generated rows of {T + 1} tokens, vocabulary {V} (even/odd rules)"
        self.val = rule_rows(64, seed=999)
        self.last: dict[str, float] = {}

    def batches(self, block_size, tc, dp_rank, dp_size):
        return RuleBatches(tc, dp_rank)

    @torch.no_grad()
    def evaluate(self, model, device, precision, should_stop=None):
        was = model.training
        model.eval()
        logits = model(self.val[:, :-1].to(device)).float()
        model.train(was)
        y = self.val[:, 1:].to(device)
        odd = y.clone()
        odd[:, 0::2] = IGNORE_INDEX
        n_even, n_odd = int((even_only(y) != IGNORE_INDEX).sum()), int((odd != IGNORE_INDEX).sum())
        self.last = {"val/even_loss": float(token_loss_sum(logits, even_only(y))) / n_even,
                     "val/odd_loss": float(token_loss_sum(logits, odd)) / n_odd}
        return self.last["val/even_loss"]

    def val_metrics(self) -> dict[str, float]:
        return self.last

    def provenance(self) -> dict:
        return {"path": "generated", "rules": "even: x+1 mod V; odd: 5x+3 mod V"}

    def check_resume(self, saved, checkpoint) -> None:
        return None


def test_a_toy_objective_and_source_train_through_the_real_entry_point(tmp_path, one_thread):
    cfg = RunConfig(model=ModelConfig(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=T, dropout=0.0),
                    train=TrainConfig(max_steps=60, micro_batch_size=16, gradient_accumulation_steps=2, lr=1e-2,
                                      warmup_steps=5, eval_interval=20, checkpoint_interval=60, tensorboard=False,
                                      report=False, precision="fp32", device="cpu", seed=3))
    objective = EvenPositions()
    res = train(cfg, tmp_path / "unused", tmp_path / "run", progress=False, data=RuleSource(), objective=objective)
    rows = res.history
    assert res.step == 60 and rows[-1]["tokens_seen"] == 60 * 32 * T
    # The objective's unit and metric reach every row: its loss at the start is about ln V.
    assert abs(rows[0]["loss"] - math.log(V)) < 0.5
    assert rows[-1]["even/accuracy"] > 0.9 > rows[0]["even/accuracy"]
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [20, 40, 60]
    last = evals[-1]
    assert last["val_loss"] == last["val/even_loss"] < 0.3
    # Odd positions never enter the loss: the model did not learn their rule.
    assert last["val/odd_loss"] > 1.5 and last["val/odd_loss"] > 5 * last["val/even_loss"]
    # The objective's state rides in the checkpoint (gptforge.train.state).
    state = torch.load(tmp_path / "run" / "checkpoints" / "step_0000060" / "trainer_state.pt", weights_only=False)
    assert state["objective"] == {"micro_batches_seen": 120}


# ---------------------------------------------------------------------------------------------
# The data doors

TOY_PLUGIN = '''
"""An out-of-tree step and reader (docs/extending.md): a recipe names the step toy_plugin:Shout."""

from collections import Counter
from dataclasses import dataclass, field, replace

from gptforge.data.readers import Document, Reader
from gptforge.data.readers.files import open_binary


@dataclass
class Shout:
    """A DocumentStep: upper-cases a document, drops one shorter than `min_chars`."""

    min_chars: int = 1
    name: str = "shout"
    counts: Counter = field(default_factory=Counter)

    def __call__(self, doc):
        if len(doc.text) < self.min_chars:
            return "shorter than min_chars"
        self.counts["upper-cased"] += 1
        return replace(doc, text=doc.text.upper())


class ReversedLines(Reader):
    """.rev files: one document per line, written backwards (ids PATH:LINE)."""

    extensions = frozenset({".rev"})

    def read(self, path, stats, options, opener=None):
        with (opener() if opener else open_binary(path)) as fh:
            lines = fh.read().decode("utf-8").splitlines()
        for i, line in enumerate(lines, 1):
            if line.strip():
                stats.documents += 1
                yield Document(line[::-1], f"{path}:{i}", str(path))
'''


@pytest.fixture
def toy_plugin(tmp_path, monkeypatch):
    """The module `toy_plugin` importable (its folder on sys.path, which spawned workers inherit),
    imported, and its reader unregistered afterwards (READERS is process-wide)."""
    import importlib
    import sys

    from gptforge.data.readers import READERS

    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "toy_plugin.py").write_text(TOY_PLUGIN)
    monkeypatch.syspath_prepend(str(folder))
    module = importlib.import_module("toy_plugin")
    yield module
    READERS.remove(module.ReversedLines)
    sys.modules.pop("toy_plugin", None)


def test_an_out_of_tree_step_and_reader_run_in_prepare(toy_plugin, tmp_path, capsys):
    from gptforge.cli import main
    from gptforge.data.phases.pool import reader_modules
    from gptforge.data.tokenizer import Tokenizer

    assert reader_modules() == ("toy_plugin",)  # what each spawned worker imports first
    lines = [f"document number {i} says hello to the reader" for i in range(40)] + ["x", ""]
    corpus = tmp_path / "corpus.rev"
    corpus.write_text("\n".join(line[::-1] for line in lines) + "\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("steps:\n  - toy_plugin:Shout: {min_chars: 2}\n")
    out = tmp_path / "out"
    assert main(["prepare", str(corpus), "--out", str(out), "--recipe", str(recipe), "--workers", "2",
                 "--shard-bytes", "400", "--vocab-size", "300", "--val-fraction", "0", "--quiet"]) == 0, \
        capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    (shout,) = [st for st in report["steps"] if st["name"] == "shout"]
    assert shout["documents_in"] == 41 and shout["dropped"] == {"shorter than min_chars": 1}
    assert shout["counts"] == {"upper-cased": 40}
    tok = Tokenizer.from_file(out / "tokenizer.json")
    ids = np.concatenate([np.fromfile(out / f, dtype=np.dtype(json.loads((out / "meta.json").read_text())["dtype"]))
                          for f in json.loads((out / "meta.json").read_text())["splits"]["train"]["files"]])
    text = tok.decode(ids.tolist())
    assert "DOCUMENT NUMBER 7 SAYS HELLO TO THE READER" in text and "hello" not in text
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - toy_plugin:Whisper: {}\n")
    assert main(["prepare", str(corpus), "--out", str(tmp_path / "o2"), "--recipe", str(bad), "--quiet"]) == 1
    assert "toy_plugin has no dataclass 'Whisper'" in capsys.readouterr().err


def _write_npz(opts, dtype_name):
    """The toy format's writer: every weight of the source as one array of a .npz file."""
    from gptforge.export.common import DTYPES, load_source

    model, _sources = load_source(opts.source, DTYPES[dtype_name])
    out = Path(opts.out)
    out.mkdir(parents=True)
    np.savez(out / "weights.npz", **{k: v.detach().float().numpy() for k, v in model.state_dict().items()})
    return out


def test_an_export_format_registered_beside_the_built_in_ones(trained_run, tmp_path, monkeypatch):
    from gptforge.errors import OptionError
    from gptforge.export.common import load_source
    from gptforge.export.formats import FORMATS, ExportFormat, ExportOptions, export_model

    monkeypatch.setitem(FORMATS, "npz", ExportFormat("npz", _write_npz, default_dtype="f32", dtypes=("f32", "f16"),
                                                     dtype_refusal="numpy has no bfloat16"))
    path = export_model(ExportOptions(source=str(trained_run), format="npz", out=str(tmp_path / "x")))
    model, _ = load_source(trained_run)
    saved = np.load(path / "weights.npz")
    assert sorted(saved.files) == sorted(model.state_dict())
    for name, value in model.state_dict().items():
        assert np.array_equal(saved[name], value.float().numpy()), name
    with pytest.raises(OptionError, match="--dtype bf16 cannot be written in the npz format"):
        export_model(ExportOptions(source=str(trained_run), format="npz", out=str(tmp_path / "y"), dtype="bf16"))
    with pytest.raises(OptionError, match="--quantize q8_0 cannot be written in the npz format: it takes no"):
        export_model(ExportOptions(source=str(trained_run), format="npz", out=str(tmp_path / "y"), quantize="q8_0"))


def test_a_server_endpoint_on_the_served_app(trained, trained_run):
    from fastapi import APIRouter, Request
    from fastapi.testclient import TestClient
    from pydantic import BaseModel

    from gptforge.runtime.loading import load_for_inference
    from gptforge.serve.app import ServeConfig, create_app
    from gptforge.serve.openapi import route_doc
    from gptforge.serve.protocol import APIError

    class CountRequest(BaseModel):
        text: str

    class CountResponse(BaseModel):
        tokens: int
        characters: int

    router = APIRouter()

    @router.post("/v1/count", summary="Tokens and characters of a text", **route_doc(CountRequest, CountResponse))
    async def count(request: Request):
        srv = request.app.state.server  # gptforge.serve.server.Server: tokenizer, engine, metrics
        req = await srv.parse(request, CountRequest)  # 400 naming the field, 413 over the body limit
        if not req.text:
            raise APIError(400, "`text` is empty", "text", "invalid_value")
        return srv.ok("/v1/count", CountResponse(tokens=len(srv.encode(req.text)), characters=len(req.text)))

    model, tok = trained
    app = create_app(model, load_for_inference(trained_run, "cpu")[3], ServeConfig(api_key="k"))
    app.include_router(router)
    with TestClient(app) as client:
        key = {"Authorization": "Bearer k"}
        ok = client.post("/v1/count", json={"text": "hello world"}, headers=key)
        assert ok.status_code == 200 and ok.json() == {"tokens": len(tok.encode("hello world")), "characters": 11}
        assert client.post("/v1/count", json={"text": "hi"}).status_code == 401  # the app's API-key guard
        empty = client.post("/v1/count", json={"text": ""}, headers=key)
        assert empty.status_code == 400 and empty.json()["error"]["param"] == "text"
        assert client.post("/v1/count", json={"txt": "a"}, headers=key).status_code == 400
        assert "/v1/count" in client.get("/openapi.json").json()["paths"]
        assert 'gptforge_requests_total{endpoint="/v1/count",status="200"} 1.0' in client.get("/metrics").text
