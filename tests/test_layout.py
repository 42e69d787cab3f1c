import pytest

from mesh_model import ConfigError, Layout


@pytest.mark.parametrize(
    ("text", "prelude", "cores", "schedule", "coda", "depth", "distinct"),
    [
        ("24", 24, (), (), 0, 24, 24),
        ("4+8R2+4", 4, (8,), (0, 0), 4, 24, 16),
        ("3+6R3+3", 3, (6,), (0, 0, 0), 3, 24, 12),
        ("0+8R3+0", 0, (8,), (0, 0, 0), 0, 24, 8),
        ("8R3", 0, (8,), (0, 0, 0), 0, 24, 8),
        ("6+10R2+6", 6, (10,), (0, 0), 6, 32, 22),
        ("4+8+8+4", 4, (8, 8), (0, 1), 4, 24, 24),
        ("2+4+4+4+2", 2, (4, 4, 4), (0, 1, 2), 2, 16, 16),
        ("1+2R1+1", 1, (2,), (0,), 1, 4, 4),
    ],
)
def test_layouts_parse_to_depth_and_distinct_layers(text, prelude, cores, schedule, coda, depth, distinct):
    layout = Layout.parse(text)
    assert (layout.prelude, layout.cores, layout.core_schedule, layout.coda) == (prelude, cores, schedule, coda)
    assert layout.compute_depth == depth
    assert layout.distinct_layers == distinct
    assert layout.loops == len(schedule)


def test_shared_and_vanilla_flags():
    assert Layout.parse("24").is_vanilla and not Layout.parse("24").is_shared
    assert Layout.parse("4+8R2+4").is_shared
    assert not Layout.parse("4+8+8+4").is_shared and not Layout.parse("4+8+8+4").is_vanilla
    assert not Layout.parse("1+2R1+1").is_shared


def test_canonical_text():
    assert Layout.parse("8r3").text == "0+8R3+0"
    assert Layout.parse(" 4 + 8R2 + 4 ").text == "4+8R2+4"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("4+8R0+4", "loop count must be at least 1"),
        ("4+0R2+4", "core needs at least 1 layer"),
        ("abc", "P+CRK+Q"),
        ("-1+8R2+4", "P+CRK+Q"),
        ("4+-8+4", "P+CRK+Q"),
        ("0", "at least 1 layer"),
        ("", "P+CRK+Q"),
        ("4+8R2", "P+CRK+Q"),
        ("12+12", "two numbers name no core"),
        ("4+0+4", "every core segment needs at least 1 layer"),
        ("4+8R2+8R2+4", "P+CRK+Q"),
    ],
)
def test_bad_layouts_fail_with_one_line_naming_the_field(text, fragment):
    with pytest.raises(ConfigError) as info:
        Layout.parse(text)
    message = str(info.value)
    assert message.startswith(f"layout={text!r} is invalid: ")
    assert fragment in message
    assert "\n" not in message
