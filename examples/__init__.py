"""Runnable examples of aiogroupq in web applications and in tests.

Each is tested by the project's suite (``tests/test_examples.py``).
"""
