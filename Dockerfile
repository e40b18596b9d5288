# syntax=docker/dockerfile:1
# taugrid-evidence images: two targets from one build (the chart uses REPO:TAG and REPO:TAG-agent).
#   docker build --target collector -t REPO:TAG .
#   docker build --target agent     -t REPO:TAG-agent .
# Only the package's runtime dependencies are installed: never the `dev` extra, so never Ray.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# --- build: a virtual environment holding the package and its runtime dependencies -------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/taugrid
COPY pyproject.toml README.md ./
COPY collector ./collector
COPY exporters ./exporters
RUN /opt/taugrid/bin/pip install --no-compile . \
 && find /opt/taugrid -name '__pycache__' -prune -exec rm -rf {} + \
 && rm -rf /opt/taugrid/lib/python3.11/site-packages/pip /opt/taugrid/bin/pip*

# --- runtime base: the venv on a slim image, no compiler, no pip ------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/taugrid/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
COPY --from=build /opt/taugrid /opt/taugrid
RUN groupadd --system --gid 65532 taugrid \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin taugrid
WORKDIR /tmp

# --- the controller (Deployment) --------------------------------------------------------------
FROM runtime AS collector
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["taugrid-evidence"]
CMD ["controller", "--metrics-address", "0.0.0.0:9464"]

# --- the node agent (DaemonSet) ---------------------------------------------------------------
# Non-root by default; the chart runs it as root with every capability dropped but SYSLOG only
# where the kubelet's root-owned pod-resources socket and /dev/kmsg need it.
FROM runtime AS agent
USER 65532:65532
EXPOSE 9465
ENTRYPOINT ["taugrid-evidence"]
CMD ["agent"]
