# vllm-router (a Rust binary, installed from PyPI) for deploy/compose.yaml and the
# Kubernetes manifests. Build from the repository root:
#   docker build -f deploy/router.Dockerfile -t vllm-router:0.1.17 .
FROM python:3.11-slim
RUN pip install --no-cache-dir vllm-router==0.1.17
EXPOSE 30000 29000
ENTRYPOINT ["vllm-router"]
