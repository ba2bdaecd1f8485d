# The Sieve service image (used by docker-compose.yml). Needs network access to PyPI at build time.
FROM python:3.11-slim
WORKDIR /srv/sieve
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY app ./app
RUN pip install --no-cache-dir .
COPY config ./config
COPY golden_set ./golden_set
EXPOSE 8000
CMD ["sieve", "serve", "--host", "0.0.0.0", "--port", "8000"]
