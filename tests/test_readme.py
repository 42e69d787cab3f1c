"""The README is a page a newcomer enters and the docs/ pages hold the rest: the README is short,
opens with the two commands and maps the tree and its layers as they are; every docs page is in the
index; every relative link and #anchor in the README, the docs pages and the READMEs of the
reproduction, slurm/ and benchmarks/ points at a file that exists and a heading that file has
(GitHub's slugs); and the main job's time is given the same wherever it is given."""

import re
from pathlib import Path

import pytest

from results.commands import mesh_demo

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "README.md")
CHECKED = [
    README,
    DOCS / "README.md",
    *PAGES,
    *(ROOT / d / "README.md" for d in ("results/cpu-reproduction", "slurm", "benchmarks")),
]
MAX_README_LINES = 150


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans, where links are links."""
    kept, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"^\s*(```|~~~)", line)
        if marker and (fence is None or marker.group(1) == fence):
            fence = None if fence else marker.group(1)
        elif fence is None:
            kept.append(re.sub(r"(`+).*?\1", "", line))
    return "\n".join(kept)


def headings(text: str) -> list[str]:
    return re.findall(r"^#{1,6} +(.+?) *#* *$", prose(text), flags=re.M)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text (links' labels, no code or emphasis marks),
    lowercased, punctuation other than `-` and `_` dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, repeated ones numbered as GitHub numbers them (`-1`, `-2`, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(path.read_text()):
        slug = github_slug(heading)
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links(path: Path) -> list[str]:
    """The targets of the page's Markdown links and images, without a title."""
    return [target.split()[0] for target in re.findall(r"\]\(([^)\s][^)]*)\)", prose(path.read_text()))]


def broken(path: Path) -> list[str]:
    bad = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            bad.append(f"{target}: no such file")
        elif anchor and (linked.suffix != ".md" or anchor not in anchors(linked)):
            shown = linked.relative_to(ROOT) if linked.is_relative_to(ROOT) else linked.name
            bad.append(f"{target}: no heading #{anchor} in {shown}")
    return bad


def test_github_slug_follows_githubs_rules():
    assert github_slug("State-passing schemes (`scheme=`)") == "state-passing-schemes-scheme"
    assert github_slug("Pythia / Hugging Face checkpoints") == "pythia--hugging-face-checkpoints"
    assert github_slug("How many seeds: seeds=auto and --plan") == "how-many-seeds-seedsauto-and---plan"
    heading = "MeSH's open choices, screened ([one-pass/open_choices](one-pass/open_choices/report.md))"
    assert github_slug(heading) == "meshs-open-choices-screened-one-passopen_choices"


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A\n\n## Two words\n\n## Two words\n")
    (tmp_path / "c.png").write_bytes(b"")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#two-words) [ok](a.md#two-words-1) [ok](#b) [ok](c.png) [web](https://example.org/x.md)\n"
        "`[code](none.md)`\n```\n[fenced](none.md)\n```\n# B\n"
        "[gone](none.md) [no heading](a.md#three) [not a page](c.png#x) ![image](gone.png)\n"
    )
    assert broken(page) == [
        "none.md: no such file",
        "a.md#three: no heading #three in a.md",
        "c.png#x: no heading #x in c.png",
        "gone.png: no such file",
    ]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_points_at_what_exists(path):
    assert broken(path) == []


def test_the_readme_is_short_and_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES
    assert lines[0].startswith("# ")
    fence = lines.index("```bash")
    description = [line for line in lines[1:fence] if line.strip()]
    assert 1 <= len(description) <= 2 and not any(line.startswith("#") for line in description)
    assert lines[fence + 1].startswith("make demo ") and lines[fence + 2].startswith("make test ")
    assert lines[fence + 3] == "```"


def test_every_docs_page_is_in_the_index_and_the_readmes_docs_section_in_the_same_order():
    assert PAGES, "no docs pages"
    index = [(DOCS / t).resolve() for t in links(DOCS / "README.md") if re.fullmatch(r"[\w-]+\.md", t)]
    docs_section = README.read_text().split("\n## Docs\n", 1)[1].split("\n## ", 1)[0]
    listed = [
        (ROOT / t).resolve() for t in re.findall(r"\]\((docs/[\w-]+\.md)\)", docs_section) if t != "docs/README.md"
    ]
    assert sorted(set(index)) == PAGES
    assert listed == index
    assert "docs/README.md" in links(README)


def test_the_readmes_tree_and_layers_are_the_repositorys():
    text = README.read_text()
    tree = text.split("\n## Where things are\n", 1)[1].split("```")[1]
    named = re.findall(r"^(\w+)/ ", tree, flags=re.M)
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= set(named)
    assert [name for name in named if not (ROOT / name).is_dir()] == []
    layers = re.search(r"^layers = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), flags=re.M).group(1)
    order = " -> ".join(re.findall(r'"(\w+)"', layers))
    assert order == "results -> sweeps -> experiments -> mesh_model" and f"`{order}`" in text


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_each_docs_page_opens_with_a_title_and_one_line_on_what_it_covers(path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == "" and lines[2].strip() and lines[3] == ""


def test_the_scheme_recipe_links_the_test_that_proves_it():
    assert "../tests/test_custom_scheme_recipe.py" in links(DOCS / "model.md")
    assert "add-your-own-scheme" in anchors(DOCS / "model.md")


def test_the_main_jobs_time_is_the_same_wherever_it_is_given():
    makefile = (ROOT / "Makefile").read_text()
    demo_comment = makefile[: makefile.index("\ndemo:")].rsplit("\n\n", 1)[-1]
    said = {
        "README.md": README.read_text(),
        "docs/demo.md": (DOCS / "demo.md").read_text(),
        "Makefile": demo_comment,
        "mesh-demo --help": mesh_demo.__doc__,
    }
    times = {
        name: re.findall(r"about (\d+-\d+) minutes", re.sub(r"\s+#?\s*", " ", text)) for name, text in said.items()
    }
    assert all(len(found) == 1 for found in times.values()), times
    assert len({found[0] for found in times.values()}) == 1, times
