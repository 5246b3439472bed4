# syntax=docker/dockerfile:1
# base-sglang images. Stages (pick one with --target; the last, `gpu`, is the default):
#   wheel   builds the base-sglang wheel from the source (build stage only)
#   cpu     serves the embedded proxy MoE model on CPU (native engine); no GPU needed
#   router  SGLang's model gateway (`smg`) that load-balances the replicas (deploy/compose.yml)
#   gpu     base-serve --backend sglang on the official SGLang image, for H100/H200 nodes
#
#   docker build -t base-sglang:gpu .
#   docker build -t base-sglang:cpu --target cpu .
#   docker build -t base-sglang:router --target router .
#
# sglang 0.5.23 ships CUDA 13 images only (the CUDA 12 lane ended with 0.5.19); cu130 runs on
# Hopper (sm_90) with an R580+ driver. Override the base with --build-arg SGLANG_IMAGE=... (e.g.
# the smaller v0.5.23-cu130-runtime); the build checks that the image's sglang is SGLANG_VERSION,
# the version pyproject.toml pins.
ARG PYTHON_VERSION=3.12
ARG SGLANG_VERSION=0.5.23
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG SMG_VERSION=1.13.0
# uid of the non-root user; match the owner of the host's Hugging Face cache directory
ARG BASE_UID=1000

# ---------------------------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY base_sglang/ base_sglang/
COPY kernels/ kernels/
COPY server/ server/
COPY calibration/ calibration/
RUN pip wheel --no-deps --wheel-dir /dist .

# ---------------------------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS cpu
ARG TORCH_VERSION
ARG TORCH_INDEX_URL
ARG BASE_UID
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    HF_HOME=/data/huggingface
# CPU-only torch from the PyTorch CPU index (the PyPI wheel would pull the CUDA libraries)
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# dependency layer: only pyproject.toml, so source edits keep this layer cached;
# the constraints keep the torch installed above
COPY pyproject.toml deploy/requirements.py /opt/base/build/
RUN pip list --format=freeze > /opt/base/build/installed.txt \
    && python /opt/base/build/requirements.py --pyproject /opt/base/build/pyproject.toml server \
        > /opt/base/build/requirements.txt \
    && pip install --constraint /opt/base/build/installed.txt \
        --requirement /opt/base/build/requirements.txt
COPY --from=wheel /dist/ /opt/base/dist/
RUN pip install --no-deps /opt/base/dist/*.whl \
    && base-serve --help > /dev/null
COPY --chmod=0755 deploy/healthcheck.py /usr/local/bin/base-healthcheck
RUN useradd --uid "${BASE_UID}" --create-home --home-dir /home/base --shell /bin/bash base \
    && mkdir -p /data/huggingface /data/predictors \
    && chown -R base:base /data
USER ${BASE_UID}
WORKDIR /home/base
VOLUME ["/data/huggingface", "/data/predictors"]
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=10s --start-period=120s --retries=3 CMD ["base-healthcheck"]
# no arguments: the embedded default model (shipped in the package) on CPU
ENTRYPOINT ["base-serve", "--host", "0.0.0.0", "--port", "8000"]
CMD []

# ---------------------------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS router
ARG SMG_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
RUN pip install "smg==${SMG_VERSION}"
COPY --chmod=0755 deploy/healthcheck.py /usr/local/bin/base-healthcheck
RUN useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin router
USER 10001
EXPOSE 30000 29000
# ready once at least one replica is healthy (/health answers 200 even with none)
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 \
    CMD ["base-healthcheck", "http://127.0.0.1:30000/readiness"]
ENTRYPOINT ["smg", "launch", "--host", "0.0.0.0", "--port", "30000"]
CMD ["--help"]

# ---------------------------------------------------------------------------------------------
FROM ${SGLANG_IMAGE} AS gpu
ARG SGLANG_VERSION
ARG BASE_UID
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1 \
    PYTHONUNBUFFERED=1 \
    HF_HOME=/data/huggingface \
    SGLANG_PLUGINS=base
# SGLANG_PLUGINS whitelists entry-point names of group sglang.srt.plugins: only our `base` plugin
# (sglang's dependency smg-grpc-servicer also registers smg-servicer and smg-zmq, hooks for its
# gRPC mode that HTTP serving does not use)
RUN python3 -c "import importlib.metadata as m, sys; v = m.version('sglang'); \
sys.exit(0 if v == '${SGLANG_VERSION}' else f'base image has sglang {v}; base-sglang pins ${SGLANG_VERSION}')"
# dependency layer: only what the image lacks (--skip-installed: the image's sglang, torch,
# transformers, ... stay as SGLang pinned them; disagreements are printed), and the constraints
# keep every installed package from being replaced by a new package's requirements
COPY pyproject.toml deploy/requirements.py /opt/base/build/
RUN python3 -m pip list --format=freeze > /opt/base/build/installed.txt \
    && python3 /opt/base/build/requirements.py --pyproject /opt/base/build/pyproject.toml \
        --skip-installed sglang > /opt/base/build/requirements.txt \
    && python3 -m pip install --constraint /opt/base/build/installed.txt \
        --requirement /opt/base/build/requirements.txt
COPY --from=wheel /dist/ /opt/base/dist/
RUN python3 -m pip install --no-deps /opt/base/dist/*.whl \
    && python3 -c "import importlib.metadata as m, sys; \
sys.exit(0 if 'base' in {e.name for e in m.entry_points(group='sglang.srt.plugins')} else 'plugin entry point missing')" \
    && base-serve --help > /dev/null
COPY --chmod=0755 deploy/healthcheck.py /usr/local/bin/base-healthcheck
# Ubuntu-based images already hold a user with uid 1000 (`ubuntu`): rename it, else create one
RUN if getent passwd "${BASE_UID}" > /dev/null; then \
        old="$(getent passwd "${BASE_UID}" | cut -d: -f1)"; \
        usermod --login base --home /home/base --move-home "${old}"; \
        groupmod --new-name base "$(id -gn base)"; \
    else \
        useradd --uid "${BASE_UID}" --create-home --home-dir /home/base --shell /bin/bash base; \
    fi \
    && mkdir -p /home/base /data/huggingface /data/predictors \
    && chown -R base:base /home/base /data
USER ${BASE_UID}
WORKDIR /home/base
VOLUME ["/data/huggingface", "/data/predictors"]
EXPOSE 8000
# model load plus CUDA-graph capture of a large MoE takes minutes: long start period
HEALTHCHECK --interval=30s --timeout=10s --start-period=1200s --retries=3 CMD ["base-healthcheck"]
# docker run IMAGE --model M --predictor /data/predictors/P.safetensors [sglang server args]
ENTRYPOINT ["base-serve", "--backend", "sglang", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--help"]
