"""Natively async triggers; importable by the triggerer without any sensor code."""
