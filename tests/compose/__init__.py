"""Checks of docker-compose.yaml, the Dockerfile and the batch API used by the compose examples."""
