"""train.document_mask: shard batches carry the document mask, validation uses it, a run trains."""

import dataclasses

import torch
import yaml

from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.data.shards import load_meta
from gptforge.model.gpt import GPT, document_mask
from gptforge.train.sources import ShardSource


def test_shard_batches_carry_the_mask_of_their_inputs(tiny_shards):
    eos = load_meta(tiny_shards)["eos_id"]
    tc = TrainConfig(micro_batch_size=4, gradient_accumulation_steps=2, seed=3, document_mask=True)
    src = ShardSource(tiny_shards, eval_steps=2, micro_batch_size=4)
    masked = src.batches(64, tc, 0, 1)
    plain = ShardSource(tiny_shards).batches(64, dataclasses.replace(tc, document_mask=False), 0, 1)
    seen_eos = False
    for step in range(80):
        for mb, (x, y) in zip(masked.micro_batches(step), plain.micro_batches(step)):
            assert torch.equal(mb["input_ids"], x) and torch.equal(mb["labels"], y)
            pos, mask = document_mask(x, eos)
            assert torch.equal(mb["position_ids"], pos) and torch.equal(mb["attn_mask"], mask)
            seen_eos |= bool((x == eos).any())
    assert seen_eos  # some window crosses a document boundary, so the mask is not plain causal

    model = GPT(ModelConfig(preset="gpt2-nano", block_size=64, vocab_size=src.vocab_size).resolved())
    from gptforge.eval.perplexity import evaluate_windows

    val = src.evaluate(model, torch.device("cpu"), "fp32")
    expected = evaluate_windows(model, src.val_stream, src.val_offsets, 64, 4, torch.device("cpu"), "fp32",
                                document_mask_eos=eos)
    assert val == expected
    src.close()


def test_a_run_trains_with_the_document_mask(tiny_shards, tmp_path):
    from gptforge.train.loop import train

    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=64),
                    train=TrainConfig(max_steps=3, micro_batch_size=2, eval_interval=3, eval_steps=1,
                                      checkpoint_interval=0, document_mask=True, tensorboard=False, report=False,
                                      lr=1e-3, warmup_steps=0))
    result = train(cfg, tiny_shards, tmp_path / "run", progress=False)
    assert result.step == 3
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["document_mask"] is True
