# The Sieve service image (used by docker-compose.yml). Needs network access to PyPI at build time.
FROM python:3.11-slim
WORKDIR /srv/sieve
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install --no-cache-dir .
COPY config ./config
COPY golden_set ./golden_set
# Runs as an unprivileged user; it writes only under target/ (reports, jobs, model cache, embedded store).
RUN useradd --system --uid 10001 --home-dir /srv/sieve sieve \
    && mkdir -p /srv/sieve/target && chown -R sieve:sieve /srv/sieve/target
USER sieve
EXPOSE 8000
# 0.0.0.0 inside the container only; docker-compose.yml publishes it on the host's 127.0.0.1.
CMD ["sieve", "serve", "--host", "0.0.0.0", "--port", "8000"]
