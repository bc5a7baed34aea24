# The one image Capstan's chart runs: `capstan` (operator, controller, broker and the CLI).
# Build: docker build -t capstan:0.1.0 .   The chart and the operator run it as
# `capstan <command> ...` with the restricted security context (user 10001, read-only root).
#
# BASE is any Debian-like image with Python 3.11+ and its venv module: the public
# python:3.11-slim-bookworm by default, or a local Debian bookworm with python3 and
# python3-venv (scripts/k8s_images.sh builds one; Debian's Python refuses pip into the system,
# PEP 668, so Capstan lives in a venv at /opt/capstan on every base). When the build context
# holds a wheelhouse/ folder (scripts/k8s_images.sh puts one there), pip installs from it
# alone and the build needs no network; without it pip downloads, as users' builds do.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# The bracket matches wheelhouse/ when it is there and nothing otherwise; README.md is there
# so that COPY always has a source. The folder's wheels land in /wheelhouse/, and then pip
# (also the one installing build backends) looks nowhere else.
COPY README.md wheelhous[e] /wheelhouse/
RUN if ls /wheelhouse/*.whl >/dev/null 2>&1; then \
        printf '[global]\nno-index = true\nfind-links = /wheelhouse\n' >/etc/pip.conf; \
    fi
# /src holds a folder named `operator`: `python3 -m` must not put it on sys.path.
ENV PYTHONSAFEPATH=1
WORKDIR /src
# The dependencies first, in a layer that a change to Capstan's code leaves cached.
COPY pyproject.toml ./
RUN python3 -m venv /opt/capstan \
    && python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
        >/tmp/requirements.txt \
    && /opt/capstan/bin/pip install --no-cache-dir -r /tmp/requirements.txt
COPY README.md ./
COPY capstan/ capstan/
COPY broker/ broker/
COPY controller/ controller/
COPY operator/ operator/
COPY client/ client/
COPY spark/ spark/
COPY bench/ bench/
# The final stage copies the venv alone, so no wheel or build tool stays in a layer. Both
# stages run the same BASE, so the venv's link to the base's python3 holds in the final one.
RUN /opt/capstan/bin/pip install --no-cache-dir --no-deps --no-warn-script-location .

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1
# HOME is /tmp: the official RocketMQ client, which Capstan imports for the protocol's stubs,
# makes ~/logs at import, and under a read-only root filesystem /tmp is what pods mount
# writable (an emptyDir in every pod the chart and the operator make).
ENV PATH=/opt/capstan/bin:$PATH \
    HOME=/tmp
RUN groupadd --gid 10001 capstan \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/capstan \
        --shell /usr/sbin/nologin capstan \
    && mkdir -p /var/lib/capstan /etc/capstan \
    && chown 10001:10001 /var/lib/capstan
COPY --from=build /opt/capstan /opt/capstan
USER 10001:10001
WORKDIR /var/lib/capstan
# broker gRPC and metrics, controller gRPC and metrics, operator liveness, metrics, webhook
EXPOSE 8081 9100 9876 9101 8080 9090 9443
ENTRYPOINT ["capstan"]
CMD ["--help"]
