"""The CPU image .ci/docker-check.sh builds from docker/Dockerfile with podman
(localhost/gptforge:cpu): gptforge of this checkout over the CPU build of torch, and `gptforge serve`
inside it answering the `openai` client through a port published on 127.0.0.1 with the same greedy
text as gptforge outside. Skipped, with the reason, where podman or the image is missing (the build
needs debootstrap, PyPI and a local CPU torch wheel; see docs/scale-out.md)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.engine_servers import REPO, free_port, running_server

if not os.environ.get("GPTFORGE_ENGINE_TESTS"):
    pytest.skip("an engine step of .ci/run, outside the README test command (minutes per server start): "
                "GPTFORGE_ENGINE_TESTS=1 python -m pytest " + __name__.replace(".", "/") + ".py",
                allow_module_level=True)

IMAGE = "localhost/gptforge:cpu"
ENV = {**os.environ, "CONTAINERS_CONF": str(REPO / ".ci" / "containers.conf")}


@pytest.fixture(scope="module")
def podman() -> str:
    exe = shutil.which("podman")
    if exe is None:
        pytest.skip("no podman here: the image is built and checked where podman runs (.ci/docker-check.sh)")
    if subprocess.run([exe, "image", "exists", IMAGE], env=ENV).returncode != 0:
        pytest.skip(f"no {IMAGE} image: .ci/docker-check.sh builds it (its output in CI says why it did not)")
    return exe


def test_image_holds_this_gptforge_over_cpu_torch(podman):
    import gptforge

    out = subprocess.run([podman, "run", "--rm", "--entrypoint", "python", IMAGE, "-c",
                          "import torch, gptforge; print(torch.__version__, torch.version.cuda, gptforge.__version__)"],
                         env=ENV, capture_output=True, text=True, timeout=300, check=True).stdout.split()
    assert out == ["2.13.0+cpu", "None", gptforge.__version__]
    help_text = subprocess.run([podman, "run", "--rm", IMAGE], env=ENV, capture_output=True, text=True,
                               timeout=300, check=True).stdout
    assert "quickstart" in help_text and "serve" in help_text  # the entry point is gptforge, CMD --help


def test_serve_in_the_image_answers_the_openai_client_from_outside(podman, tiny_shards, tmp_path):
    import torch
    from openai import OpenAI

    from gptforge.data.tokenizer import Tokenizer
    from gptforge.infer.generate import generate
    from gptforge.runtime.loading import load_for_inference
    from tests.conftest import train_nano_run

    run = train_nano_run(tiny_shards, tmp_path / "run")
    port = free_port()
    name = f"gptforge-test-{port}"
    cmd = [podman, "run", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8000", "-v", f"{run}:/workspace/run:ro",
           IMAGE, "serve", "run", "--host", "0.0.0.0", "--port", "8000", "--served-model-name", "tiny"]
    try:
        with running_server(cmd, f"http://127.0.0.1:{port}", tmp_path / "serve.log", 300, env=ENV):
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
            r = client.completions.create(model="tiny", prompt="def main():\n    ", max_tokens=16, temperature=0)
    finally:
        subprocess.run([podman, "rm", "-f", name], env=ENV, capture_output=True)
    model, _, _, tok_path = load_for_inference(run, "cpu")
    tok = Tokenizer.from_file(tok_path)
    ids = tok.encode("def main():\n    ")
    ours = generate(model, torch.tensor([ids]), 16, temperature=0)[0, len(ids):].tolist()
    assert r.choices[0].text == tok.decode(ours) and r.usage.completion_tokens == 16
