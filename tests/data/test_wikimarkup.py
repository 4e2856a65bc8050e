"""The MediaWiki markup stripper on constructs the Wikipedia sample contains."""

from state_reduction.data.wikimarkup import strip_wiki_markup

ARTICLE = """{{Infobox river
| name = Aa {{lang|de|Aa}}
| length = {{convert|10|km}}
}}
'''Aa''' is a river<ref name="x">{{cite web|title=A [[link]]}}</ref> in [[Germany|German]] lands,\
 near [[Breda]].<ref name="y"/> It joins the [[Mark (river)|Mark]].<!-- a comment -->

== Course ==
[[File:Aa.jpg|thumb|A photo of the [[Aa River|Aa]] at dusk]]
The river flows <span style="x">north</span> past the [http://example.org village of Aa].
{| class="wikitable"
|-
! Town !! Length
|-
| Aa || {{convert|2|km}}
|}
* First item with ''emphasis''
# Second item &amp; more&nbsp;text

=== Tributaries ===
None known.<math>x^2</math>

== References ==
{{reflist}}
* A citation that is not prose

== External links ==
* [http://example.org Official site]

[[Category:Rivers]]
[[de:Aa (Fluss)]]
"""

EXPECTED = """Aa is a river in German lands, near Breda. It joins the Mark.

Course
The river flows north past the village of Aa.
First item with emphasis
Second item & more text

Tributaries
None known."""


def test_strip_wiki_markup():
    assert strip_wiki_markup(ARTICLE) == EXPECTED


def test_nested_templates_and_pipe_trick():
    assert strip_wiki_markup("a {{x|{{y|{{z}}}}}} b [[Paris (France)|]] c") == "a b Paris c"


def test_empty_and_markup_only_articles():
    assert strip_wiki_markup("") == ""
    assert strip_wiki_markup("{{disambiguation}}\n[[Category:X]]") == ""
