"""Evaluation: perplexity / bits per byte (`perplexity`), benchmark task files (`tasks` formats,
`scoring` log-likelihoods with lm-evaluation-harness's conventions, `metrics`, `runner` with
`evaluate_tasks` for training loops), the lm-eval adapter (`harness`) and the n-gram
contamination check (`contamination`)."""
