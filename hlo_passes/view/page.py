"""One self-contained HTML page: styles, scripts (our renderer and the vendored dagre layout
library) and the data, all inline.  Opening it needs no network and no other file.

    html = render_page("view", "jit_step", module_data(module))

`kind` picks the renderer in `assets/app.js`: "view" (a module), "report" (a pass pipeline run,
with the final module's view inside) or "diff" (two modules side by side).
"""

from __future__ import annotations

import html
import json
from functools import cache
from importlib import resources

_ASSETS = ("common.js", "graph.js", "pictures.js", "view.js", "report.js", "diff.js", "app.js")


@cache
def _asset(name: str) -> str:
    return resources.files("hlo_passes.view").joinpath(name).read_text(encoding="utf-8")


def _dagre() -> str:
    text = _asset("vendor/dagre.min.js")
    # The source map is not shipped: without the comment the browser never asks for it.
    return "\n".join(line for line in text.splitlines() if not line.startswith("//# sourceMappingURL="))


def _script_json(data) -> str:
    """JSON safe inside a <script> element: no `<` at all (so no `</script>` or `<!--`); JSON
    has `<` only inside strings, where `\\u003c` means the same."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c")


def render_page(kind: str, title: str, data: dict) -> str:
    scripts = "\n".join(_asset(f"assets/{name}") for name in _ASSETS)
    return (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{html.escape(title)}</title>\n"
        "<meta name=\"generator\" content=\"hlo-passes\">\n"
        f"<style>\n{_asset('assets/app.css')}\n</style>\n</head>\n"
        f"<body data-page=\"{html.escape(kind)}\">\n"
        "<noscript>This page draws with JavaScript; enable it to see the module.</noscript>\n"
        "<div id=\"root\"></div>\n"
        f"<script type=\"application/json\" id=\"page-data\">{_script_json(data)}</script>\n"
        f"<script>\n{_dagre()}\n</script>\n"
        f"<script>\n{scripts}\n</script>\n"
        "</body>\n</html>\n")
