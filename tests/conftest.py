"""Shared pytest setup. Unit tests need nothing; integration fixtures live in
tests/integration/conftest.py and start or find the real stack."""
