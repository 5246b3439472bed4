"""HTML page -> plain text: main content only, <pre> kept verbatim, block tags become newlines."""

from __future__ import annotations

import re

import lxml.html

_DROP = {"script", "style", "nav", "noscript", "form", "button", "svg", "iframe", "head", "footer"}
_DROP_CLASS = ("sphinxsidebar", "related", "headerlink", "navigation", "breadcrumb", "toc", "nav")
_BLOCK = {
    "p", "div", "section", "article", "main", "h1", "h2", "h3", "h4", "h5", "h6", "li", "ul", "ol",
    "table", "tr", "blockquote", "dl", "dt", "dd", "br", "hr", "figure", "figcaption", "caption",
}
_PRE = "\x01"  # marks verbatim segments while whitespace is collapsed elsewhere


def _dropped(el) -> bool:
    tag = el.tag.lower() if isinstance(el.tag, str) else ""
    if tag in _DROP or not tag:
        return True
    cls = (el.get("class") or "").split()
    return el.get("role") == "navigation" or any(c in _DROP_CLASS for c in cls)


def _walk(el, out: list[str]) -> None:
    if _dropped(el):
        if el.tail:
            out.append(el.tail)
        return
    tag = el.tag.lower()
    block = tag in _BLOCK
    if block:
        out.append("\n")
    if tag == "pre":
        out.append("\n" + _PRE + el.text_content() + _PRE + "\n")
    else:
        if tag in ("td", "th"):
            out.append(" ")
        if el.text:
            out.append(el.text)
        for child in el:
            _walk(child, out)
    if block:
        out.append("\n")
    if el.tail:
        out.append(el.tail)


def _main_content(root):
    for xpath in ("//div[@role='main']", "//main", "//div[@id='content']", "//div[@class='body']", "//body"):
        found = root.xpath(xpath)
        if found:
            return found[0]
    return root


def html_to_text(raw: bytes | str) -> str:
    """Visible text of the page's main content; returns '' for an empty or unparsable page."""
    if not raw or not raw.strip():
        return ""
    try:
        root = lxml.html.fromstring(raw)
    except (ValueError, lxml.etree.ParserError):
        return ""
    out: list[str] = []
    _walk(_main_content(root), out)
    parts = "".join(out).split(_PRE)
    text = []
    for i, part in enumerate(parts):
        if i % 2:  # verbatim <pre> content
            text.append(part.strip("\n"))
        else:
            part = re.sub(r"[ \t\r\f\v\xa0]+", " ", part)
            part = re.sub(r" *\n *", "\n", part)
            text.append(re.sub(r"\n{3,}", "\n\n", part))
    return re.sub(r"\n{3,}", "\n\n", "".join(text)).strip() + "\n"
