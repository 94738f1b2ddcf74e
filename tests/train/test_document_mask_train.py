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
        for mb, (x, y) in zip(masked.micro_batches(step), plain.micro_batches(step), strict=True):
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


def test_a_run_trains_with_the_document_mask_and_evaluate_uses_it(tiny_shards, tmp_path, capsys):
    import json

    from gptforge.cli import main
    from gptforge.data.loader import TokenStream
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.loading import load_for_inference
    from gptforge.train.run import train

    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", block_size=64),
                    train=TrainConfig(max_steps=3, micro_batch_size=2, eval_interval=3, eval_steps=1,
                                      checkpoint_interval=0, document_mask=True, tensorboard=False, report=False,
                                      lr=1e-3, warmup_steps=0))
    result = train(cfg, tiny_shards, tmp_path / "run", progress=False)
    assert result.step == 3
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"]["document_mask"] is True

    assert main(["evaluate", str(tmp_path / "run"), "--data", str(tiny_shards), "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    meta = load_meta(tiny_shards)
    stream = TokenStream([tiny_shards / f for f in meta["splits"]["val"]["files"]], meta["dtype"])
    tokens = stream.read(0, stream.num_tokens)
    stream.close()
    model = load_for_inference(tmp_path / "run", "cpu")[0]
    masked = evaluate_tokens(model, tokens, document_mask_eos=meta["eos_id"])
    plain = evaluate_tokens(model, tokens)
    assert reported["total_nats"] == masked.total_nats != plain.total_nats
