# dra-driver container image: one image for every mode, `dra-driver <subcommand>`.
#
# Build with `make image` (docker, or podman where only podman is installed; needs network for
# the base image and the packages): tags dra-driver:<version>, the chart's default image;
# `make image IMAGE=registry.example.com/gpu/dra-driver:0.1.0` for a registry (README, Deploying).
#
# Privileges by mode (the image defaults to an unprivileged user; the Helm chart raises them
# only for the node agents, which cannot work without):
#   kubelet-plugin  root: creates sockets under the host's /var/lib/kubelet/plugins_registry and
#                   /var/lib/kubelet/plugins, writes CDI specs to /var/run/cdi and its checkpoint
#                   (all root-owned host directories). Real GPUs: also privileged, to open the
#                   /dev/nvidia* device nodes through NVML. Fake GPUs (--fake): root, unprivileged.
#   device-plugin   root: its socket lives in the root-owned /var/lib/kubelet/device-plugins and
#                   it may write CDI specs; privileged on real GPUs for /dev/nvidia*.
#   discover --fake, slices, simulate, demo: run as the default non-root user, no host access.
#
# Python 3.11 on purpose: constraints.txt is the pip freeze of the project's 3.11 environment.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/dra-driver
# Dependencies first (cached until constraints change), then the package itself.
COPY constraints.txt pyproject.toml README.md ./
COPY dra_driver ./dra_driver
RUN /opt/dra-driver/bin/pip install --no-cache-dir -c constraints.txt . \
    && /opt/dra-driver/bin/dra-driver --version

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="dra-driver" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs (topology-aware), with a legacy device-plugin mode" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
RUN groupadd --system --gid 10001 dra \
    && useradd --system --uid 10001 --gid dra --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin dra
COPY --from=build /opt/dra-driver /opt/dra-driver
# Byte-code for both ways the image runs Python: plain (the CLI) and -OO (the chart's daemons run
# with PYTHONOPTIMIZE=2: ~2 MiB less per node agent, docs/fleet.md), for the standard library too.
# With PYTHONDONTWRITEBYTECODE nothing is written at run time, so a module without its .pyc would
# be compiled at every start of every agent: CPU, and memory the agent then keeps.
RUN python -m compileall -q -j 0 -o 0 -o 2 -x '/(test|tests|idle_test)/' \
      "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" /opt/dra-driver/lib
# MALLOC_ARENA_MAX: glibc gives each thread its own malloc arena up to 8 per core (1,024 on a
# 128-core GPU node); an agent's ~25 threads need no more than two (docs/fleet.md).
ENV PATH=/opt/dra-driver/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MALLOC_ARENA_MAX=2 \
    LOG_FORMAT=json
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["dra-driver"]
CMD ["--help"]
