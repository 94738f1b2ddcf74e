#!/usr/bin/env bash
# Build docker/Dockerfile with podman where Docker Hub and PyTorch's index are out of reach, then
# run the image: `gptforge --help`, a one-minute quickstart, and `gptforge serve` on its run
# answering a completion from outside the container through a port published on 127.0.0.1.
#
#   .ci/docker-check.sh WORK_DIR
#
# The base image is Debian bookworm made by debootstrap (python3, its venv module, the host's CA
# certificates so that pip reaches PyPI through the same TLS proxy as the host), given to the build
# in place of the FROM image (podman build --from). torch is the CPU wheel (torch==2.13.0+cpu,
# cp311 for bookworm's Python 3.11) from pip's find-links or DOCKER_TORCH_PIP_ARGS (e.g.
# "--index-url https://download.pytorch.org/whl/cpu"), put in docker/ for the build and removed
# after. The image is tagged localhost/gptforge:cpu (tests/e2e/test_docker_image.py
# checks it). Exit 0 when every step passed; 3, with the reason, when podman or debootstrap is
# missing, podman does not work or debootstrap cannot fetch Debian; non-zero otherwise.
set -euo pipefail
work=${1:?usage: .ci/docker-check.sh WORK_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
export CONTAINERS_CONF="$root/.ci/containers.conf"
base=localhost/gptforge-base:bookworm
image=localhost/gptforge:cpu
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "docker check skipped: no $tool (apt-get install podman runc debootstrap)"; exit 3; }
done
podman info >/dev/null 2>&1 || { echo "docker check skipped: podman does not work here ($(podman info 2>&1 | tail -n 1))"; exit 3; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
step() { echo "== $1 ($(date -u +%T))"; }

if ! podman image exists "$base"; then
  step "base image $base: debootstrap bookworm"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/rootfs" \
    http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1 \
    || { echo "docker check skipped: debootstrap failed: $(tail -n 2 "$work/debootstrap.log")"; exit 3; }
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$work/rootfs/usr/local/share/ca-certificates/"
    chroot "$work/rootfs" update-ca-certificates >/dev/null
  fi
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$work/rootfs/etc/pip.conf"
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb
  tar -C "$work/rootfs" -c . | podman import - "$base" >/dev/null
  rm -rf "$work/rootfs"
fi

step "torch CPU wheel"
mkdir -p "$work/wheels"
read -r -a torch_args <<< "${DOCKER_TORCH_PIP_ARGS:-}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$work/wheels" "${torch_args[@]}" "torch==2.13.0+cpu"
wheel=$(cd "$work/wheels" && ls torch-2.13.0+cpu-cp311-*.whl | head -n 1)
trap 'rm -f "$root/docker/$wheel"' EXIT
ln -f "$work/wheels/$wheel" "$root/docker/$wheel" 2>/dev/null || cp "$work/wheels/$wheel" "$root/docker/"

step "podman build $image"
podman build -q --network host --from "$base" -f "$root/docker/Dockerfile" -t "$image" \
  --build-arg TORCH_INSTALL="docker/$wheel" --build-arg GPTFORGE_EXTRAS=serve "$root"
rm -f "$root/docker/$wheel"
podman image prune -f >/dev/null  # the layers of earlier builds that no tag names

step "gptforge --help in the image"
help_text=$(podman run --rm "$image" --help)
grep -q quickstart <<< "$help_text"

step "gptforge quickstart --minutes 1 in the image"
rm -rf "$work/ws" && mkdir -p "$work/ws"
podman run --rm -v "$work/ws:/workspace" "$image" quickstart --minutes 1 --max-files 60 --vocab-size 1024 \
  --workers 2 --quiet | tail -n 5

step "gptforge serve in the image, asked from outside"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cid=$(podman run -d --rm -p "127.0.0.1:$port:8000" -v "$work/ws:/workspace" "$image" \
  serve quickstart/run --host 0.0.0.0 --port 8000 --served-model-name qs)
trap 'podman rm -f "$cid" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 1 90); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
  sleep 2
done
curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "qs", "prompt": "def ", "max_tokens": 16, "temperature": 0}' >"$work/answer.json" \
  || { podman logs "$cid" | tail -n 20; exit 1; }
python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))["choices"][0]
assert c["text"] and c["finish_reason"] == "length", c; print("served from the container:", repr(c["text"]))' \
  "$work/answer.json"
echo "docker check passed"
