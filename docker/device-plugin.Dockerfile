# salus-device-plugin: the node's salus-server as kubelet device-plugin resources
# (docs/kubernetes.md; deployed by deploy/helm/salus beside the daemon).
#
#   docker build -f docker/device-plugin.Dockerfile -t salus-device-plugin .
#
# The build stage generates the Python protocol modules with Debian's protoc (they are
# git-ignored); the image installs the Python client package with its `kubernetes` extra
# (grpcio) into a venv, at the versions pinned in requirements.txt, which is used as a
# constraints file so that only the client's own dependencies are installed.

FROM debian:12-slim AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      protobuf-compiler python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements.txt ./
COPY proto/ proto/
COPY adaptors/python/ adaptors/python/
RUN rm -rf adaptors/python/salus/_generated adaptors/python/*.egg-info \
    && mkdir -p adaptors/python/salus/_generated \
    && protoc --proto_path=proto --python_out=adaptors/python/salus/_generated \
         proto/salus/v1/salus.proto proto/salus/v1/aten_graph.proto \
         proto/k8s/deviceplugin_v1beta1.proto proto/k8s/podresources_v1.proto \
    && python3 -m venv /opt/salus \
    && /opt/salus/bin/pip install --no-cache-dir -c requirements.txt \
         "./adaptors/python[kubernetes]" \
    && /opt/salus/bin/salus-device-plugin --help >/dev/null

FROM debian:12-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/salus /opt/salus
ENV PATH=/opt/salus/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Root: the plugin serves sockets in the kubelet's device-plugins directory and is the
# daemon's administrator over its ipc socket (the chart drops every capability).
# hadolint ignore=DL3002
USER root
ENTRYPOINT ["salus-device-plugin"]
