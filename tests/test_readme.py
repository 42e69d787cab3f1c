"""The README's table of contents and in-repo links point at what exists, and its order is the
order a new user needs (train one model before what bad input answers)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def headings() -> list[str]:
    found, in_code = [], False
    for line in README.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (match := re.match(r"^#{2,3} (.*)$", line)):
            found.append(match.group(1))
    return found


def github_slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_anchor_link_names_a_heading():
    slugs = {github_slug(h) for h in headings()}
    anchors = re.findall(r"\]\(#([^)]+)\)", README)
    assert len(anchors) >= len(slugs)  # the contents list every section
    assert sorted(set(anchors) - slugs) == []
    assert sorted(slugs - set(anchors)) == []


def test_contents_come_after_the_opening_commands_and_sections_in_order():
    assert README.index("make demo") < README.index("**Contents**") < README.index("## The model in one example")
    order = headings()
    assert order.index("Train one model") < order.index("Bad input")
    assert order.index("Add your own scheme") < order.index("Troubleshooting") < order.index("Development")


def test_linked_repository_files_exist():
    paths = re.findall(r"\]\(((?:tests|results|mesh_model|scripts)/[^)#]+)\)", README)
    assert "tests/test_custom_scheme_recipe.py" in paths
    assert [p for p in paths if not (ROOT / p).exists()] == []
