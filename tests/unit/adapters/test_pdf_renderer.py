"""The PDF renderer: a real PDF, the same bytes for the same document, clear errors; and
the stand-in when fpdf2 is not installed."""

from __future__ import annotations

import zlib
from datetime import date

import pytest

from adapters.pdf import MissingRenderer
from application.ports import DocumentRenderer
from domain.documents import Document


@pytest.fixture
def renderer() -> DocumentRenderer:
    """The PDF renderer (skipped where fpdf2, of the `sample` group, is not installed)."""
    module = pytest.importorskip("adapters.pdf.renderer",
                                 reason="the PDF renderer needs fpdf2 (the `sample` group)")
    pdf: DocumentRenderer = module.PdfRenderer()
    return pdf


def _receipt(total: str, rows: tuple[tuple[str, ...], ...]) -> Document:
    """A counter's receipt: one row per amount added."""
    return Document("Receipt for counter 7", (("Counter", "c7"), ("Dated", "1996-01-02")),
                    ("line", "amount"), rows, (("Total", total),), date(1996, 1, 2))


def _text(pdf: bytes) -> bytes:
    """The page content streams, inflated (fpdf2 compresses them)."""
    out = b""
    for chunk in pdf.split(b"stream\n")[1:]:
        body = chunk.split(b"\nendstream")[0]
        try:
            out += zlib.decompress(body)
        except zlib.error:
            out += body
    return out


def test_a_document_renders_to_a_deterministic_pdf(renderer: DocumentRenderer) -> None:
    doc = _receipt("17581.10", (("1", "17954.55"),))
    first, second = renderer.render(doc), renderer.render(doc)
    assert first.startswith(b"%PDF-")
    assert first.rstrip().endswith(b"%%EOF")
    assert first == second  # replaying a decision makes the same object
    content = _text(first)
    for text in (b"Receipt for counter 7", b"17581.10", b"17954.55", b"1996-01-02"):
        assert text in content
    other = _receipt("1.00", (("1", "17954.55"),))
    assert renderer.render(other) != first
    assert renderer.media_type == "application/pdf"


def test_text_a_core_font_cannot_print_is_a_value_error(renderer: DocumentRenderer) -> None:
    doc = Document("Rechnung \u2603", (), ("a",), (("1",),), ())
    with pytest.raises(ValueError, match="Latin-1"):
        renderer.render(doc)


def test_a_row_of_the_wrong_width_is_refused() -> None:
    with pytest.raises(ValueError, match="2 cells for 1 columns"):
        Document("t", (), ("a",), (("1", "2"),), ())


def test_without_fpdf2_rendering_says_which_group_to_install() -> None:
    missing = MissingRenderer("No module named 'fpdf'")
    with pytest.raises(ValueError, match="uv sync --group sample") as caught:
        missing.render(_receipt("1.00", ()))
    assert "No module named 'fpdf'" in str(caught.value)
