"""GPU table, precision checks, the plan() API and layout search."""

import pytest

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan import plan, predict_peak_memory_bytes
from gptforge.plan.hardware import GPUS, GiB, get_gpu, gpu_for_device_name
from gptforge.plan.search import recommend

NAMES = ["v100-16g", "v100-32g", "t4", "a10", "a100-40g", "a100-80g", "l40s", "h100-sxm", "h100-pcie", "h200",
         "rtx3090", "rtx4090", "mi300x"]


def test_table_has_every_gpu_with_a_source():
    assert list(GPUS) == NAMES
    for g in GPUS.values():
        assert g.source and g.memory_gib > 0 and g.bandwidth_gbs > 0 and g.fp16_tflops > 0


def test_dense_not_sparse_figures():
    assert get_gpu("h100-sxm").peak_flops("bf16") == pytest.approx(989.4e12)
    assert get_gpu("a100-80g").peak_flops("bf16") == pytest.approx(312e12)
    assert get_gpu("a100-40g").peak_flops("fp32") == pytest.approx(156e12)  # TF32 tensor cores
    assert get_gpu("l40s").peak_flops("fp8") == pytest.approx(733e12)


@pytest.mark.parametrize("name", ["v100-16g", "v100-32g", "t4"])
def test_bf16_refused_without_hardware_support(name):
    with pytest.raises(ValueError, match="no bfloat16"):
        get_gpu(name).peak_flops("bf16")
    with pytest.raises(ValueError, match="bf16"):
        plan(ModelConfig(preset="gpt2-small"), TrainConfig(precision="bf16"), gpu=name)
    assert get_gpu(name).peak_flops("fp16") > 0


def test_fp8_refused_before_hopper_and_unknown_gpu_named():
    with pytest.raises(ValueError, match="fp8"):
        get_gpu("a100-80g").peak_flops("fp8")
    with pytest.raises(ValueError, match="did you mean 'h100-sxm'"):
        get_gpu("h100-smx")


def test_device_name_lookup():
    assert gpu_for_device_name("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert gpu_for_device_name("NVIDIA A100-SXM4-80GB").name == "a100-80g"
    assert gpu_for_device_name("NVIDIA A10G").name == "a10"
    assert gpu_for_device_name("Some Unknown Accelerator") is None


def test_plan_fits_and_speed():
    p = plan(ModelConfig(preset="gpt2-small"), TrainConfig(micro_batch_size=8, precision="bf16"), gpu="a100-40g",
             tokens=1e9, price=2.0)
    assert p.fits is True and p.param_count == 124_439_808
    s = p.speed
    assert s.mfu_low < s.mfu_high
    assert s.tokens_per_second_low == pytest.approx(s.mfu_low * 312e12 / s.flops_per_token)
    assert s.total_time_seconds_high == pytest.approx(1e9 / s.tokens_per_second_low)
    assert s.cost_high == pytest.approx(s.gpu_hours_high * 2.0)
    d = p.to_dict()
    assert d["fits"] is True and d["param_count"] == 124_439_808
    assert d["memory"]["logits_and_loss"] > 0 and d["speed"]["step_time_seconds_low"] > 0
    # Default token budget: Chinchilla, 20 tokens per parameter.
    assert plan(ModelConfig(preset="gpt2-small"), gpu="a100-40g").tokens == 20 * 124_439_808


def test_plan_does_not_fit_and_num_gpus_becomes_data_parallel():
    p = plan(ModelConfig(preset="llama-2-7b"), TrainConfig(micro_batch_size=1, precision="bf16"), gpu="a100-80g")
    assert p.fits is False and p.memory.total > 80 * GiB
    p8 = plan(ModelConfig(preset="llama-2-7b"), TrainConfig(micro_batch_size=1, precision="bf16",
              activation_checkpointing="full"), ParallelConfig(zero_stage=3), gpu="a100-80g", num_gpus=8)
    assert p8.parallel["dp_shard"] == 8 and p8.fits is True
    with pytest.raises(ValueError, match="num-gpus"):
        plan(ModelConfig(preset="gpt2-small"), parallel_cfg=ParallelConfig(tp=2, dp_replicate=2), num_gpus=8)


def test_predict_peak_memory_bytes_is_tensor_bytes():
    m, t = ModelConfig(preset="gpt2-small"), TrainConfig(micro_batch_size=4, precision="bf16")
    cpu = predict_peak_memory_bytes(m, t, ParallelConfig(), "cpu")
    assert cpu == plan(m, t).memory.peak_tensor_bytes
    assert predict_peak_memory_bytes(m, t, ParallelConfig(dp_replicate=2), "cuda") > cpu
    with pytest.raises(ValueError, match="device_kind"):
        predict_peak_memory_bytes(m, t, ParallelConfig(), "tpu")


def test_recommend_ranks_layouts_that_fit():
    gpu = get_gpu("a100-80g")
    recs = recommend(ModelConfig(preset="llama-2-7b"), TrainConfig(micro_batch_size=2, gradient_accumulation_steps=2,
                     precision="bf16"), gpu, 8, top=5)
    assert 1 <= len(recs) <= 5
    speeds = [c.tokens_per_second for c in recs]
    assert speeds == sorted(speeds, reverse=True)
    for c in recs:
        assert c.memory.total <= gpu.memory_bytes and c.headroom_bytes >= 0
        assert c.parallel.world_size == 8
        # Global batch held: 2 * 2 * 8 sequences.
        assert c.train.micro_batch_size * c.train.gradient_accumulation_steps * c.parallel.dp == 32
        assert "zero_stage:" in "\n".join(c.recipe_lines())
    assert recommend(ModelConfig(preset="llama-3-70b"), TrainConfig(precision="bf16"), get_gpu("rtx3090"), 1) == []


def test_recommend_offload_layouts_need_host_memory():
    model, train, gpu = ModelConfig(preset="llama-2-70b"), TrainConfig(precision="bf16"), get_gpu("a100-80g")
    unchecked = recommend(model, train, gpu, 8, top=20)
    assert unchecked and all(c.parallel.offload != "none" for c in unchecked)  # 70B on 8 x 80 GB needs offload
    for c in unchecked:  # a node holds the offloaded states of its 8 GPUs
        assert c.host_bytes_per_node == 8 * c.memory.cpu_offload_bytes > 0
    least = min(c.host_bytes_per_node for c in unchecked)
    assert recommend(model, train, gpu, 8, top=20, host_memory_bytes=least - 1) == []
    kept = recommend(model, train, gpu, 8, top=20, host_memory_bytes=least)
    assert kept and all(c.host_bytes_per_node <= least for c in kept)
    assert len(kept) < len(unchecked)


def test_recommend_offloads_on_a_single_gpu_through_zero3():
    recs = recommend(ModelConfig(preset="llama-3-70b"), TrainConfig(precision="bf16"), get_gpu("h200"), 1)
    assert recs and all(c.parallel.zero_stage == 3 and c.parallel.offload != "none" for c in recs)
    assert all(c.parallel.world_size == 1 and c.host_bytes_per_node == c.memory.cpu_offload_bytes for c in recs)
    # Models that fit a GPU as they are still get plain layouts (offload only when nothing else fits).
    small = recommend(ModelConfig(preset="gpt2-small"), TrainConfig(precision="bf16"), get_gpu("h200"), 1)
    assert small and all(c.parallel.offload == "none" and c.parallel.zero_stage == 0 for c in small)
