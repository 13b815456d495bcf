#!/usr/bin/env bash
# Installs what the build needs from Debian's packages, once (idempotent: a no-op when present).
# Used by `make run`, `make test` and CI; never needs to be run by hand.
set -euo pipefail
packages=(cmake ninja-build g++ ccache libgtest-dev nlohmann-json3-dev libcli11-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# CUTLASS 4.2 headers for the CUDA backend, into an ignored folder (only when nvcc exists).
cutlass_dir=.deps/nvidia-cutlass
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  if [ ! -f "$cutlass_dir/cutlass_library/source/include/cutlass/cutlass.h" ]; then
    echo "setup: installing CUTLASS headers (nvidia-cutlass==4.2.0.0) into $cutlass_dir"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$cutlass_dir" nvidia-cutlass==4.2.0.0
  fi
fi
