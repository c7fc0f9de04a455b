# Minimal image: the optimizer and the ONNX Runtime CPU op, built by the same `pip install .` CI
# runs. The deployment image on Triton comes with its own issue.
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends g++ make ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python3 -m pip install --no-cache-dir . && useradd --create-home epifuse
USER epifuse
ENTRYPOINT ["epifuse"]
