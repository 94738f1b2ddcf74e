"""`gptforge generate` with a prompt longer than the context says so, with the token counts."""

from __future__ import annotations

import warnings


def test_generate_warns_with_token_counts_when_the_prompt_is_cut(trained_run, trained, capsys):
    from gptforge.cli import main

    _model, tok = trained
    prompt = "def main(argv):\n    return parse(argv) or 0\n" * 12
    n = len(tok.encode(prompt))
    assert n > 64
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["generate", str(trained_run), "--prompt", prompt, "--max-new-tokens", "5",
                     "--temperature", "0", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    err = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert err == [f"gptforge generate: warning: --prompt is {n} tokens, longer than the model's context of 64 "
                   f"tokens: the first {n - 64} tokens are dropped and generation continues from the last 64"]
    assert not [w for w in caught if "longer than the model's context" in str(w.message)]  # said once
    assert captured.out.startswith(prompt)

    assert main(["generate", str(trained_run), "--prompt", "def f(", "--max-new-tokens", "3", "--temperature", "0",
                 "--device", "cpu"]) == 0
    assert "warning" not in capsys.readouterr().err  # a prompt that fits: nothing said
