# The one image Capstan's chart runs: `capstan` (operator, controller, broker and the CLI).
# Build: docker build -t capstan:0.1.0 .   The chart and the operator run it as
# `capstan <command> ...` with the restricted security context (user 10001, read-only root).
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY capstan/ capstan/
COPY broker/ broker/
COPY controller/ controller/
COPY operator/ operator/
COPY client/ client/
COPY spark/ spark/
COPY bench/ bench/
# Capstan and every dependency as wheels, so the image installs without a network.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1
RUN groupadd --gid 10001 capstan \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/capstan \
        --shell /usr/sbin/nologin capstan \
    && mkdir -p /var/lib/capstan /etc/capstan \
    && chown 10001:10001 /var/lib/capstan
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels capstan \
    && rm -rf /wheels
USER 10001:10001
WORKDIR /var/lib/capstan
# broker gRPC and metrics, controller gRPC and metrics, operator liveness, metrics, webhook
EXPOSE 8081 9100 9876 9101 8080 9090 9443
ENTRYPOINT ["capstan"]
CMD ["--help"]
