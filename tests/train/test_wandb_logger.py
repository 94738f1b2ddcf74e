"""W&B offline: the files wandb writes hold the config, every row and the report artifact; a
resumed logger continues the same run id. Nothing reaches the network."""

import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from gptforge.train.wandb_logger import WandbLogger  # noqa: E402


def read_wandb_records(path: Path):
    """Records of a .wandb file: a 7-byte header (":W&B", magic, version) then LevelDB log
    framing (32 KiB blocks; per chunk crc32c, length, type: 1 full, 2 first, 3 middle, 4 last);
    checksums are not verified here."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, records, parts = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(parts)
            records.append(rec)
    return records


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    for var, sub in (("WANDB_CONFIG_DIR", "cfg"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data"),
                     ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / sub))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # a closed port: any upload attempt fails
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


def finished_records(path: Path, timeout: float = 20.0):
    """The records once wandb's writer process has flushed the run's final "exit" record
    (`finish()` returns before the file is complete on a busy machine)."""
    deadline = time.monotonic() + timeout
    while True:
        recs = read_wandb_records(path) if path.exists() and path.stat().st_size > 7 else []
        if any(r.WhichOneof("record_type") == "exit" for r in recs) or time.monotonic() > deadline:
            return recs
        time.sleep(0.1)


def _history(records):
    out = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): i.value_json for i in r.history.item}
            out[int(r.history.step.num)] = items
    return out


def test_offline_run_files_and_resume(offline_env, tmp_path):
    run_dir = tmp_path / "run"
    report = tmp_path / "report.html"
    report.write_text("<html><body>report</body></html>")
    cfg = {"model": {"n_layer": 2, "d_model": 32}, "train": {"lr": 0.003}}
    log = WandbLogger(run_dir, project="gptforge-test", mode="offline", config=cfg)
    rows = [{"step": s, "loss": 5.0 - 0.25 * s, "lr": 1e-3, "skipped": False, "mfu": None,
             **({"val_loss": 4.5} if s == 4 else {}), **({"events": [{"kind": "spike"}]} if s == 3 else {})}
            for s in range(1, 5)]
    for r in rows:
        log.log(r)
    log.log_report(report)
    state = log.state_dict()
    log.finish()
    rid = state["run_id"]
    assert rid
    (first,) = list((run_dir / "wandb").glob(f"offline-run-*-{rid}/run-{rid}.wandb"))
    recs = finished_records(first)
    kinds = [r.WhichOneof("record_type") for r in recs]
    run_rec = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    assert run_rec.run_id == rid and run_rec.project == "gptforge-test" and run_rec.display_name == "run"
    cfg_keys = {i.key for i in run_rec.config.update}
    assert {"model", "train"} <= cfg_keys
    hist = _history(recs)
    assert sorted(hist) == [1, 2, 3, 4]
    assert float(hist[2]["train/loss"]) == 4.5 and float(hist[4]["val/loss"]) == 4.5
    assert "train/mfu" not in hist[1] and "train/skipped" not in hist[1] and hist[3]["train/events"] == "1"
    art = next(r.artifact for r in recs if r.WhichOneof("record_type") == "artifact")
    assert art.name == f"report-{rid}" and art.type == "run-report"
    assert [c.path for c in art.manifest.contents] == ["report.html"]
    assert "artifact" in kinds

    # Resume: a new logger with the saved state writes to the same W&B run id.
    again = WandbLogger(run_dir, project="gptforge-test", mode="offline", config=cfg)
    again.load_state_dict(state)
    again.log({"step": 5, "loss": 3.5})
    assert again.state_dict() == state
    again.finish()
    deadline = time.monotonic() + 20
    while len(files := sorted((run_dir / "wandb").glob(f"offline-run-*-{rid}*/run-{rid}.wandb"))) < 2:
        assert time.monotonic() < deadline, files
        time.sleep(0.1)
    second = next(f for f in files if f != first)
    assert sorted(_history(finished_records(second))) == [5]
    with pytest.raises(RuntimeError):
        started = WandbLogger(run_dir, project="gptforge-test", mode="disabled")
        started.log({"step": 1, "loss": 1.0})
        started.load_state_dict({"run_id": "other"})


def test_bad_mode_is_refused(tmp_path):
    from gptforge.errors import InputError

    with pytest.raises(InputError, match="wandb_mode"):
        WandbLogger(tmp_path, project="p", mode="sometimes")
