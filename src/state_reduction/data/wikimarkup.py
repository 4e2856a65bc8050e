"""A small MediaWiki markup stripper (stdlib only) for the `wiki` corpus.

Keeps article prose, headings (as plain lines) and list items; drops templates, references,
tables, files/categories/interlanguage links, html tags, and the reference-like sections at the end
of an article (References, External links, ...). Not a full parser: nested constructs are removed
innermost first until none is left.
"""

from __future__ import annotations

import html
import re

# Sections whose bodies are citations or link lists rather than prose.
DROPPED_SECTIONS = frozenset(
    {
        "references", "external links", "further reading", "see also", "notes", "bibliography",
        "sources", "citations", "footnotes", "notes and references", "references and notes",
    }
)
# Link namespaces that carry no prose (files, categories) or point to other wikis.
_DROPPED_LINK_PREFIX = re.compile(
    r"^\s*:?\s*(file|image|category|media|wikipedia|wp|wikt|wiktionary|template|help|portal|"
    r"special|user|talk|commons|[a-z]{2,3}(-[a-z]+)?)\s*:",
    re.IGNORECASE,
)

_COMMENT = re.compile(r"<!--.*?(-->|$)", re.DOTALL)
_REF_SELF_CLOSING = re.compile(r"<ref\b[^>]*?/>", re.IGNORECASE)
_REF = re.compile(r"<ref\b[^>]*?>.*?</ref\s*>", re.IGNORECASE | re.DOTALL)
_DROPPED_TAG_BLOCK = re.compile(
    r"<(math|gallery|timeline|score|syntaxhighlight|source|pre|imagemap|chem|graph)\b[^>]*>"
    r".*?</\1\s*>",
    re.IGNORECASE | re.DOTALL,
)
_TAG = re.compile(r"</?[a-zA-Z][^<>]*?/?>")
_TEMPLATE = re.compile(r"\{\{(?:(?!\{\{|\}\}).)*\}\}", re.DOTALL)
_TABLE = re.compile(r"\{\|(?:(?!\{\||\|\}).)*\|\}", re.DOTALL)
_INTERNAL_LINK = re.compile(r"\[\[([^\[\]]*)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?|ftp|mailto|news|irc)?:?//[^\s\[\]]*(?:\s+([^\[\]]*))?\]")
_BARE_URL = re.compile(r"https?://\S+")
# A file link whose caption holds unbalanced brackets survives the loop above; drop its line rest.
_RESIDUAL_FILE_LINK = re.compile(r"\[\[\s*(file|image)\s*:[^\n]*", re.IGNORECASE)
_HEADING = re.compile(r"^(={1,6})\s*(.*?)\s*\1\s*$")
_EMPHASIS = re.compile(r"'{2,5}")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_LIST_MARKER = re.compile(r"^[*#:;]+\s*")
_SPACES = re.compile(r"[ \t\u00a0]+")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r" +([,.;:!?])")


# Stands in for removed markup, so that a line left holding nothing else can be dropped instead of
# turning into a paragraph break.
_REMOVED = "\x00"


def _remove_nested(pattern: re.Pattern, text: str, replacement=_REMOVED) -> str:
    while True:
        text, n = pattern.subn(replacement, text)
        if n == 0:
            return text


def _internal_link(match: re.Match) -> str:
    body = match.group(1)
    if _DROPPED_LINK_PREFIX.match(body):
        return _REMOVED
    target, _, label = body.partition("|")
    # "[[a|b]]" -> b; "[[a]]" -> a; the pipe trick "[[a (b)|]]" -> a.
    if label:
        return label.rsplit("|", 1)[-1]
    if _:
        return re.sub(r"\s*\(.*\)\s*$", "", target)
    return target.lstrip(":")


def _drop_sections(lines: list[str]) -> list[str]:
    kept: list[str] = []
    skipping_level = 0
    for line in lines:
        heading = _HEADING.match(line)
        if heading:
            level = len(heading.group(1))
            if skipping_level and level > skipping_level:
                continue
            skipping_level = 0
            if heading.group(2).strip().lower() in DROPPED_SECTIONS:
                skipping_level = level
                continue
            kept.append(heading.group(2).strip())
        elif not skipping_level:
            kept.append(line)
    return kept


def strip_wiki_markup(markup: str) -> str:
    """Plain text of one article's wikitext: paragraphs separated by blank lines."""
    text = _COMMENT.sub(_REMOVED, markup.replace(_REMOVED, ""))
    text = _REF_SELF_CLOSING.sub(_REMOVED, text)
    text = _REF.sub(_REMOVED, text)
    text = _DROPPED_TAG_BLOCK.sub(_REMOVED, text)
    text = _remove_nested(_TEMPLATE, text)
    text = _remove_nested(_TABLE, text)
    text = _remove_nested(_INTERNAL_LINK, text, _internal_link)
    text = _RESIDUAL_FILE_LINK.sub(_REMOVED, text)
    text = _EXTERNAL_LINK.sub(lambda m: m.group(1) or _REMOVED, text)
    text = _TAG.sub(_REMOVED, text)
    text = _MAGIC_WORD.sub(_REMOVED, text)
    text = _EMPHASIS.sub("", text)
    text = html.unescape(text)
    text = _BARE_URL.sub("", text)

    lines = [
        line.replace(_REMOVED, "")
        for line in text.split("\n")
        if _REMOVED not in line or line.replace(_REMOVED, "").strip()
    ]
    kept = []
    for line in _drop_sections(lines):
        line = _LIST_MARKER.sub("", line.strip())
        line = _EMPTY_PARENS.sub("", line)
        line = _SPACES.sub(" ", line)
        line = _SPACE_BEFORE_PUNCT.sub(r"\1", line).strip()
        # Leftovers of unbalanced table or template syntax carry no prose.
        if line.startswith(("{|", "|}", "|-", "!", "|", "}}", "{{")) or line in {"}", "]]"}:
            continue
        kept.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
