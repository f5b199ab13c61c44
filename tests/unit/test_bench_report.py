from pathlib import Path

from bench.report import write_section


def test_a_section_is_appended_then_replaced_in_place(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nIntro.\n")
    write_section(doc, "embeddings", "first run")
    write_section(doc, "other", "other run")
    write_section(doc, "embeddings", "second run")
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nIntro.\n")
    assert "second run" in text and "first run" not in text and "other run" in text
    assert text.index("second run") < text.index("other run")
