"""Sphinx configuration: ``nox -s docs`` builds the site strictly (``-n -W``).

Sphinx rather than MkDocs because our docstrings are reST (``:param:``,
``:class:`` roles), which autodoc renders as written and nitpicky mode checks
reference by reference; MyST reads the Markdown pages unchanged.
"""

from __future__ import annotations

from typing import Any

from sphinx.util import logging

import aiogroupq

logger = logging.getLogger(__name__)

project = "aiogroupq"
author = "aiogroupq developers"
copyright = "2026, aiogroupq developers"
release = version = aiogroupq.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4

html_theme = "furo"
html_title = f"aiogroupq {version}"

autodoc_member_order = "bysource"
autodoc_typehints = "signature"

# Every reference into aiogroupq must resolve. References to other projects
# (redis, msgspec, anyio, the standard library) cannot be checked: the build
# runs offline, without intersphinx inventories.
nitpicky = True
_EXTERNAL = ("redis", "msgspec", "anyio", "datetime", "collections", "typing", "enum")
# The extras' dependencies and the standard library's context managers.
_EXTERNAL += ("contextlib", "threading", "prometheus_client", "opentelemetry")
_EXTERNAL += ("starlette",)
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(_EXTERNAL)})\..+"),
    # A TypeVar of a private module, documented by its use.
    (r"py:class", r"aiogroupq\.(\w+\.)*_\w+(\.\w+)*\.T"),
]
# Where autodoc cannot evaluate an annotation (a name imported only for type
# checkers; a class whose __module__ we set to "aiogroupq"), it shows the
# annotation as written; these names in it are not aiogroupq's to document.
nitpick_ignore = [
    ("py:class", name)
    for name in (
        *("timedelta", "datetime", "RedisLike", "HandlerFunc", "dict[str"),
        *("AbstractContextManager", "WSGIServer"),
        *(
            "Slot",
            "GroupSort",
            "ConsumerState",
        ),  # Literal aliases, spelled out in the docstrings
        *("AuthCheck", "Starlette"),  # the dashboard's, spelled out in its docstring
    )
]


def _check_api_page(app: Any, env: Any) -> list[str]:
    """Fail the build when a name of ``aiogroupq.__all__`` is not documented."""
    documented = set(env.get_domain("py").objects)
    for name in aiogroupq.__all__:
        if f"aiogroupq.{name}" not in documented:
            logger.warning(
                "public name aiogroupq.%s is missing from the API reference", name
            )
    return []


def setup(app: Any) -> None:
    app.connect("env-updated", _check_api_page)
