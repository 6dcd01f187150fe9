"""The ``aiogroupq`` command and ``python -m aiogroupq``: the worker, the
operator's commands, the server launcher and the demo. May import
everything; nothing in the library imports it."""
