"""Helpers shared by the test suites (processes, HTTP, metrics)."""
