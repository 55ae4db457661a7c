# salus-server with the CUDA device, for hosts with an NVIDIA GPU (driver R580 or newer for
# CUDA 13) and the NVIDIA Container Toolkit.
#
#   docker build -f docker/cuda.Dockerfile -t salus-server-cuda .
#   docker run --rm --gpus all -v /run/salus:/run/salus -p 127.0.0.1:9464:9464 salus-server-cuda
#
# The same entrypoint, config and user as the CPU image (docker/Dockerfile): jobs reach the
# daemon on its ipc socket, /run/salus/salus.sock; metrics listen on all of the container's
# interfaces at 9464 (publish that port on loopback unless other hosts should scrape it).
# It serves cuda:0 by default; pass `--device cuda:all` (or cuda:N) as arguments to change that.
#
# Both stages are Debian 12 with NVIDIA's CUDA repository for Debian 12 rather than an
# nvidia/cuda image: the daemon is built against Debian 12's packages (oneDNN 2.7's API, ONNX,
# ZeroMQ, protobuf 3.21), which the Ubuntu releases under NVIDIA's images do not carry at those
# versions. The runtime stage takes the CUDA runtime, cuBLAS and cuDNN only.

ARG CUDA_VERSION=13-0
ARG CUDA_KEYRING=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb

FROM debian:12 AS build
ARG CUDA_VERSION
ARG CUDA_KEYRING
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# NVIDIA's repository key package, fetched by URL (the base image has no curl).
# hadolint ignore=DL3020
ADD ${CUDA_KEYRING} /tmp/cuda-keyring.deb
RUN dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
    && apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates \
      libzmq3-dev cppzmq-dev libprotobuf-dev protobuf-compiler \
      libboost-dev libboost-program-options-dev libboost-system-dev \
      nlohmann-json3-dev libspdlog-dev libfmt-dev libgoogle-perftools-dev \
      libonnx-dev libdnnl-dev ocl-icd-opencl-dev opencl-c-headers \
      cuda-nvcc-${CUDA_VERSION} cuda-cudart-dev-${CUDA_VERSION} cuda-cccl-${CUDA_VERSION} \
      libcublas-dev-${CUDA_VERSION} libcudnn9-dev-cuda-13 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# SALUS_WITH_CUDA=ON: a missing toolkit or cuDNN is an error, never a CPU-only image.
RUN cmake --preset release -DSALUS_WITH_CUDA=ON -DSALUS_BUILD_TESTS=OFF \
      -DSALUS_BUILD_BENCHMARKS=OFF -DSALUS_WITH_TENSORFLOW=OFF \
      -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    && cmake --build build --target salus-server salusctl salus-devices \
    && build/bin/salus-server --version | grep -q "devices: cpu, cuda"

FROM debian:12-slim
ARG CUDA_VERSION
ARG CUDA_KEYRING
# hadolint ignore=DL3020
ADD ${CUDA_KEYRING} /tmp/cuda-keyring.deb
RUN dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb \
    && apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libzmq5 libprotobuf32 libboost-program-options1.74.0 libspdlog1.10 libfmt9 \
      libonnx1 libdnnl2 libgomp1 libgoogle-perftools4 ocl-icd-libopencl1 \
      cuda-cudart-${CUDA_VERSION} libcublas-${CUDA_VERSION} libcudnn9-cuda-13 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --shell /usr/sbin/nologin salus \
    && mkdir -p /run/salus && chown salus:salus /run/salus
COPY --from=build /src/build/bin/salus-server /src/build/bin/salusctl \
     /src/build/bin/salus-devices /usr/local/bin/
COPY docker/salus.json /etc/salus/salus.json
USER salus
# The NVIDIA Container Toolkit mounts the driver and the GPUs these name.
ENV OMP_WAIT_POLICY=PASSIVE RUNTIME_DIRECTORY=/run/salus \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/cuda/lib64
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s \
  CMD ["salusctl", "--endpoint", "ipc:///run/salus/salus.sock", "status"]
ENTRYPOINT ["salus-server", "--config", "/etc/salus/salus.json", \
            "--listen", "ipc:///run/salus/salus.sock", "--metrics-listen", "0.0.0.0:9464"]
CMD ["--device", "cuda:0"]
