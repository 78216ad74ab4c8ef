# The control plane: one image for the web process (uvicorn: gateway, admin, APIs), the Celery
# worker and Celery beat (the reconciler and billing's sweepers); compose/Kubernetes pick the command.
#   docker build -f deploy/docker/controlplane.Dockerfile -t tessera/controlplane .
FROM python:3.11-slim

# Static files (the admin's CSS/JS, Swagger UI and ReDoc) are collected into the image at build time,
# outside /var/lib/tessera so that no volume mounted there hides them; WhiteNoise serves them.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    DJANGO_SETTINGS_MODULE=controlplane.settings.production TESSERA_VAR_DIR=/var/lib/tessera \
    TESSERA_STATIC_ROOT=/app/static

WORKDIR /app
# The control plane never runs a model: point TORCH_INDEX_URL at a CPU-only torch wheel index to keep
# the image small (empty: pip's configured index).
ARG TORCH_INDEX_URL=""
RUN pip install torch ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
COPY pyproject.toml README.md ./
COPY common ./common
COPY controlplane ./controlplane
COPY tenants ./tenants
COPY billing ./billing
COPY dataplane ./dataplane
COPY kernels ./kernels
COPY benchmarks ./benchmarks
COPY manage.py jsonlog.py ./
RUN pip install . && useradd --system --home /app tessera && mkdir -p /var/lib/tessera \
    && chown tessera /var/lib/tessera && DJANGO_SECRET_KEY=build python manage.py collectstatic --noinput
USER tessera

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import httpx; httpx.get('http://127.0.0.1:8000/internal/v1/health').raise_for_status()"
CMD ["uvicorn", "controlplane.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
