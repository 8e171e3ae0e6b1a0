"""A griffe extension: Ember's docstrings, written for ``pydoc`` and doctest, rendered as Markdown.

The source docstrings use Google's ``Example:`` heading with doctest lines, doctest lines without a heading, and
reST literal blocks (a line ending in ``::`` followed by an indented block). Griffe's Google parser turns an ``Examples:`` section's ``>>>`` lines into
code, but renders ``Example:`` as an admonition of Markdown text (the ``>>>`` become nested quotes) and a literal
block as a paragraph. Rewriting the text before it is parsed keeps the source as it is (doctests still run) and
renders all three as code.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

_EXAMPLE = re.compile(r"^(?P<indent>\s*)Example(?P<title> \(.*\))?:(?P<literal>:)?\s*$")


def _block(lines: list[str], start: int, above: int) -> tuple[list[str], int]:
    """The indented block that starts after blank lines at ``start`` (indented deeper than ``above``), and its end."""
    j = start
    while j < len(lines) and not lines[j].strip():
        j += 1
    if j == len(lines) or len(lines[j]) - len(lines[j].lstrip()) <= above:
        return [], start
    indent = len(lines[j]) - len(lines[j].lstrip())
    end = j
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) >= indent):
        end += 1
    while end > j and not lines[end - 1].strip():
        end -= 1
    return lines[j:end], end


def _fenced(block: list[str], indent: int, blank_before: bool = True) -> list[str]:
    """``block`` fenced at ``indent`` (the paragraph's own indentation: deeper, Markdown would read the fence as
    indented code), its lines moved left to match. A section heading must be followed directly by its content
    (after a blank line griffe reads it as text), hence ``blank_before``."""
    shift = len(block[0]) - len(block[0].lstrip()) - indent
    language = "python" if _looks_like_python(block) else "text"
    body = [line[shift:] if line.strip() else "" for line in block]
    return [*([""] if blank_before else []), " " * indent + "```" + language, *body, " " * indent + "```", ""]


def _looks_like_python(block: list[str]) -> bool:
    text = "\n".join(block)
    return bool(re.search(r"^\s*(def |class |import |from \S+ import |@\w|[\w.]+ = )", text, flags=re.MULTILINE))


def rewrite(text: str) -> str:
    """``Example:`` headings as ``Examples:`` sections, doctests elsewhere and reST literal blocks (``text::``)
    as fenced code.

    >>> print(rewrite("Do it::\\n\\n    setup()\\n\\nExample::\\n\\n    x = run()\\n"))
    Do it:
    <BLANKLINE>
    ```text
    setup()
    ```
    <BLANKLINE>
    <BLANKLINE>
    Examples:
        ```python
        x = run()
        ```
    <BLANKLINE>
    <BLANKLINE>
    """
    lines = text.splitlines()
    out: list[str] = []
    examples_indent: int | None = None  # the indentation of the "Examples:" heading we are under, if any
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if examples_indent is not None and line.strip() and indent <= examples_indent:
            examples_indent = None
        if examples_indent is None and line.lstrip().startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            out += [" " * indent + "```pycon", *lines[i:end], " " * indent + "```"]  # a doctest outside Examples
            i = end
            continue
        match = _EXAMPLE.match(line)
        if match is not None or line.strip() == "Examples:":
            examples_indent = indent
        literal = line.rstrip().endswith("::") and not line.lstrip().startswith(">>>")
        block, end = _block(lines, i + 1, indent) if literal else ([], i + 1)
        if match is not None:
            out.append(f"{match['indent']}Examples:")
            title = (match["title"] or "").strip(" ()")
            if title:
                out.append(f"{match['indent']}    {title}:")
        elif block:
            out.append(line.rstrip()[:-1])  # "text::" -> "text:"
        else:
            out.append(line)
        if block:
            heading_only = match is not None and not match["title"]
            out += _fenced(block, indent + 4 if match is not None else indent, blank_before=not heading_only)
            i = end
        else:
            i += 1
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


class DocstringsAsMarkdown(Extension):
    """Rewrite every docstring once it is loaded (before it is parsed)."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
