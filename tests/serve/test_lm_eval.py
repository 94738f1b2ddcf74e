"""lm-eval's `local-completions` model against the server: the same log-likelihoods as the model."""

import pytest
import torch

from tests.serve.conftest import API_KEY


def test_lm_eval_local_completions_loglikelihoods_match_the_model(live, trained, monkeypatch):
    for name in ("lm_eval", "aiohttp", "tenacity", "requests"):  # lm-eval's API models need the last three
        pytest.importorskip(name)
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    model, tok = trained
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    lm = LocalCompletionsAPI(base_url=live.url + "/v1/completions", model="tiny", tokenizer_backend="remote", auth_token=API_KEY,
                             max_length=63, num_concurrent=1, max_retries=1, batch_size=2)
    pairs = [("def main():", "\n    return 0"), ("import os", "\nimport sys"), ("class A:", " pass"),
             ("x = 1\ny =", " 2")]
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=p, idx=i) for i, p in enumerate(pairs)]
    got = lm.loglikelihood(reqs, disable_tqdm=True)
    assert len(got) == len(pairs)
    for (ctx, cont), (ll, greedy) in zip(pairs, got, strict=True):
        c, w = tok.encode(ctx), tok.encode(ctx + cont)
        assert w[: len(c)] == c  # these pairs split at a token boundary
        with torch.no_grad():
            logp = model(torch.tensor([w]))[0].float().log_softmax(-1)
        ref = sum(float(logp[t - 1, w[t]]) for t in range(len(c), len(w)))
        ref_greedy = all(int(logp[t - 1].argmax()) == w[t] for t in range(len(c), len(w)))
        assert ll == pytest.approx(ref, abs=1e-3) and greedy == ref_greedy
