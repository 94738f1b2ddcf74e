"""Phase 1b, quality: score what curation kept with a trained classifier and keep the best.

Runs after the curate phase when the recipe ends with a `quality` step
(`gptforge.data.quality.QualityStep`), as a corpus step in two passes over the corpus:

1. the classifier (main process, once): loaded from `--quality-model`, or trained on the
   reference documents (`--quality-reference`, at most `max_documents`, the ones with the
   smallest seeded hashes) against as many negatives: the curated documents (after every other
   step, dedup included) with the smallest seeded hashes of their split keys, a sample that does
   not depend on sharding. Kept as `quality/model.npz` in the work folder;
2. scoring (one task per shard, in the executor: worker processes or Ray):
   `quality/NNNNN.scores.npy`, float64 per curated document, NaN where an earlier step dropped it;
3. the cut (main process): the top `keep` fraction of every scored document of the output, or
   those scoring at least `threshold` (`gptforge.data.quality.keep_cut`); the drop mask
   `quality/NNNNN.npy` is the earlier mask (dedup's) or a low score, and replaces it for the
   later phases (`Curated.mask_name` becomes `quality`).

In a `--source` mixture every source runs its own phase, so the cut applies per source.
A rerun whose classifier and curated documents are the same as the output it replaces (only the
cut changed) copies that output's model and scores (`OUT/quality/`) instead of training and
scoring again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from gptforge.data.phases.curate import Curated
from gptforge.data.phases.pool import Executor, run_tasks
from gptforge.data.phases.work import WorkFolder
from gptforge.data.quality import QualityModel, QualityStep, histogram, keep_cut, text_sha256, train_quality_model
from gptforge.data.readers import ReadStats, read_documents
from gptforge.data.steps import StepStats, step_from_dict

PHASE = "quality"
#: examples of the highest and of the lowest scored documents in the report.
REPORT_EXAMPLES = 5
EXAMPLE_CHARS = 300
SCORES_FILE = "scores.parquet"
MODEL_FILE = "model.npz"
RECORD_FILE = "quality.json"


def _seeded_rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}\0{key}".encode("utf-8", "surrogatepass")).hexdigest()


def _reference_texts(step: QualityStep) -> list[str]:
    """The reference documents: every document of `step.reference`, at most `max_documents` (the
    ones with the smallest seeded hash of their text), in hash order."""
    stats = ReadStats(quiet=True)
    texts = {text_sha256(d.text): d.text for d in read_documents([str(step.reference)], stats, "auto") if d.text.strip()}
    ranked = sorted(texts.items(), key=lambda kv: _seeded_rank(step.seed, kv[0]))
    return [t for _, t in ranked[:step.max_documents]]


def _negative_texts(step: QualityStep, work: WorkFolder, masks: list, n: int) -> list[str]:
    """`n` curated documents (after every other step) with the smallest seeded hash of their split
    key (ties by position), read back from the curated shards."""
    ranked: list[tuple[str, int, int]] = []
    for i, mask in enumerate(masks):
        for pos, d in work.documents(i, mask, ("key",)):
            ranked.append((_seeded_rank(step.seed, d["key"]), i, pos))
    chosen = sorted(ranked)[:n]
    wanted: dict[int, set[int]] = {}
    for _, i, pos in chosen:
        wanted.setdefault(i, set()).add(pos)
    texts: dict[tuple[int, int], str] = {}
    for i, positions in wanted.items():
        for pos, d in work.documents(i, masks[i], ("text",)):
            if pos in positions:
                texts[(i, pos)] = d["text"]
    return [texts[(i, pos)] for _, i, pos in chosen]


def _model(step: QualityStep, work: WorkFolder, masks: list) -> QualityModel:
    if step.model is not None:
        return QualityModel.load(step.model)
    positives = _reference_texts(step)
    from gptforge.data.quality import MIN_REFERENCE_DOCUMENTS
    from gptforge.errors import InputError

    if len(positives) < MIN_REFERENCE_DOCUMENTS:
        raise InputError(f"--quality-reference {step.reference}: {len(positives)} non-empty documents, at least "
                         f"{MIN_REFERENCE_DOCUMENTS} are needed to train the classifier (a few hundred or more make "
                         f"a useful one); a folder of .txt files is read one document per file")
    negatives = _negative_texts(step, work, masks, len(positives))
    return train_quality_model(positives, negatives, step.seed, {"reference": str(step.reference)})


def score_task(task: dict[str, Any]) -> dict[str, Any]:
    """Score one curated shard (a worker task): `quality/NNNNN.scores.npy` and `NNNNN.json`."""
    c0 = time.process_time()
    work, i = WorkFolder(task["work"]), task["index"]
    model = QualityModel.load(work.phase_dir(PHASE) / MODEL_FILE)
    mask = work.drop_mask(task["mask_name"], i) if task["mask_name"] else None
    scores = np.full(len(work.text_lengths(i)), np.nan)
    positions, texts = [], []
    for pos, d in work.documents(i, mask, ("text",)):
        positions.append(pos)
        texts.append(d["text"])
        if len(texts) >= 512:
            scores[positions] = model.scores(texts)
            positions, texts = [], []
    if texts:
        scores[positions] = model.scores(texts)
    work.save_npy(work.shard_file(PHASE, i, ".scores.npy"), scores)
    result = {"documents": int((~np.isnan(scores)).sum()), "cpu_seconds": time.process_time() - c0}
    work.write_json(work.shard_file(PHASE, i, ".json"), result)
    return result


def _reuse_previous(previous: Path | None, key: str, work: WorkFolder, n: int) -> bool:
    """Copy an earlier output's model and scores into the work folder when they were made with the
    same `key` (classifier options and curated documents); whether it did."""
    if previous is None or not (previous / PHASE / RECORD_FILE).is_file():
        return False
    try:
        record = json.loads((previous / PHASE / RECORD_FILE).read_text(encoding="utf-8"))
        if record.get("scoring_key") != key or record.get("shards") != n:
            return False
        import pyarrow.parquet as pq

        table = pq.read_table(previous / PHASE / SCORES_FILE)
    except (OSError, ValueError):
        return False
    shard = table.column("shard").to_numpy()
    position = table.column("position").to_numpy()
    score = table.column("score").to_numpy()
    qdir = work.phase_dir(PHASE)
    shutil.copyfile(previous / PHASE / MODEL_FILE, qdir / MODEL_FILE)
    for i in range(n):
        scores = np.full(len(work.text_lengths(i)), np.nan)
        sel = shard == i
        scores[position[sel]] = score[sel]
        work.save_npy(work.shard_file(PHASE, i, ".scores.npy"), scores)
        work.write_json(work.shard_file(PHASE, i, ".json"), {"documents": int(sel.sum()), "cpu_seconds": 0.0,
                                                             "reused": True})
    return True


def run_quality(step: QualityStep, work: WorkFolder, curated: Curated, pool: Executor, progress: Any,
                timings: dict[str, float], curation_key: str, previous: Path | None = None) -> None:
    """Phase 1b (see the module docstring). Updates `curated` in place: its masks and mask name,
    its steps (a `quality` StepStats) and its corpus entries (`quality`: the report's section).

    `curation_key`: what the curated documents depend on (inputs and the other steps), so that
    scores are reused from `previous` (the output this run replaces) only for the same documents.

    Raises:
        InputError: a reference with too few documents, or a model file of another kind.
    """
    t = time.perf_counter()
    n = len(curated.masks)
    qdir = work.phase_dir(PHASE)
    done = qdir / "done.json"
    key = hashlib.sha256(json.dumps([curation_key, step.training_options()], sort_keys=True).encode()).hexdigest()
    if done.exists():
        info = work.read_json(done)
    else:
        reused = _reuse_previous(previous, key, work, n)
        c0 = time.process_time()
        if not (qdir / MODEL_FILE).exists():
            _model(step, work, curated.masks).save(qdir / MODEL_FILE)
        train_cpu = time.process_time() - c0
        tasks = [{"work": str(work.root), "index": i, "mask_name": curated.mask_name} for i in range(n)]
        run_tasks(score_task, tasks, lambda i: work.shard_done(PHASE, i), pool, progress, "quality scoring")
        info = _cut(step, work, curated, n, key, reused)
        info["train_cpu_seconds"] = round(train_cpu, 3)  # reading the sets and training, in this process
        work.write_json(done, info)
    curated.masks = [work.drop_mask(PHASE, i) for i in range(n)]
    curated.mask_name = PHASE
    curated.steps.append(step_from_dict(info["step"]))
    curated.corpus[PHASE] = info
    curated.passes.append(("quality_scoring", PHASE))
    timings["quality_scoring"] = time.perf_counter() - t


def _cut(step: QualityStep, work: WorkFolder, curated: Curated, n: int, key: str, reused: bool) -> dict[str, Any]:
    """Decide the cut, write the masks, and return the report's entry (with a "step" entry)."""
    scores = [np.load(work.shard_file(PHASE, i, ".scores.npy")) for i in range(n)]
    keep, threshold = step.cut()
    cut, kept = keep_cut(scores, keep, threshold)
    st = StepStats(PHASE)
    by_language: dict[str, list[float]] = {}
    ranked: list[tuple[float, int, int]] = []
    for i in range(n):
        prior = curated.masks[i]
        mask = np.ones(scores[i].size, bool) if prior is None else prior.copy()
        valid = ~np.isnan(scores[i])
        mask[valid] = ~kept[i][valid]
        mask[~valid] = True
        work.save_npy(work.step_dir(PHASE) / f"{i:05d}.npy", mask)
        lengths = work.text_lengths(i)
        st.documents_in += int(valid.sum())
        st.documents_out += int((valid & kept[i]).sum())
        st.characters_in += int(lengths[valid].sum())
        st.characters_out += int(lengths[valid & kept[i]].sum())
        for pos, d in work.documents(i, ~valid, ("language",)):
            by_language.setdefault(d["language"] or "unknown", []).append(float(scores[i][pos]))
            ranked.append((float(scores[i][pos]), i, pos))
    dropped = st.documents_in - st.documents_out
    if dropped:
        st.dropped["low_quality_score"] = dropped
    ranked.sort()
    examples = _examples(work, ranked[:REPORT_EXAMPLES] + ranked[::-1][:REPORT_EXAMPLES], kept)
    for ex in examples[:REPORT_EXAMPLES]:
        if not ex["kept"]:
            st.add_example("low_quality_score", ex["text"])
    model = QualityModel.load(work.phase_dir(PHASE) / MODEL_FILE)
    return {
        "step": st.to_dict(), "scoring_key": key, "reused_scores": reused, "keep": keep, "threshold": cut,
        "threshold_given": threshold is not None, "scored": st.documents_in, "kept": st.documents_out,
        "model_sha256": model.sha256(),
        "model": {k: v for k, v in model.meta.items() if not k.endswith("_sha256")},
        "histogram_bins": 20,
        "histogram": {lang: histogram(np.array(v)) for lang, v in sorted(by_language.items())},
        "lowest": examples[:REPORT_EXAMPLES], "highest": examples[REPORT_EXAMPLES:],
    }


def _examples(work: WorkFolder, picks: list[tuple[float, int, int]], kept: list[np.ndarray]) -> list[dict[str, Any]]:
    out = []
    for score, i, pos in picks:
        text = next(d["text"] for p, d in work.documents(i, None, ("text",)) if p == pos)
        out.append({"score": round(score, 6), "kept": bool(kept[i][pos]),
                    "text": text[:EXAMPLE_CHARS] + ("…" if len(text) > EXAMPLE_CHARS else "")})
    return out


def write_quality_outputs(out_dir: Path, work: WorkFolder, n: int, info: dict[str, Any]) -> None:
    """Into the output folder (before it is moved into place): `quality/model.npz`, the classifier;
    `quality/scores.parquet`, every scored document's shard, position, id, language, score and
    whether it was kept (the document metadata a rerun re-thresholds from); `quality/quality.json`,
    the record (scoring key, held-out accuracy, the training documents' SHA-256)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gptforge.atomic import atomic_path, atomic_write_text

    qout = out_dir / PHASE
    qout.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(work.phase_dir(PHASE) / MODEL_FILE, qout / MODEL_FILE)
    cols: dict[str, list[Any]] = {"shard": [], "position": [], "id": [], "language": [], "score": [], "kept": []}
    for i in range(n):
        scores = np.load(work.shard_file(PHASE, i, ".scores.npy"))
        mask = work.drop_mask(PHASE, i)
        for pos, d in work.documents(i, np.isnan(scores), ("id", "language")):
            cols["shard"].append(i)
            cols["position"].append(pos)
            cols["id"].append(d["id"])
            cols["language"].append(d["language"])
            cols["score"].append(float(scores[pos]))
            cols["kept"].append(not bool(mask[pos]))
    table = pa.table({"shard": pa.array(cols["shard"], pa.int32()), "position": pa.array(cols["position"], pa.int64()),
                      "id": pa.array(cols["id"], pa.string()), "language": pa.array(cols["language"], pa.string()),
                      "score": pa.array(cols["score"], pa.float64()), "kept": pa.array(cols["kept"], pa.bool_())})
    with atomic_path(qout / SCORES_FILE) as tmp:
        pq.write_table(table, str(tmp))
    model = QualityModel.load(work.phase_dir(PHASE) / MODEL_FILE)
    record = {"scoring_key": info["scoring_key"], "shards": n, "model_sha256": info["model_sha256"],
              "keep": info["keep"], "threshold": info["threshold"], "held_out_accuracy": info["model"].get("held_out_accuracy"),
              "positive_sha256": model.meta.get("positive_sha256", []),
              "negative_sha256": model.meta.get("negative_sha256", [])}
    atomic_write_text(qout / RECORD_FILE, json.dumps(record, indent=1) + "\n")
