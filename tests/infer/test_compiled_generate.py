"""`generate(..., compile=True)`: torch.compile'd forward passes give eager's greedy tokens."""

import pytest
import torch

from gptforge.config import ModelConfig
from gptforge.infer.generate import compiled_forward, generate
from gptforge.model import GPT
from gptforge.train.compile_choice import cpp_compiler


@pytest.mark.skipif(cpp_compiler() is None, reason="Inductor's CPU backend needs a C++ compiler (c++, g++, clang++)")
def test_compiled_greedy_equals_eager_and_the_wrapper_is_built_once():
    torch.manual_seed(3)
    cfg = ModelConfig(arch="llama", n_layer=1, n_head=2, n_kv_head=1, d_model=32, block_size=40,
                      vocab_size=97).resolved()
    m = GPT(cfg).eval()
    # A trained-like margin: scale the head so greedy choices are not near-ties under rounding.
    with torch.no_grad():
        m.lm_head.weight.mul_(8)
    prompt = torch.randint(0, 97, (1, 5))
    eager = generate(m, prompt, 12, temperature=0)
    compiled = generate(m, prompt, 12, temperature=0, compile=True)
    assert torch.equal(compiled, eager)
    assert compiled_forward(m) is compiled_forward(m)  # one wrapper per model
    assert not any("_orig_mod" in k for k in m.state_dict())  # the wrapper is not a submodule
