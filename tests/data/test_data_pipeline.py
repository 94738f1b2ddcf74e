"""Recipes: built-ins load and build, YAML options reach the steps, drops counted per reason."""

from __future__ import annotations

import pytest

from gptforge.data.filters import GopherQuality
from gptforge.data.pipeline import (
    DedupConfig,
    apply_steps,
    build_recipe,
    load_recipe,
    show_recipe,
)
from gptforge.data.readers import Document


def build_steps(recipe):
    r = build_recipe(recipe)
    return r.steps, r.mask_step


def test_builtin_recipes_build():
    for name in ("default", "web", "code"):
        steps, dedup = build_steps(load_recipe(name))
        assert isinstance(dedup, DedupConfig) and (dedup.bands, dedup.rows, dedup.ngram) == (14, 8, 5)
        assert dedup.simplify and dedup.skip_short  # FineWeb's text simplification and short-document rule
        assert "steps:" in show_recipe(name)
    _, dedup = build_steps({"steps": [{"dedup": {"simplify": False, "skip_short": False}}]})
    assert not dedup.simplify and not dedup.skip_short
    web, _ = build_steps(load_recipe("web"))
    assert [s.name for s in web] == ["clean", "langid", "blocklist", "c4", "gopher_repetition", "gopher_quality",
                                     "fineweb", "pii"]
    assert build_recipe(load_recipe("web")).step_names()[:3] == ["clean", "boilerplate", "langid"]
    code, _ = build_steps(load_recipe("code"))
    assert [s.name for s in code] == ["clean", "pii"]
    assert build_steps(load_recipe("none")) == ([], None)


def test_yaml_recipe_and_errors(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("steps:\n  - gopher_quality: {min_words: 3, min_stop_words: 0}\n  - pii: {kinds: [email]}\n"
                 "  - dedup: {near: false}\n")
    steps, dedup = build_steps(load_recipe(str(p)))
    assert isinstance(steps[0], GopherQuality) and steps[0].min_words == 3
    assert steps[1].kinds == ("email",) and dedup.near is False and dedup.exact is True
    with pytest.raises(ValueError, match="did you mean 'gopher_quality'"):
        build_steps({"steps": [{"gopher_qualty": {}}]})
    with pytest.raises(ValueError, match="did you mean 'min_words'"):
        build_steps({"steps": [{"gopher_quality": {"min_word": 3}}]})
    with pytest.raises(FileNotFoundError, match="built-in"):
        load_recipe("nope")


def test_apply_steps_counts_add_up():
    steps, _ = build_steps({"steps": [{"length": {"min_chars": 5}}, {"pii": {}}]})
    docs = [Document(t, str(i)) for i, t in
            enumerate(["hi", "mail me at a@example.com", "plain text here", "x"])]
    stats = []
    out = list(apply_steps(docs, steps, stats))
    assert [d.text for d in out] == ["mail me at <EMAIL>", "plain text here"]
    length, pii = stats
    assert length.documents_in == 4 and length.documents_out == 2 and length.dropped == {"too_short": 2}
    assert length.examples["too_short"] == ["hi", "x"]
    assert pii.documents_in == pii.documents_out == 2 and pii.counts == {"email": 1}
    assert pii.characters_out == sum(len(d.text) for d in out)
    for st in stats:
        assert st.documents_in == st.documents_out + sum(st.dropped.values())
