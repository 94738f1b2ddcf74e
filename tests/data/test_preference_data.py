"""Preference pairs: TRL's three row formats, the common-prefix split, bad rows in one line, rows too
long for block_size dropped and counted, and the chosen-then-rejected batch layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptforge.data.chat import ChatTokenizer
from gptforge.data.preference import (
    PairDataset,
    describe,
    extract_prompt,
    load_pairs,
    normalize_row,
    pairs_from_jsonl,
    tokenize_pair,
)
from gptforge.errors import InputError, MissingInputError
from gptforge.runtime.loss import IGNORE_INDEX
from tests.preference_fixtures import (
    conversational_rows,
    implicit_rows,
    plain_rows,
    write_jsonl,
    write_tokenizer,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return ChatTokenizer.from_dir(write_tokenizer(tmp_path_factory.mktemp("tok")))


def test_plain_row_is_prompt_then_completion_with_eos(tok):
    ex = tokenize_pair(tok, {"prompt": "Encode it", "chosen": " with dumps", "rejected": " with loads"})
    assert ex.chosen_ids[-1] == tok.eos_id and ex.rejected_ids[-1] == tok.eos_id
    assert ex.prompt_ids + ex.chosen_ids == tok.encode_text("Encode it with dumps") + [tok.eos_id]
    # An EOS already written at the end of the text is not doubled (TRL's add_eos).
    again = tokenize_pair(tok, {"prompt": "Encode it", "chosen": " with dumps<|im_end|>", "rejected": " x"})
    assert again.chosen_ids == ex.chosen_ids


def test_prompt_merging_into_the_completion_splits_at_the_common_prefix(tok):
    # "indent" tokenised alone ends differently from inside "indentation": the completion starts
    # where the two token lists diverge, as TRL's common_prefix_length does.
    prompt, full = tok.encode_text("ind"), tok.encode_text("indent")
    assert full[:len(prompt)] != prompt, "the fixture must merge across the boundary"
    ex = tokenize_pair(tok, {"prompt": "ind", "chosen": "ent", "rejected": "ex"})
    assert ex.prompt_ids + ex.chosen_ids == full + [tok.eos_id]
    assert len(ex.prompt_ids) < len(prompt)


def test_conversational_and_implicit_rows_give_the_same_pairs(tok):
    explicit = [tokenize_pair(tok, r) for r in conversational_rows()]
    implicit = [tokenize_pair(tok, r) for r in implicit_rows()]
    assert [(e.prompt_ids, e.chosen_ids, e.rejected_ids) for e in explicit] == \
        [(e.prompt_ids, e.chosen_ids, e.rejected_ids) for e in implicit]
    im_start = tok.tokenizer.token_to_id("<|im_start|>")
    ex = explicit[0]
    assert ex.prompt_ids[0] == im_start and tok.tokenizer.decode(ex.prompt_ids).endswith("assistant\n")
    # The completion is everything after the prompt: content, <|im_end|> and the template's newline.
    assert tok.eos_id in ex.chosen_ids and ex.chosen_ids[-1] != tok.eos_id


def test_extract_prompt_text_moves_the_space_to_the_completions():
    assert extract_prompt("The sky is blue.", "The sky is green.") == ("The sky is", " blue.", " green.")
    a = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    b = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]
    assert extract_prompt(a, b) == (a[:1], a[1:], b[1:])


@pytest.mark.parametrize("row, field", [
    ({"prompt": "p", "chosen": "same", "rejected": "same"}, "are the same"),
    ({"prompt": "p", "chosen": "", "rejected": "x"}, "`chosen` is an empty completion"),
    ({"prompt": "p", "chosen": "x", "rejected": "   "}, "`rejected` is an empty completion"),
    ({"prompt": "p", "chosen": "x"}, "`rejected` is missing"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "user", "content": "b"}]}, "`rejected` must end with an assistant message"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": ""}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "empty assistant message"),
    ({"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"}, "`rejected` must be"),
    ({"prompt": "p", "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "`prompt` must be a list of messages"),
    ({"prompt": [{"role": "robot", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}],
      "rejected": [{"role": "assistant", "content": "b"}]}, "prompt[0] must have role"),
])
def test_bad_rows_fail_in_one_line_naming_file_line_and_field(tok, tmp_path, row, field):
    good = plain_rows(3)
    path = write_jsonl(tmp_path / "pairs.jsonl", [good[0], good[1], row, good[2]])
    with pytest.raises(InputError) as e:
        load_pairs(path, tok, 256)
    message = str(e.value)
    assert "\n" not in message and f"{path}:3:" in message and field in message, message
    with pytest.raises(InputError, match="pairs.jsonl:3:"):
        normalize_row(row, f"{path}:3")


def test_bad_json_and_missing_file(tok, tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(plain_rows(1)[0]) + "\n{not json\n")
    with pytest.raises(InputError, match=r"pairs.jsonl:2: not valid JSON"):
        load_pairs(path, tok, 256)
    with pytest.raises(MissingInputError, match="no such preference file"):
        load_pairs(tmp_path / "none.jsonl", tok, 256)


def test_rows_longer_than_block_size_are_dropped_counted_and_named(tok, tmp_path):
    rows = plain_rows(16)
    lengths = [len(e.prompt_ids) + max(len(e.chosen_ids), len(e.rejected_ids))
               for e in (tokenize_pair(tok, r) for r in rows)]
    block = sorted(lengths)[10]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    with pytest.warns(UserWarning, match=r"dropped \d+ of 16 pair\(s\) longer than block_size") as w:
        examples, stats = load_pairs(path, tok, block)
    n_long = sum(n > block for n in lengths)
    assert n_long > 0 and stats["dropped_too_long"] == n_long and len(examples) == 16 - n_long
    first_long = next(i for i, n in enumerate(lengths) if n > block)
    assert f"pairs.jsonl:{first_long + 1}: prompt+completion is {lengths[first_long]} tokens" in str(w[0].message)
    assert "longer than block_size dropped" in describe(stats, path)
    with pytest.raises(InputError, match=f"no pair fits finetune.block_size {min(lengths) - 1}"):
        load_pairs(path, tok, min(lengths) - 1)


def test_batch_layout_chosen_rows_then_rejected_with_completion_labels(tok, tmp_path):
    ds = pairs_from_jsonl(write_jsonl(tmp_path / "p.jsonl", plain_rows(4)), tok, 256)
    ds.ref_logps = np.array([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0], [-7.0, -8.0]])
    b = ds.batch([2, 0])
    assert b["input_ids"].shape == b["labels"].shape == b["targets"].shape and b["input_ids"].shape[0] == 4
    for r, (i, which) in enumerate([(2, "chosen"), (0, "chosen"), (2, "rejected"), (0, "rejected")]):
        ex = ds.examples[i]
        completion = getattr(ex, f"{which}_ids")
        ids = ex.prompt_ids + completion
        n = len(ids) - 1
        assert b["input_ids"][r, :n].tolist() == ids[:-1]
        assert b["targets"][r, :n].tolist() == ids[1:] and (b["targets"][r, n:] == IGNORE_INDEX).all()
        counted = b["labels"][r][b["labels"][r] != IGNORE_INDEX].tolist()
        assert counted == completion
    assert b["ref_chosen_logps"].tolist() == [-5.0, -1.0] and b["ref_rejected_logps"].tolist() == [-6.0, -2.0]
    assert b["index"].tolist() == [2, 0]
    assert torch.equal(PairDataset(ds.examples, pad_id=tok.eos_id).batch([2, 0])["labels"], b["labels"])


def test_pair_batches_keep_pairs_together_and_split_ranks_like_one_process(tok, tmp_path):
    from gptforge.data.preference import PairBatches

    ds = pairs_from_jsonl(write_jsonl(tmp_path / "p.jsonl", plain_rows(16)), tok, 256)
    one = PairBatches(ds, micro_batch_size=2, gradient_accumulation_steps=2, seed=3)
    two = [PairBatches(ds, micro_batch_size=1, gradient_accumulation_steps=2, seed=3, dp_rank=k, dp_size=2)
           for k in range(2)]
    assert one.global_batch_size == two[0].global_batch_size == 4
    seen = []
    for step in range(4):  # one epoch: every pair once
        whole = [i for mb in one.micro_batches(step) for i in mb["index"].tolist()]
        split = [i for k in range(2) for mb in two[k].micro_batches(step) for i in mb["index"].tolist()]
        assert whole == split == one.pairs(step).tolist()
        for mb in one.micro_batches(step):
            b = len(mb["index"])
            assert mb["input_ids"].shape[0] == 2 * b
            for j, i in enumerate(mb["index"].tolist()):  # row j is pair i's chosen, row b + j its rejected
                ex = ds.examples[i]
                assert mb["labels"][j][mb["labels"][j] != IGNORE_INDEX].tolist() == ex.chosen_ids
                assert mb["labels"][b + j][mb["labels"][b + j] != IGNORE_INDEX].tolist() == ex.rejected_ids
        seen += whole
    assert sorted(seen) == list(range(16))
    assert one.pairs(4).tolist() != one.pairs(0).tolist()  # the next epoch is drawn anew
