# llmframe-ray on the CPU: the package, the bundled all-MiniLM-L6-v2 exported to ONNX at build
# time, a non-root user. PyTorch is needed only to export models; it comes from the CPU wheel
# index given as TORCH_INDEX_URL (PyTorch's "CPU" install selector names it), so no CUDA wheels
# enter the image:
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch CPU wheel index> -t llmframe-ray .
#   docker run --rm -p 8000:8000 -e API_SECRET_KEY=... -v llmframe-indexes:/data llmframe-ray
FROM python:3.11-slim

ARG TORCH_INDEX_URL
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LLMFRAME_HOME=/home/app/.cache/llmframe-ray

RUN useradd --create-home --uid 10001 app
WORKDIR /app
COPY pyproject.toml README.md ./
COPY llmframe_ray ./llmframe_ray
COPY scripts ./scripts
COPY deployments ./deployments
COPY jobs ./jobs

RUN test -n "$TORCH_INDEX_URL" || { echo "set --build-arg TORCH_INDEX_URL to PyTorch's CPU wheel index" >&2; exit 1; } \
 && pip install --index-url "$TORCH_INDEX_URL" "torch==2.13.0" \
 && pip install . "torch==2.13.0"

# /data belongs to the app user: a new named volume takes the ownership of the image's folder
# (root-owned, the default command could not write the index there).
RUN mkdir -p /data && chown 10001:10001 /data

USER 10001
# Export the bundled embedding model once, into the image (LLMFRAME_HOME/models).
RUN python -c "from llmframe_ray.config import load_settings; from llmframe_ray.models.embedder import ensure_local_model; ensure_local_model(load_settings().models_dir)"

VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
# The sample corpus, ingested into /data/index unless an index is there, then served on 8000.
CMD ["sh", "-c", "test -f /data/index/CURRENT || { llmframe-ray index sample /data/sample && llmframe-ray ingest /data/sample --index /data/index --shards 2; } && exec llmframe-ray serve --index /data/index --host 0.0.0.0 --port 8000"]
