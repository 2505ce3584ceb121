# One image for every Airflow component in docker-compose.yaml: api-server, scheduler (with its
# LocalExecutor workers), dag-processor and both triggerers. It is the official Airflow image
# plus this package with all its extras, installed from the repository source. The triggerer
# imports the trigger classes, so it has to run this same image.
#
#   docker build -t airflow-deferrable-kit:local .
#
# Nothing secret goes into the image. The fernet key, JWT secret and API secret key are
# generated on first start by the compose airflow-init service and stored in a volume, and
# connections come from the environment at run time.
FROM apache/airflow:3.3.2

# Airflow's constraints for this Airflow and Python version keep the providers that ship in the
# image, and their boto3/botocore pins, intact when our extras are added. To change this, build with
# --build-arg AIRFLOW_CONSTRAINTS_URL=<url> (a mirror) or =none (resolve without constraints).
ARG AIRFLOW_CONSTRAINTS_URL=""

USER airflow

# Copy only what the build needs (see .dockerignore): the metadata, the README (used as the long
# description), the LICENSE (pyproject's license-files) and the code. The target is a folder the
# airflow user owns, so it can be removed afterwards.
COPY --chown=airflow:0 pyproject.toml README.md LICENSE /home/airflow/airflow-deferrable-kit-src/
COPY --chown=airflow:0 airflow_deferrable_kit /home/airflow/airflow-deferrable-kit-src/airflow_deferrable_kit

RUN set -eux; \
    python_version="$(python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"; \
    constraints="${AIRFLOW_CONSTRAINTS_URL:-https://raw.githubusercontent.com/apache/airflow/constraints-${AIRFLOW_VERSION}/constraints-${python_version}.txt}"; \
    if [ "${constraints}" = "none" ]; then constraint_args=""; else constraint_args="--constraint ${constraints}"; fi; \
    pip install --no-cache-dir ${constraint_args} \
        "apache-airflow==${AIRFLOW_VERSION}" \
        "/home/airflow/airflow-deferrable-kit-src[all]"; \
    rm -rf /home/airflow/airflow-deferrable-kit-src; \
    # Fail the build unless every trigger module imports as the triggerer imports it, along with
    # every optional client. Use a throw-away AIRFLOW_HOME so nothing Airflow generates lands in the image.
    scratch_home="$(mktemp -d)"; \
    AIRFLOW_HOME="${scratch_home}" python -c "import importlib, pkgutil, aiobotocore, aiohttp, asyncpg, aiokafka; \
import airflow_deferrable_kit.triggers as t; \
[importlib.import_module(t.__name__ + '.' + m.name) for m in pkgutil.iter_modules(t.__path__)]"; \
    rm -rf "${scratch_home}"; \
    # The compose file mounts the shared configuration volume here. Creating the empty folder in
    # the image makes a new volume belong to the airflow user.
    mkdir -p /opt/airflow/config
