# syntax=docker/dockerfile:1
# epifuse on NVIDIA Triton Inference Server. Build stage: NGC's TensorRT image of the same release
# as the Triton image (same CUDA and TensorRT versions; it has nvcc and TensorRT's headers, the
# Triton image has neither), running .ci/build.sh as CI does, with the CUDA parts on. Runtime
# stage: the Triton image plus the epifuse wheel; no compiler. See docs/deploy.md.
#
#   docker build -t epifuse-triton .          # --build-arg EPIFUSE_CUDA_ARCHS=90a for one GPU kind
ARG NGC_RELEASE=25.10

FROM nvcr.io/nvidia/tensorrt:${NGC_RELEASE}-py3 AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# fetch_deps.sh verifies Debian's archive signatures with this keyring; the rest is in the image.
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends debian-archive-keyring \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY plugins plugins
COPY optimizer optimizer
COPY models models
COPY .ci/build.sh .ci/build.sh
ARG EPIFUSE_CUDA_ARCHS="80;86;89;90a;100a;120"
ENV EPIFUSE_CUDA_ARCHS=${EPIFUSE_CUDA_ARCHS} EPIFUSE_REQUIRE_TRT=1 EPIFUSE_DEPS_DIR=/tmp/epifuse-deps
RUN .ci/build.sh /dist

FROM nvcr.io/nvidia/tritonserver:${NGC_RELEASE}-py3
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The wheel is bind-mounted, not copied, so it leaves no layer; /opt/epifuse/lib is a link to the
# installed libraries (the absolute path export-triton writes into config.pbtxt). Triton loads them
# without Python, and through that link their RUNPATH misses oneDNN: its folder goes to ldconfig.
RUN --mount=type=bind,from=build,source=/dist,target=/dist \
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir /dist/epifuse-*.whl \
    && mkdir -p /opt/epifuse/bin \
    && ln -s "$(python3 -c 'import optimizer, os; print(os.path.dirname(optimizer.__file__))')/lib" /opt/epifuse/lib \
    && test -f /opt/epifuse/lib/libepifuse_ort.so && test -f /opt/epifuse/lib/libepifuse_trt_static.so \
    && python3 -c 'from optimizer.libraries import preload_onednn; print(preload_onednn().parent)' \
       > /etc/ld.so.conf.d/epifuse-onednn.conf && ldconfig \
    && command -v epifuse \
    && groupadd --gid 10001 epifuse && useradd --create-home --uid 10001 --gid 10001 epifuse
COPY --chmod=755 .ci/docker-entrypoint.sh /opt/epifuse/bin/entrypoint.sh
ENV EPIFUSE_LIB_DIR=/opt/epifuse/lib
USER 10001:10001
WORKDIR /home/epifuse
ENTRYPOINT ["/opt/epifuse/bin/entrypoint.sh"]
CMD ["tritonserver", "--model-repository=/models"]
