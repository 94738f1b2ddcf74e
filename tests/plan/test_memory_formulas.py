"""Memory formulas against the papers they come from, and their internal consistency."""

import pytest

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan.activations import korthikanti_bytes_per_layer, layer_activation_bytes
from gptforge.plan.memory import (
    estimate_memory,
    optimizer_state_bytes,
    zero_paper_model_state_bytes,
)
from gptforge.plan.params import param_count


@pytest.mark.parametrize("stage,expected_gb", [(0, 120.0), (1, 31.41), (2, 16.64), (3, 1.875)])
def test_zero_paper_figure_1(stage, expected_gb):
    # Rajbhandari et al. 2019, figure 1: 7.5B parameters, 64 GPUs, K = 12.
    got = zero_paper_model_state_bytes(7.5e9, 64, stage) / 1e9
    assert got == pytest.approx(expected_gb, rel=0.01)


def test_korthikanti_table_2_gpt3():
    # GPT-3 175B, s=2048, h=12288, a=96, t=8: 23*sbh (tensor parallel) vs 4.25*sbh (+ sequence
    # parallel + selective recompute).
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert korthikanti_bytes_per_layer(s, b, h, a, t) / sbh == pytest.approx(23.0)
    assert korthikanti_bytes_per_layer(s, b, h, a, t, sequence_parallel=True, recompute="selective") / sbh \
        == pytest.approx(4.25)
    assert korthikanti_bytes_per_layer(s, b, h, a) / sbh == pytest.approx(34 + 5 * a * s / h)
    assert korthikanti_bytes_per_layer(s, b, h, a, recompute="full") / sbh == pytest.approx(2.0)


def test_gptforge_block_counts_against_korthikanti_structure():
    # gptforge's GPT-2 block in bf16 without dropout keeps x (fp32), three 16-bit input casts for
    # q/k/v, q/k/v, the attention output, the post-attention residual (fp32), one cast for the MLP,
    # and two 4h-wide MLP tensors: 4 + 6 + 6 + 2 + 4 + 2 + 8 + 8 = 40 bytes per sbh (+ small stats).
    cfg = ModelConfig(preset="gpt2-small").resolved()
    b, s, h = 2, 1024, 768
    la = layer_activation_bytes(cfg, "bf16", b, s)
    assert la.total / (b * s * h) == pytest.approx(40, abs=0.2)
    # Tensor + sequence parallel shrinks everything but the gathered linear inputs.
    la8 = layer_activation_bytes(cfg, "bf16", b, s, tp=4, sequence_parallel=True)
    assert la8.total < la.total / 2
    # Eager attention adds the (s, s) probabilities, Korthikanti's 5as/h term (fp32 softmax here).
    eager = layer_activation_bytes(ModelConfig(preset="gpt2-small", attention="eager").resolved(), "bf16", b, s)
    assert eager.total - la.total >= 4 * b * 12 * s * s


def test_model_states_follow_zero_sharding():
    cfg = ModelConfig(preset="llama-2-7b").resolved()
    n = param_count(cfg)
    t = TrainConfig(micro_batch_size=1, precision="bf16")
    states = {}
    for stage in range(4):
        est = estimate_memory(cfg, t, ParallelConfig(dp_replicate=64, zero_stage=stage))
        states[stage] = (est.weights, est.gradients, est.optimizer_states)
    # fp32 params + fp32 grads + 8-byte Adam moments = 16 bytes/param, sharded stage by stage.
    assert sum(states[0]) == pytest.approx(16 * n, rel=1e-6)
    assert states[1] == pytest.approx((4 * n, 4 * n, 8 * n / 64), rel=1e-6)
    assert states[2] == pytest.approx((4 * n, 4 * n / 64, 8 * n / 64), rel=1e-6)
    assert sum(states[3]) == pytest.approx(16 * n / 64, rel=1e-6)


def test_offload_moves_states_to_cpu():
    cfg = ModelConfig(preset="gpt2-medium").resolved()
    t = TrainConfig(micro_batch_size=1, precision="bf16")
    on = estimate_memory(cfg, t, ParallelConfig(dp_shard=4, zero_stage=3))
    opt = estimate_memory(cfg, t, ParallelConfig(dp_shard=4, zero_stage=3, offload="optimizer"))
    both = estimate_memory(cfg, t, ParallelConfig(dp_shard=4, zero_stage=3, offload="optimizer+params"))
    assert opt.optimizer_states == 0 and opt.cpu_offload_bytes == on.optimizer_states
    assert both.weights == both.gradients == 0 and both.total < opt.total < on.total
    with pytest.raises(ValueError, match="zero_stage 3"):
        estimate_memory(cfg, t, ParallelConfig(dp_replicate=4, offload="optimizer+params"))


def test_logits_dominate_gpt2_small_at_batch_8():
    est = estimate_memory(ModelConfig(preset="gpt2-small").resolved(), TrainConfig(micro_batch_size=8, precision="bf16"))
    assert est.peak_phase == "loss backward"
    # (2 + 4 + 8) bytes * B*T*V: bf16 logits, fp32 log-softmax, two fp32 gradients.
    assert est.logits_and_loss == 14 * 8 * 1024 * 50257
    assert est.logits_and_loss > est.peak_tensor_bytes / 2
    assert sum(est.peak_parts.values()) == est.peak_tensor_bytes


def test_checkpointing_and_parallelism_reduce_memory():
    cfg = ModelConfig(preset="llama-2-7b").resolved()
    base = TrainConfig(micro_batch_size=2, precision="bf16")
    none = estimate_memory(cfg, base)
    sel = estimate_memory(cfg, TrainConfig(micro_batch_size=2, precision="bf16", activation_checkpointing="selective"))
    full = estimate_memory(cfg, TrainConfig(micro_batch_size=2, precision="bf16", activation_checkpointing="full"))
    assert full.activations < sel.activations < none.activations
    tp = estimate_memory(cfg, base, ParallelConfig(tp=4))
    assert tp.weights == pytest.approx(none.weights / 4, rel=0.02)
    pp = estimate_memory(cfg, base, ParallelConfig(pp=4, pp_microbatches=8))
    assert pp.weights < none.weights / 3


def test_optimizer_states():
    cfg = ModelConfig(preset="gpt2-small").resolved()
    n = param_count(cfg)
    assert optimizer_state_bytes(cfg, "adamw") == 8 * n
    assert optimizer_state_bytes(cfg, "sgd") == 4 * n
    assert optimizer_state_bytes(cfg, "adamw8bit") == pytest.approx(2 * n, rel=0.01)
    assert optimizer_state_bytes(cfg, "adafactor") < 0.05 * 4 * n
    with pytest.raises(ValueError, match="train.optimizer"):
        optimizer_state_bytes(cfg, "lion")


def test_bad_layouts_are_named():
    cfg = ModelConfig(preset="gpt2-small").resolved()
    with pytest.raises(ValueError, match="parallel.tp"):
        estimate_memory(cfg, TrainConfig(), ParallelConfig(tp=5))
    with pytest.raises(ValueError, match="parallel.zero_stage"):
        estimate_memory(cfg, TrainConfig(), ParallelConfig(zero_stage=4))
    with pytest.raises(ValueError, match="parallel.pp"):
        estimate_memory(cfg, TrainConfig(), ParallelConfig(pp=13))
